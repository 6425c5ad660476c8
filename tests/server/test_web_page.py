"""The web chat page (GET /) in a real headless chromium driven by Selenium: a reply
streams in and ends with its tokens/s, the stop button ends a reply (and its
generation on the server), conversations outlive a reload, a server with
--api-key gets its key from the page's dialog, and the Markdown renderer
escapes HTML and links only safe targets."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import metric, running_server
from tests.tiny_model import write_tiny_llama

LONG_CONTEXT = 32768   # room for a reply long enough to watch it stream and stop it
WAIT_S = 20            # the most any step may take (they take well under a second)
POLL_S = 0.02


def _missing() -> str | None:
    """What this machine lacks to drive a browser, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package (pip install selenium)"
    for program in ("chromium", "chromedriver"):
        if not shutil.which(program):
            return f"{program} on PATH (apt-get install chromium chromium-driver)"
    return None


@pytest.fixture(scope="module")
def browser():
    missing = _missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the web page tests; this runner lacks {missing}")
        pytest.skip(f"needs {missing}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 "--window-size=1280,800"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def long_model(tmp_path_factory) -> Path:
    """The tiny model with a long context: a few seconds of tokens at its speed."""
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-web"), max_position=LONG_CONTEXT)


SERVER_FLAGS = ("--dtype", "float32", "--kv-cache-gib", "0.05", "--served-model-name", "tiny")


@pytest.fixture(scope="module")
def web_server(long_model, tmp_path_factory):
    with running_server(long_model, tmp_path_factory, "web", *SERVER_FLAGS) as srv:
        yield srv


# ---- driving the page -----------------------------------------------------------

def wait_for(condition, what: str, timeout: float = WAIT_S):
    """condition()'s first truthy value, polled; fails naming `what` after timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(POLL_S)
    raise AssertionError(f"timed out waiting for {what}")


def open_page(driver, url: str, fresh: bool = True) -> None:
    """Loads the page; `fresh`: with its localStorage emptied first."""
    driver.get(url + "/")
    if fresh:
        driver.execute_script("localStorage.clear()")
        driver.get(url + "/")


def by_id(driver, element_id: str):
    from selenium.webdriver.common.by import By
    return driver.find_element(By.ID, element_id)


def settings(driver, max_tokens: int, ignore_eos: bool = True, system_prompt: str = "") -> None:
    """Fills in the settings panel (opened if closed)."""
    if not by_id(driver, "settings").is_displayed():
        by_id(driver, "settings-toggle").click()
    for element_id, value in (("max-tokens", str(max_tokens)),
                              ("system-prompt", system_prompt)):
        field = by_id(driver, element_id)
        field.clear()
        field.send_keys(value)
    if by_id(driver, "ignore-eos").is_selected() != ignore_eos:
        by_id(driver, "ignore-eos").click()


def send(driver, prompt: str) -> None:
    from selenium.webdriver.common.keys import Keys
    wait_for(lambda: by_id(driver, "send").is_displayed(), "the send button")
    by_id(driver, "prompt").send_keys(prompt, Keys.ENTER)


def last_reply(driver) -> dict:
    """The last assistant message's text and stats line ("" while streaming)."""
    return driver.execute_script("""
        const replies = document.querySelectorAll('.message.assistant');
        const last = replies[replies.length - 1];
        return last ? {text: last.querySelector('.content').textContent,
                       stats: last.querySelector('.meta').textContent} : null;""")


def finished_reply(driver) -> dict:
    return wait_for(lambda: (r := last_reply(driver)) and r["stats"] and r, "a finished reply")


def conversation_titles(driver) -> list[str]:
    return driver.execute_script(
        "return [...document.querySelectorAll('#conversations .open')].map(b => b.textContent)")


# ---- the tests ------------------------------------------------------------------

def test_reply_streams_in_with_tokens_per_second(browser, web_server):
    open_page(browser, web_server.url)
    wait_for(lambda: by_id(browser, "model").text == "tiny", "the model id")
    settings(browser, max_tokens=3000)
    send(browser, "w1 w2 w3")
    lengths = []
    while not (reply := last_reply(browser)) or not reply["stats"]:
        lengths.append(len(reply["text"]) if reply else 0)
        assert len(lengths) < WAIT_S / POLL_S, "the reply never finished"
        time.sleep(POLL_S)
    partial = sorted({n for n in lengths if 0 < n < len(reply["text"])})
    assert len(partial) >= 2, f"no text seen arriving before the end: {lengths}"
    assert lengths == sorted(lengths)   # it only grows
    assert reply["stats"].startswith("3000 tokens · ") and "tokens/s" in reply["stats"]
    assert float(reply["stats"].split(" · ")[1].split()[0]) > 0
    assert reply["text"].split()[0].startswith("w")


def test_stop_button_ends_the_reply_and_its_generation(browser, web_server):
    open_page(browser, web_server.url)
    settings(browser, max_tokens=LONG_CONTEXT // 2)
    send(browser, "w4 w5")
    wait_for(lambda: len(last_reply(browser)["text"]) > 200, "streamed text")
    assert by_id(browser, "stop").is_displayed() and not by_id(browser, "send").is_displayed()
    by_id(browser, "stop").click()
    reply = finished_reply(browser)
    assert "stopped" in reply["stats"]
    assert by_id(browser, "send").is_displayed() and not by_id(browser, "stop").is_displayed()
    time.sleep(0.3)
    assert last_reply(browser)["text"] == reply["text"]  # no more text after the stop
    # the server dropped the generation and stays healthy
    wait_for(lambda: metric(web_server.url, "armllm:num_requests_running") == 0,
             "the server to end the generation", timeout=5)
    assert httpx.get(web_server.url + "/health").status_code == 200
    settings(browser, max_tokens=5)
    send(browser, "w6")
    assert finished_reply(browser)["stats"].startswith("5 tokens")
    assert len(browser.find_elements("css selector", ".message.assistant")) == 2


def test_conversations_survive_a_reload(browser, web_server):
    open_page(browser, web_server.url)
    wait_for(lambda: by_id(browser, "model").text == "tiny", "the model id")
    settings(browser, max_tokens=8)
    send(browser, "w7 w8")
    first_reply = finished_reply(browser)["text"]
    by_id(browser, "new-chat").click()
    send(browser, "w9")
    second_reply = finished_reply(browser)["text"]
    assert conversation_titles(browser) == ["w9", "w7 w8"]

    open_page(browser, web_server.url, fresh=False)
    wait_for(lambda: conversation_titles(browser) == ["w9", "w7 w8"], "the saved list")
    assert last_reply(browser)["text"] == second_reply   # the open one stays open
    browser.find_elements("css selector", "#conversations .open")[1].click()
    assert last_reply(browser)["text"] == first_reply
    assert browser.find_element("css selector", ".message.user").text == "w7 w8"
    browser.find_element("css selector", "#conversations li.active .delete").click()
    assert conversation_titles(browser) == ["w9"]
    open_page(browser, web_server.url, fresh=False)
    wait_for(lambda: conversation_titles(browser) == ["w9"], "the list after a delete")


def test_an_api_error_shows_its_message(browser, web_server):
    open_page(browser, web_server.url)
    settings(browser, max_tokens=LONG_CONTEXT * 2)
    send(browser, "w1")
    error = wait_for(lambda: browser.find_elements("css selector", ".message.assistant .error"),
                     "the error")[0]
    assert "exceeds max_model_len" in error.text
    assert by_id(browser, "send").is_displayed()
    settings(browser, max_tokens=3)   # the failed reply is not sent back to the model
    send(browser, "w2")
    assert finished_reply(browser)["stats"].startswith("3 tokens")


def test_page_asks_for_the_api_key(browser, long_model, tmp_path_factory):
    with running_server(long_model, tmp_path_factory, "web-key", *SERVER_FLAGS,
                        "--api-key", "sesame") as srv:
        # the page and its files need no key; the API does
        assert httpx.get(srv.url + "/").status_code == 200
        assert httpx.get(srv.url + "/static/chat.js").status_code == 200
        assert httpx.get(srv.url + "/v1/models").status_code == 401
        open_page(browser, srv.url)
        dialog = by_id(browser, "key-dialog")
        wait_for(dialog.is_displayed, "the API key dialog")
        by_id(browser, "api-key").send_keys("wrong")
        by_id(browser, "key-save").click()
        wait_for(lambda: by_id(browser, "key-refused").is_displayed(), "the refusal")
        key_field = by_id(browser, "api-key")
        key_field.clear()
        key_field.send_keys("sesame")
        by_id(browser, "key-save").click()
        wait_for(lambda: by_id(browser, "model").text == "tiny", "the model id")
        assert not dialog.is_displayed()
        settings(browser, max_tokens=5)
        send(browser, "w1")
        assert finished_reply(browser)["stats"].startswith("5 tokens")
        assert browser.execute_script("return localStorage.getItem('armllm.apiKey')") \
            == '"sesame"'


def test_markdown_renderer_escapes_html_and_unsafe_links(browser, web_server):
    browser.get(web_server.url + "/")
    source = ("# Title\n\n**bold** *it* `<b>code</b>` <script>alert(1)</script>\n"
              "<img src=x onerror=alert(1)>\n\n- one\n- two\n\n"
              "[safe](https://example.com/?a=1&b=2) [unsafe](javascript:alert(1)) "
              "[data](data:text/html,x)\n\n```py\nprint('<i>')\n```")
    html = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "import('/static/markdown.js').then(m => done(m.renderMarkdown(arguments[0])));",
        source)
    assert "<h1>Title</h1>" in html
    assert "<strong>bold</strong> <em>it</em> <code>&lt;b&gt;code&lt;/b&gt;</code>" in html
    assert "<script" not in html and "<img" not in html and "&lt;script&gt;" in html
    assert "<ul><li>one</li><li>two</li></ul>" in html
    assert '<a href="https://example.com/?a=1&amp;b=2"' in html
    assert html.count("<a ") == 1 and "javascript:" not in html and "data:" not in html
    assert "<pre><code class=\"language-py\">print(&#39;&lt;i&gt;&#39;)</code></pre>" in html
