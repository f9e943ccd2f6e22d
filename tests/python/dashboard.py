"""Drives rozd's dashboard (/ui) in a real headless Chromium with Selenium.

Usage: dashboard.py BASE_URL TOKEN TASK_ID SCREENSHOT_DIR

Checks, in order: the page asks for the token and loads with it; a sensor's
value on the page changes over time; the task's pending approval shows the
tool, its parameters and who asks, and approving it from the page moves the
actuator (seen on the page); the STOP button latches the protective stop
(checked over REST) and the page shows it. Saves screenshots. Every wait is
a bounded wait for a condition; exit status 0 only if every check passed.
"""

import json
import sys
import traceback
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

WITHIN = 30  # seconds: a bound on a hang, not a synchronisation


def click(element):
    element.click()
    return True


def text_when(wait, selector, good):
    """Waits until the text of `selector` is good and returns it. The page
    re-renders with every event: the element is looked up and read in one
    step of the wait, again if it went stale between."""
    def read(driver):
        text = driver.find_element(By.CSS_SELECTOR, selector).text
        return text if good(text) else False
    return wait.until(read)


def rest(base, token, path):
    request = urllib.request.Request(base + path, headers={"Authorization": "Bearer " + token})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.load(reply)


def main():
    base, token, task_id, shots = sys.argv[1:5]
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1400",
                "--hide-scrollbars", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=options)
    # The page re-renders its tables with every event: an element may go stale between look-up and read.
    wait = WebDriverWait(driver, WITHIN, ignored_exceptions=[StaleElementReferenceException, NoSuchElementException])
    step = "loading the page"
    try:
        driver.get(base + "/ui")
        # Tokens are configured: the page asks once.
        step = "entering the token"
        token_input = wait.until(lambda d: d.find_element(By.ID, "token-input"))
        wait.until(lambda d: token_input.is_displayed())
        token_input.send_keys(token)
        driver.find_element(By.ID, "token-submit").click()
        assert driver.execute_script("return sessionStorage.getItem('rozd-token')") == token
        assert token not in driver.current_url, "the token must never be in a URL"
        text_when(wait, "#link", lambda t: t.startswith("live"))
        print("page live:", driver.find_element(By.ID, "host-name").text, flush=True)

        # A sensor's value changes on the page.
        step = "a sensor's value changing"
        wave = '[data-sensor="wave"] .value'
        first = text_when(wait, wave, lambda t: t not in ("", "—"))
        changed = text_when(wait, wave, lambda t: t != first)
        print("wave:", first, "->", changed, flush=True)

        # The pending approval, with tool, parameters and who asks; approve it.
        step = "the pending approval"
        text = text_when(wait, ".approval", bool)
        assert "drive_speed" in text, text
        assert '"value": 0.3' in text, text
        assert task_id + ":w0" in text, text
        # Every change of the task list re-renders the cards: looked up and clicked in one step.
        step = "approving from the page"
        wait.until(lambda d: click(d.find_element(By.CSS_SELECTOR, ".approval button.approve")))
        step = "the approved command on the page"
        shown = text_when(wait, '[data-actuator="drive_speed"] .value', lambda t: t.startswith("0.3"))
        print("drive_speed on the page:", shown, flush=True)
        wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, ".approval"))
        driver.save_screenshot(shots + "/dashboard.png")

        # STOP: one click latches the stop; REST says so and the page shows it.
        step = "the STOP button"
        driver.find_element(By.ID, "stop-button").click()
        safety = wait.until(lambda d: (lambda s: s if s["estop_active"] else False)(rest(base, token, "/v1/safety")))
        assert safety and safety["estop_active"], safety
        assert any(c["source"] == "rest" for c in safety["causes"]), safety
        text_when(wait, "#stop-state", lambda t: t == "PROTECTIVE STOP")
        text_when(wait, "#stop-causes", lambda t: "dashboard STOP button" in t)
        driver.save_screenshot(shots + "/dashboard-stopped.png")
        print("stopped:", safety["causes"], flush=True)
    except Exception as error:
        # The page and the browser's log go to files; the last line says
        # which step failed and why, short enough to survive a log's tail.
        driver.save_screenshot(shots + "/dashboard-failure.png")
        with open(shots + "/dashboard-failure.html", "w") as page:
            page.write(driver.page_source)
        for entry in driver.get_log("browser") if hasattr(driver, "get_log") else []:
            print("browser:", entry, file=sys.stderr)
        traceback.print_exc()
        why = next((line for line in str(error).splitlines() if line.strip()), "")
        print(f"FAILED at {step}: {type(error).__name__}: {why[:300]}", file=sys.stderr)
        sys.exit(1)
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
