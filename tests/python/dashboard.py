"""Drives rozd's dashboard (/ui) in a real headless Chromium with Selenium.

Usage: dashboard.py BASE_URL TOKEN TASK_ID SCREENSHOT_DIR SESSION_CALL_ID

Checks, in order: the page asks for the token and loads with it; a sensor's
value on the page changes over time; every waiting approval is listed with
its tool, its parameters and who asks: a gRPC session's call (SESSION_CALL_ID,
whose client never answers), an MCP client's call and the task's call; the
open sessions (gRPC, MCP) are listed; the page approves the session's call,
denies the MCP call and approves the task's, and the task's command moves
the actuator (seen on the page); the rover's camera is live beside the world view (its
<img> holds a decoded picture of the configured size, and new ones keep
coming); the STOP button latches the protective stop
(checked over REST) and the page shows it. Saves screenshots. Every wait is
a bounded wait for a condition; exit status 0 only if every check passed.
"""

import json
import sys
import traceback
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException, TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

WITHIN = 30  # seconds: a bound on a hang, not a synchronisation


def click(element):
    element.click()
    return True


def press(element):
    """Presses a button of a card the page re-renders with every event: in
    the page itself, on that very element. A pointer click lands at the
    element's place as it was when it was found, and a re-layout in between
    (another card gone, a table grown) sends it elsewhere: CI saw an
    approval's Approve and Deny lost so. A stale element raises, and the
    wait looks it up again."""
    element.parent.execute_script("arguments[0].click();", element)
    return True


def text_when(wait, selector, good):
    """Waits until the text of `selector` is good and returns it. The page
    re-renders with every event: the element is looked up and read in one
    step of the wait, again if it went stale between."""
    seen = [None]

    def read(driver):
        text = driver.find_element(By.CSS_SELECTOR, selector).text
        seen[0] = text
        return text if good(text) else False
    try:
        return wait.until(read)
    except TimeoutException:
        raise TimeoutException("%s never read as wanted; last read: %r" % (selector, seen[0]))


def full_page(driver, path):
    """Saves a screenshot of the whole page (the window grown to its height)."""
    size = driver.get_window_size()
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(size["width"], max(size["height"], height))
    driver.save_screenshot(path)
    driver.set_window_size(size["width"], size["height"])


def rest(base, token, path):
    request = urllib.request.Request(base + path, headers={"Authorization": "Bearer " + token})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.load(reply)


def main():
    base, token, task_id, shots, session_call = sys.argv[1:6]
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
        # Tokens are configured: the page asks, without saying a token was
        # refused before one was entered.
        step = "the token dialog before anything was entered"
        token_input = wait.until(lambda d: d.find_element(By.ID, "token-input"))
        wait.until(lambda d: token_input.is_displayed())
        assert "needs a token" in driver.find_element(By.ID, "token-form").text
        error = driver.find_element(By.ID, "token-error").text
        assert error == "", error

        # STOP stays in reach while the dialog is open; without a token this
        # rozd cannot take it, and the page says so instead of failing quietly.
        step = "STOP without a token"
        driver.find_element(By.ID, "stop-button").click()
        said = text_when(wait, "#safety-message", lambda t: "needs a token" in t)
        assert "NOT sent" in said, said
        assert "needs a token" in driver.find_element(By.ID, "token-error").text
        assert not rest(base, token, "/v1/safety")["estop_active"], "no stop without a token"
        print("STOP without a token:", said, flush=True)
        driver.save_screenshot(shots + "/dashboard-token.png")

        # A wrong token is said to be refused; then the right one.
        step = "a wrong token"
        token_input.send_keys("not-" + token)
        driver.find_element(By.ID, "token-submit").click()
        text_when(wait, "#token-error", lambda t: "refused" in t)
        step = "entering the token"
        wait.until(lambda d: token_input.is_displayed())
        token_input.send_keys(token)
        driver.find_element(By.ID, "token-submit").click()
        assert driver.execute_script("return sessionStorage.getItem('rozd-token')") == token
        assert token not in driver.current_url, "the token must never be in a URL"
        text_when(wait, "#link", lambda t: t.startswith("live"))
        print("page live:", driver.find_element(By.ID, "host-name").text, flush=True)

        # The rover's camera, live beside the world view: its <img> shows a
        # decoded picture of the configured size, and new ones keep coming.
        step = "the live camera"
        picture = '[data-camera="front_camera"] img'
        size = wait.until(lambda d: d.execute_script(
            "const i = document.querySelector(arguments[0]);"
            "return i && i.complete && i.naturalWidth > 0 ? [i.naturalWidth, i.naturalHeight] : false;", picture))
        assert size == [320, 240], size
        frames = int(wait.until(lambda d: d.find_element(By.CSS_SELECTOR, '[data-camera="front_camera"]').get_attribute("data-frames")))
        wait.until(lambda d: int(d.find_element(By.CSS_SELECTOR, '[data-camera="front_camera"]').get_attribute("data-frames")) >= frames + 2)
        assert driver.execute_script("return document.querySelector(arguments[0]).src.startsWith('blob:')", picture)
        caption = text_when(wait, '[data-camera="front_camera"] figcaption', lambda t: "ok" in t)
        assert "320×240" in caption, caption
        world = driver.find_element(By.ID, "world-card")
        seen = driver.find_element(By.ID, "cameras-card")
        assert world.is_displayed() and seen.is_displayed()
        # The page lays out again as pictures and cards load: both places
        # are read together, until they hold (seen in CI: the two reads of
        # one assertion straddled a re-layout).
        placed = [None]

        def beside(d):
            placed[0] = (d.find_element(By.ID, "world-card").location,
                         d.find_element(By.ID, "cameras-card").location)
            w, c = placed[0]
            return abs(w["y"] - c["y"]) < 4 and c["x"] > w["x"]
        try:
            wait.until(beside)
        except TimeoutException:
            raise AssertionError("the camera is not beside the world view: %r" % (placed[0],))
        driver.save_screenshot(shots + "/dashboard-camera.png")
        print("camera live:", caption.replace("\n", " "), flush=True)

        # A critical alarm cannot be missed: a banner at the top names the
        # sensor, its value, the limit crossed and since when; the tab's title
        # says it too, and the sensor's card is framed in red.
        step = "the critical alarm's banner"
        banner = text_when(wait, '#alarm-banner [data-alarm="coolant_temp"]', lambda t: "since" in t)
        for want in ("CRITICAL", "coolant_temp", "91 degC", "above critical_max 85 degC"):
            assert want in banner, (want, banner)
        assert driver.find_element(By.ID, "alarm-banner").is_displayed()
        assert driver.find_element(By.ID, "alarm-banner").location["y"] < 200, "at the top of the page"
        wait.until(lambda d: d.title.startswith("\u26a0 1 CRITICAL"))
        wait.until(lambda d: "critical" in d.find_element(By.CSS_SELECTOR, '[data-sensor="coolant_temp"]').get_attribute("class"))
        print("banner:", banner.replace("\n", " "), flush=True)

        # The cards keep the configuration's order, load after load (each
        # card used to be added when its own request answered).
        step = "the sensor cards' order"
        wanted = ["front_distance", "coolant_temp", "battery_voltage", "wave"]
        for load in range(5):
            if load:
                driver.refresh()
            wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "[data-sensor]")) == len(wanted))
            order = [e.get_attribute("data-sensor") for e in driver.find_elements(By.CSS_SELECTOR, "[data-sensor]")]
            assert order == wanted, (load, order)
        text_when(wait, "#link", lambda t: t.startswith("live"))
        print("sensor order kept over 5 loads:", order, flush=True)

        # A sensor's value changes on the page.
        step = "a sensor's value changing"
        wave = '[data-sensor="wave"] .value'
        first = text_when(wait, wave, lambda t: t not in ("", "—"))
        changed = text_when(wait, wave, lambda t: t != first)
        print("wave:", first, "->", changed, flush=True)

        # Every waiting approval, whoever asks, with tool, parameters and asker.
        step = "the waiting approvals"
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".approval")) == 3)
        text = text_when(wait, '.approval[data-call="%s"]' % session_call, bool)
        for want in ("gRPC session", "turn_rate", '"value": 10', "auth_tokens[0]"):
            assert want in text, (want, text)
        text = text_when(wait, '.approval[data-kind="mcp"]', bool)
        for want in ("MCP client", "turn_rate", '"value": -20', "mcp:"):
            assert want in text, (want, text)
        text = text_when(wait, '.approval[data-kind="task"]', bool)
        for want in ("drive_speed", '"value": 0.3', task_id + ":w0"):
            assert want in text, (want, text)
        print("approvals listed:", driver.find_element(By.ID, "approvals-count").text, flush=True)

        # Every open session: the gRPC one (with its call waiting) and the MCP one.
        step = "the open sessions"
        text_when(wait, '[data-open-session="grpc"]', lambda t: "1 approval" in t and "auth_tokens[0]" in t)
        text_when(wait, '[data-open-session="mcp"]', lambda t: "MCP" in t)
        driver.save_screenshot(shots + "/dashboard-approvals.png")

        # Answered from the page: every change of the list re-renders the
        # cards, so each is looked up and clicked in one step.
        step = "approving the gRPC session's call from the page"
        wait.until(lambda d: press(d.find_element(By.CSS_SELECTOR, '.approval[data-call="%s"] button.approve' % session_call)))
        wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, '.approval[data-call="%s"]' % session_call))
        step = "denying the MCP call from the page"
        wait.until(lambda d: press(d.find_element(By.CSS_SELECTOR, '.approval[data-kind="mcp"] button.deny')))
        wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, '.approval[data-kind="mcp"]'))
        # The reflex rules: the session's turn_rate 10 made one fire, which
        # set turn_rate back to 0 and re-armed; the other never fired.
        step = "the reflex rules"
        row = text_when(wait, '[data-rule="no_turning_hot"]', lambda t: "turn_rate set to 0" in t and "armed" in t)
        assert "coolant_temp > 85 and turn_rate > 0" in row and "set turn_rate to 0" in row, row
        assert driver.find_element(By.CSS_SELECTOR, '[data-rule="no_turning_hot"] .fired').text == "1", row
        row = text_when(wait, '[data-rule="stop_before_obstacle"]', bool)
        assert "front_distance < 0.3 and drive_speed > 0 for 100 ms" in row and "armed" in row, row
        assert driver.find_element(By.CSS_SELECTOR, '[data-rule="stop_before_obstacle"] .fired').text == "0", row
        print("rules:", row.replace("\n", " "), flush=True)
        full_page(driver, shots + "/dashboard-full.png")

        step = "approving the task's call from the page"
        wait.until(lambda d: press(d.find_element(By.CSS_SELECTOR, '.approval[data-kind="task"] button.approve')))
        # Each plot starts with the last minutes (the trend), not the last
        # 128 samples (6.4 s of wave at 20 Hz): reloaded now, after the
        # daemon has run for more than 8 s, wave's plot starts further back.
        # Its limit lines have a legend; the actuator table shows ranges and
        # fits its card.
        step = "the plots' history, legend and the actuator table"
        driver.refresh()
        plotted = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, '[data-sensor="wave"] .plot').get_attribute("data-from"))
        span = driver.execute_script("return Date.now() / 1000") - float(plotted)
        assert span > 7.5, span
        legend = text_when(wait, '[data-sensor="wave"] .legend', bool)
        for want in ("critical max 0.95 V", "warn max 0.8 V"):
            assert want in legend, (want, legend)
        text_when(wait, '[data-actuator="drive_speed"] .range', lambda t: t == "-0.5 … 0.5")
        text_when(wait, '[data-actuator="turn_rate"] .range', lambda t: t == "-90 … 90")
        fits = driver.execute_script("const c = document.getElementById('actuators-card'); return c.scrollWidth <= c.clientWidth;")
        assert fits, "the actuator table overflows its card"
        text_when(wait, "#link", lambda t: t.startswith("live"))
        print("wave's plot spans", round(span, 1), "s; legend:", legend.replace("\n", " "), flush=True)

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
