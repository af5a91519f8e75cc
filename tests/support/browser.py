"""A real headless Chromium (Debian's ``chromium`` and ``chromium-driver``) driven by Selenium, and
``hookdet ui`` started as a user starts it, for the web view's tests and its benchmark."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, List, Optional

REPO = Path(__file__).resolve().parents[2]
HOOKDET = Path(sys.executable).parent / "hookdet"
URL_LINE = re.compile(r"hookdet ui: (http://\S+)")


def chromium_missing() -> Optional[str]:
    """Why no browser can run here, or None."""
    for program in ("chromium", "chromedriver"):
        if shutil.which(program) is None:
            return f"{program} is not installed (apt-get install chromium chromium-driver; .ci/run does)"
    return None


@contextlib.contextmanager
def browser(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A headless Chromium whose console messages can be read (``console_errors``)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     f"--window-size={width},{height}"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver: Any) -> List[str]:
    """The page's console errors since the last call."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def wait_for(condition: Any, timeout: float = 30.0, every: float = 0.05) -> Any:
    """Poll ``condition()`` until it is truthy; its value (an AssertionError at ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {condition}")
        time.sleep(every)


def wait_ready(driver: Any, timeout: float = 30.0) -> None:
    """Until the page's script has drawn its first answer (``body[data-ready]``)."""
    wait_for(lambda: driver.execute_script("return document.body && document.body.dataset.ready === '1'"), timeout)


@contextlib.contextmanager
def ui_server(*arguments: str, cwd: Optional[Path] = None, env: Optional[dict] = None) -> Iterator[Any]:
    """``hookdet ui ARGUMENTS --port 0`` in a process of its own; yields (base URL, the process,
    the lines it printed before the URL). Stopped with Ctrl-C (SIGINT) at the end."""
    import signal

    process = subprocess.Popen([str(HOOKDET), "ui", *arguments, "--port", "0"], cwd=cwd,
                               env=dict(os.environ, **(env or {})), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    lines: List[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            match = URL_LINE.search(line)
            if match:
                break
        else:
            raise AssertionError("hookdet ui printed no URL:\n" + "\n".join(lines))
        yield match.group(1), process, lines
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
