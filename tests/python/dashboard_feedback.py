"""The dashboard (/ui) shows a feedback mismatch as an alarm of the actuator,
in a real headless Chromium driven by Selenium.

Usage: dashboard_feedback.py BASE_URL TOKEN SCREENSHOT_DIR

The daemon's drive_speed has feedback from wheel_speed and a stuck drive (a
rule commands 0.3 at start, nothing moves); its serial motor's MCU never
answered the start-up safe drive. Checks, in order: the critical banner at
the top names the actuator's mismatch (commanded, measured, expected) and
the motor's unconfirmed safe value (why), the tab's title counts both; the
rows are marked, drive_speed's feedback cell says `mismatch`, the motor's
safe cell `NOT confirmed`; once the fault is cleared over REST (the held
0.3 is measured again) the mismatch's entry goes, the row says `confirmed`,
and the motor's alarm stays. Every wait is bounded; exit status 0 only if every check passed.
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


def text_when(wait, selector, good):
    def read(driver):
        text = driver.find_element(By.CSS_SELECTOR, selector).text
        return text if good(text) else False
    return wait.until(read)


def post(base, token, path, body):
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.load(reply)


def main():
    base, token, shots = sys.argv[1:4]
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000",
                "--hide-scrollbars", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=options)
    wait = WebDriverWait(driver, WITHIN, ignored_exceptions=[StaleElementReferenceException, NoSuchElementException])
    step = "loading the page"
    try:
        driver.get(base + "/ui")
        step = "entering the token"
        token_input = wait.until(lambda d: d.find_element(By.ID, "token-input"))
        wait.until(lambda d: token_input.is_displayed())
        token_input.send_keys(token)
        driver.find_element(By.ID, "token-submit").click()
        text_when(wait, "#link", lambda t: t.startswith("live"))

        step = "the mismatch in the critical banner"
        banner = text_when(wait, '#alarm-banner [data-alarm="drive_speed.mismatch"]', lambda t: "MISMATCH" in t)
        for want in ("MISMATCH", "drive_speed", "commanded 0.3 m/s", "wheel_speed measured 0", "expected 0.3", "feedback mismatch"):
            assert want in banner, (want, banner)
        assert driver.find_element(By.ID, "alarm-banner").is_displayed()
        assert driver.find_element(By.ID, "alarm-banner").location["y"] < 200, "at the top of the page"
        assert "warn-only" not in driver.find_element(By.ID, "alarm-banner").get_attribute("class"), "critical"
        unsafe = text_when(wait, '#alarm-banner [data-alarm="motor.safe_unconfirmed"]', bool)
        for want in ("NOT SAFE?", "motor", "safe value 0 not confirmed by the device", "no reply within 200 ms"):
            assert want in unsafe, (want, unsafe)
        wait.until(lambda d: d.title.startswith("\u26a0 2 CRITICAL"))
        print("banner:", banner.replace("\n", " "), "|", unsafe.replace("\n", " "), flush=True)

        step = "the actuator's row"
        row = '[data-actuator="drive_speed"]'
        wait.until(lambda d: "alarmed" in d.find_element(By.CSS_SELECTOR, row).get_attribute("class"))
        cell = text_when(wait, row + " .feedback", lambda t: "mismatch" in t)
        assert "wheel_speed 0" in cell, cell
        # The page re-renders the table with every event: each read is one
        # step of a wait (looked up and read together, again if it went stale).
        other = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, '[data-actuator="turn_rate"]').get_attribute("class") + " ")
        assert "alarmed" not in other, other
        print("row:", text_when(wait, row, bool).replace("\n", " "), flush=True)
        motor = '[data-actuator="motor"]'
        wait.until(lambda d: "alarmed" in d.find_element(By.CSS_SELECTOR, motor).get_attribute("class"))
        text_when(wait, motor + " .safe", lambda t: "NOT confirmed" in t)
        driver.save_screenshot(shots + "/dashboard-mismatch.png")

        step = "the fault cleared"
        faults = post(base, token, "/v1/sim/faults", {"stuck_drive": False})
        assert faults["faults"]["stuck_drive"] is False, faults
        cell = text_when(wait, row + " .feedback", lambda t: "confirmed" in t)
        wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, '#alarm-banner [data-alarm="drive_speed.mismatch"]'))
        wait.until(lambda d: "alarmed" not in d.find_element(By.CSS_SELECTOR, row).get_attribute("class"))
        wait.until(lambda d: d.title.startswith("\u26a0 1 CRITICAL"))
        # The motor's device still never answered: its alarm stays.
        text_when(wait, '#alarm-banner [data-alarm="motor.safe_unconfirmed"]', lambda t: "NOT SAFE?" in t)
        print("after the fault:", cell, flush=True)
    except Exception as error:
        driver.save_screenshot(shots + "/dashboard-mismatch-failure.png")
        with open(shots + "/dashboard-mismatch-failure.html", "w") as page:
            page.write(driver.page_source)
        traceback.print_exc()
        why = next((line for line in str(error).splitlines() if line.strip()), "")
        print(f"FAILED at {step}: {type(error).__name__}: {why[:300]}", file=sys.stderr)
        sys.exit(1)
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
