#!/usr/bin/env python3
"""screenshot_web_chat: a picture of the web chat page in use, for the docs.

Starts `armllm serve` (by default on its default model, SmolLM2-135M-Instruct),
opens its page in headless chromium, sets a system prompt in the settings panel,
asks a question, waits for the streamed answer and its tokens/s, and saves a
screenshot.

    tools/screenshot_web_chat.py [--model PATH] [--out docs/web-chat.png]

Needs chromium, chromedriver (apt: chromium chromium-driver) and selenium.
"""
from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

ROOT = Path(__file__).resolve().parent.parent
WINDOW = (1280, 800)
LOAD_TIMEOUT_S = 600   # the first run may download the default model
ANSWER_TIMEOUT_S = 300
SYSTEM_PROMPT = "You are a friendly assistant. Answer briefly, using Markdown."
QUESTION = "Give me three tips for writing readable Python code."
MAX_TOKENS = "200"     # enough for a short answer that fits the window
TEMPERATURE = "0"      # greedy: the same answer on every run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str | None, log: Path) -> tuple[subprocess.Popen, str]:
    """`armllm serve` on a free port, once /health answers 200."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [sys.executable, "-m", "armllm", "serve", *([model] if model else []),
            "--port", str(port), "--log-interval", "0"]
    proc = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"armllm serve exited {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.terminate()
    sys.exit(f"armllm serve not ready after {LOAD_TIMEOUT_S} s:\n{log.read_text()}")


def browser() -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 "--hide-scrollbars"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options,
                              service=Service(shutil.which("chromedriver") or "chromedriver"))
    # the page's own size (a window's size would include the browser's frame)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": WINDOW[0], "height": WINDOW[1], "deviceScaleFactor": 1,
                            "mobile": False})
    return driver


def chat(driver: webdriver.Chrome, url: str) -> None:
    """A short conversation through the page, as a user would have it."""
    driver.get(url + "/")
    driver.execute_script("localStorage.clear()")
    driver.get(url + "/")
    wait = WebDriverWait(driver, ANSWER_TIMEOUT_S)
    wait.until(lambda d: d.find_element(By.ID, "model").text)
    driver.find_element(By.ID, "settings-toggle").click()
    for element_id, value in (("system-prompt", SYSTEM_PROMPT), ("temperature", TEMPERATURE),
                              ("max-tokens", MAX_TOKENS)):
        driver.find_element(By.ID, element_id).send_keys(value)
    driver.find_element(By.ID, "prompt").send_keys(QUESTION, Keys.ENTER)
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".message.assistant .stats"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model to serve (default: armllm serve's default)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "web-chat.png")
    args = parser.parse_args()
    log = Path(tempfile.mkdtemp(prefix="armllm-screenshot-")) / "serve.log"
    proc, url = start_server(args.model, log)
    driver = None
    try:
        driver = browser()
        chat(driver, url)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(args.out))
        print(f"saved {args.out}")
    finally:
        if driver is not None:
            driver.quit()
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
