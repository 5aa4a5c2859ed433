"""The decode-order page in a real headless Chromium (the OS package, driven by Selenium): type a prompt,
decode, and every token lands at its position coloured by the step that decided it; replay and the JSON
download give the same decode. Skips cleanly where Chromium or its driver is not installed
(`apt-get install chromium chromium-driver`)."""

import json
import shutil

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
webdriver = pytest.importorskip("selenium.webdriver")

from setdlm.decoding import generate  # noqa: E402

from support import CharTokenizer, running, tiny_model  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs the OS packages chromium and chromium-driver")


def _browser(download_dir):
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1000,1000"):
        opts.add_argument(a)
    opts.add_experimental_option("prefs", {"download.default_directory": str(download_dir),
                                           "download.prompt_for_download": False})
    return webdriver.Chrome(service=Service(DRIVER), options=opts)


def _decode_on_page(driver, url, prompt, settings):
    from selenium.webdriver.common.by import By

    driver.get(url + "/")
    _await_text(driver, "model", "t => t !== '' && t !== '…'")  # the page asked the server for its model
    for field, value in {"prompt": prompt, **settings}.items():
        el = driver.find_element(By.ID, field)
        el.clear()
        el.send_keys(str(value))
    assert _await_text(driver, "status", "t => t === 'done' || t.startsWith('error')", click="go") == "done"


def _await_text(driver, element: str, test: str, click: str | None = None) -> str:
    """Click the button ``click`` (if any), then block until the text of the element ``element`` passes the
    JavaScript function ``test``; returns that text. A MutationObserver in the page answers (an event, not a
    poll); the script timeout only turns a hang into a failure."""
    driver.set_script_timeout(60)
    return driver.execute_async_script("""
        const [id, test, click, done] = [arguments[0], eval(arguments[1]), arguments[2], arguments[3]];
        const el = document.getElementById(id);
        const check = () => { if (test(el.textContent)) { obs.disconnect(); done(el.textContent); } };
        const obs = new MutationObserver(check);
        obs.observe(el, { childList: true, characterData: true, subtree: true });
        if (click) document.getElementById(click).click();  // its handler runs now, before the check
        check();
    """, element, test, click)


def _await_file(path, timeout: float = 60.0) -> None:
    """Block until the download ``path`` is complete (it exists and no ``.crdownload`` is left: Chromium
    renames the finished file into place). inotify wakes the test at each change of the folder; the timeout
    only turns a hang into a failure."""
    import ctypes
    import os
    import select

    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    try:
        in_create, in_close_write, in_moved_to = 0x100, 0x8, 0x80
        assert libc.inotify_add_watch(fd, str(path.parent).encode(), in_create | in_close_write | in_moved_to) >= 0
        while not (path.exists() and not any(path.parent.glob("*.crdownload"))):  # checked after the watch began
            assert select.select([fd], [], [], timeout)[0], f"{path} was never written"
            os.read(fd, 1 << 16)
    finally:
        os.close(fd)


def _slots(driver):
    return driver.execute_script(
        "return [...document.querySelectorAll('#canvas .slot')].map(e => [e.textContent, e.dataset.step === undefined"
        " ? null : +e.dataset.step, e.style.background])")


def _shown(text: str) -> str:
    return text.replace("\n", "\u21b5\n")  # the page marks line breaks


def _check(driver, model, prompt, kw, tmp_path):
    from selenium.webdriver.common.by import By

    want = generate(model, prompt, trace=True, **kw)
    start = len(want.sequences[0]) - len(want.tokens[0])
    step_of = {p - start: k for k, t in enumerate(want.trace[0]) for p in t.committed_positions}
    tok_of = {p - start: x for t in want.trace[0] for p, x in zip(t.committed_positions, t.committed_tokens)}
    slots = _slots(driver)
    decided = [(i, s) for i, (_, s, _) in enumerate(slots) if s is not None]
    assert decided == sorted(step_of.items())  # each token at its position, marked with its step
    assert [t for t, s, _ in slots if s is not None] == [_shown(model.tokenizer.decode([tok_of[i]])) for i, _ in decided]
    assert len({bg for _, s, bg in slots if s is not None}) == len(set(step_of.values()))  # a colour per step
    assert driver.find_element(By.ID, "text").text == want.texts[0].strip()
    assert driver.find_element(By.ID, "n_steps").text == str(want.row_nfe[0])
    assert float(driver.find_element(By.ID, "tps").text) == pytest.approx(want.tokens_per_step, abs=0.01)

    # replay redraws the same decode step by step ("replaying…" as soon as it is clicked)
    assert _await_text(driver, "status", "t => t === 'done'", click="replay") == "done"
    assert _slots(driver) == slots

    driver.find_element(By.ID, "save").click()
    path = tmp_path / "setdlm-decode.json"
    _await_file(path)
    saved = json.loads(path.read_text())
    assert saved["text"].strip() == want.texts[0].strip()
    assert [e["setdlm"]["token_ids"] for e in saved["events"]] == [t.committed_tokens for t in want.trace[0]]


def test_page_draws_the_decode_order_in_chromium(tmp_path):
    model = tiny_model("setdlm", L=48, seed=2)
    model.tokenizer = CharTokenizer()
    kw = dict(max_new_tokens=20, threshold=0.3, temperature=0.8, top_p=1.0, seed=4)
    driver = _browser(tmp_path)
    try:
        with running(model, "tiny") as (url, _):
            _decode_on_page(driver, url, "to be or", dict(max_tokens=20, threshold=0.3, temperature=0.8, seed=4,
                                                          replay_ms=5))
            _check(driver, model, "to be or", kw, tmp_path)
    finally:
        driver.quit()


PROMPT = "KING HENRY:\nO God of battles, steel my soldiers' hearts;"


@pytest.mark.slow
def test_page_with_the_shipped_model_and_screenshot(tmp_path):
    """The shipped SetDLM model at threshold 0.1 (several tokens per step); writes the screenshot that
    docs/serve.md shows to tmp (copy it to docs/img/serve-page.png when the page changes)."""
    from setdlm.formats.loading import load

    model = load("shakespeare-setdlm-smax8")
    kw = dict(max_new_tokens=64, threshold=0.1, temperature=0.0, top_p=1.0, seed=0)
    driver = _browser(tmp_path)
    try:
        with running(model, "shakespeare-setdlm-smax8") as (url, _):
            _decode_on_page(driver, url, PROMPT, dict(max_tokens=64, threshold=0.1, temperature=0, seed=0, replay_ms=5))
            driver.save_screenshot(str(tmp_path / "serve-page.png"))
            _check(driver, model, PROMPT, kw, tmp_path)
    finally:
        driver.quit()
    print("screenshot:", tmp_path / "serve-page.png")


def test_page_marks_the_positions_a_regex_constraint_chose(tmp_path):
    """A regex typed on the page constrains the decode (the server's ``regex`` field); the page outlines
    exactly the positions whose token the constraint chose, as the decoder's trace records them."""
    pytest.importorskip("outlines_core")
    import re

    from selenium.webdriver.common.by import By

    from setdlm.data.tokenizers import char_tokenizer
    from setdlm.decoding.structured.constraint import regex

    from support import tiny

    model = tiny("setdlm", char_tokenizer(["abcdefghijklmnopqrstuvwxyz0123456789 -"]), L=48, seed=7)
    pattern = "[0-9]{2}-[a-c]{3}"
    want = generate(model, "to be or", max_new_tokens=12, threshold=0.3, constraint=regex(pattern), trace=True)
    start = len(want.sequences[0]) - len(want.tokens[0])
    chosen = sorted(p - start for t in want.trace[0] for p in t.constrained_positions)
    assert chosen and re.fullmatch(pattern, want.texts[0])  # the random model's own choices break the pattern
    driver = _browser(tmp_path)
    try:
        with running(model, "tiny") as (url, _):
            _decode_on_page(driver, url, "to be or", dict(max_tokens=12, threshold=0.3, regex=pattern, replay_ms=5))
            marked = driver.execute_script("return [...document.querySelectorAll('#canvas .slot')]"
                                           ".flatMap((e, i) => e.classList.contains('con') ? [i] : [])")
            assert marked == chosen
            assert driver.find_element(By.ID, "text").text == want.texts[0]
            assert driver.find_element(By.ID, "n_con").text == str(len(chosen))
    finally:
        driver.quit()


def test_page_decodes_an_ar_model_with_its_defaults(tmp_path):
    """`setdlm serve smollm2-135m` serves an AR model: the page hides and does not send threshold, window,
    cache order and speculate (an AR model takes none: each was a 400), so Decode works as it opens."""
    from selenium.webdriver.common.by import By

    model = tiny_model("ar", L=48, seed=2)
    model.tokenizer = CharTokenizer()
    driver = _browser(tmp_path)
    try:
        with running(model, "tiny-ar") as (url, _):
            _decode_on_page(driver, url, "to be or", dict(max_tokens=12))
            for field in ("threshold", "window", "cache_order", "speculate"):
                assert not driver.find_element(By.ID, field).is_displayed(), field
            assert driver.find_element(By.ID, "finish").text in ("stop", "length")
    finally:
        driver.quit()
