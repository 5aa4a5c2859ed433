"""Self-speculative decoding through the server (docs/decoding.md, docs/serve.md): a request sets
``speculate``, its stream carries each step's accepted set with its positions and the draft it verified,
the text is the ``window=1`` text; bad combinations are a 400 naming the field; the page marks accepted and
rejected drafts (in a real headless Chromium, where installed)."""

import json
import shutil
import urllib.error
import urllib.request

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from setdlm.decoding import generate  # noqa: E402

from support import CharTokenizer, running, tiny_model  # noqa: E402


def _model(family="setdlm"):
    m = tiny_model(family, L=48, seed=2)
    m.tokenizer = CharTokenizer()
    return m


def _post(url, body):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read().decode()
            return r.status, raw if body.get("stream") else json.loads(raw)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_speculative_request_streams_accepted_sets_and_the_window_1_text():
    model = _model()
    kw = dict(max_new_tokens=24, ignore_eos=True)
    ref = generate(model, "to be or", window=1, **kw)
    spec = generate(model, "to be or", window=4, speculate=True, trace=True, **kw)
    with running(model, "tiny") as (url, _):
        code, raw = _post(url, {"prompt": "to be or", "max_tokens": 24, "ignore_eos": True, "window": 4,
                                "speculate": True, "stream": True})
        assert code == 200
        events = [json.loads(line[5:]) for line in raw.split("\n\n") if line.startswith("data:") and "[DONE]" not in line]
        steps = [e["setdlm"] for e in events]
        assert "".join(e["choices"][0]["text"] for e in events) == ref.texts[0]
        assert [s["token_ids"] for s in steps] == [t.committed_tokens for t in spec.trace[0]]
        drafted = [s for s in steps if "draft" in s]
        assert drafted and sum(s["draft"]["accepted"] for s in drafted) == sum(t.accepted for t in spec.trace[0])
        for s in drafted:  # the accepted set: the accepted prefix of the draft, then the verifier's token
            a = s["draft"]["accepted"]
            assert s["positions"][:a] == s["draft"]["positions"][:a] and s["token_ids"][:a] == s["draft"]["token_ids"][:a]
        code, body = _post(url, {"prompt": "to be or", "max_tokens": 24, "ignore_eos": True, "speculate": True})
        assert code == 200 and body["choices"][0]["text"] == ref.texts[0]
        code, body = _post(url, {"prompt": "to be or", "speculate": True, "threshold": 0.5})
        assert code == 400 and body["error"]["param"] == "speculate" and "threshold" in body["error"]["message"]
        code, body = _post(url, {"prompt": "to be or", "speculate": "yes"})
        assert code == 400 and body["error"]["param"] == "speculate"


def test_speculate_ar_serves_the_ar_text_of_the_same_weights():
    """``"speculate": "next_token"`` on a model trained with a next-token head: the AR decode's text, its steps streamed
    with their drafts; on a model without that head a 400 naming speculate."""
    from setdlm import Model
    from setdlm.family import FamilyConfig

    plain = _model()
    model = Model(plain.backbone, FamilyConfig("setdlm", 48, plain.family.mask_token_id, D=2, ar_weight=1.0),
                  plain.tokenizer)
    ar = Model(plain.backbone, FamilyConfig("ar", 48, plain.family.mask_token_id), plain.tokenizer)
    ref = generate(ar, "to be or", max_new_tokens=20, ignore_eos=True)
    with running(model, "tiny") as (url, _):
        code, body = _post(url, {"prompt": "to be or", "max_tokens": 20, "ignore_eos": True, "window": 4,
                                 "speculate": "next_token"})
        assert code == 200 and body["choices"][0]["text"] == ref.texts[0]
        code, raw = _post(url, {"prompt": "to be or", "max_tokens": 20, "ignore_eos": True, "window": 4,
                                "speculate": "next_token", "stream": True})
        events = [json.loads(line[5:]) for line in raw.split("\n\n") if line.startswith("data:") and "[DONE]" not in line]
        assert code == 200 and "".join(e["choices"][0]["text"] for e in events) == ref.texts[0]
        code, body = _post(url, {"prompt": "to be or", "speculate": "AR"})
        assert code == 400 and body["error"]["param"] == "speculate"
    with running(plain, "tiny") as (url, _):
        code, body = _post(url, {"prompt": "to be or", "max_tokens": 4, "speculate": "next_token"})
        assert code == 400 and body["error"]["param"] == "speculate" and "not trained" in body["error"]["message"]


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs the OS packages chromium and chromium-driver")
def test_page_marks_accepted_and_rejected_drafts(tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    model = _model()
    spec = generate(model, "the cat", max_new_tokens=20, window=3, speculate=True, trace=True)
    accepted = sum(t.accepted for t in spec.trace[0])
    rejected = sum(t.accepted < len(t.draft_positions) for t in spec.trace[0])
    assert accepted and rejected  # the page has both to show
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    try:
        with running(model, "tiny") as (url, _):
            driver.get(url + "/")
            WebDriverWait(driver, 20).until(lambda d: d.find_element(By.ID, "model").text not in ("", "…"))
            for field, value in {"prompt": "the cat", "max_tokens": 20, "window": 3}.items():
                el = driver.find_element(By.ID, field)
                el.clear()
                el.send_keys(str(value))
            driver.find_element(By.ID, "speculate").click()
            driver.find_element(By.ID, "go").click()
            WebDriverWait(driver, 60).until(lambda d: d.find_element(By.ID, "status").text == "done" or
                                            d.find_element(By.ID, "status").text.startswith("error"))
            assert driver.find_element(By.ID, "status").text == "done"
            marks = driver.execute_script("return ['acc', 'rej'].map(c => document.querySelectorAll("
                                          "'#canvas .slot.' + c).length)")
            assert marks == [accepted, rejected]
            n_drafted = sum(len(t.draft_positions) for t in spec.trace[0])
            assert driver.find_element(By.ID, "drafts").text == f"{accepted} / {n_drafted}"
            assert driver.find_element(By.ID, "text").text == spec.texts[0].strip()
    finally:
        driver.quit()
