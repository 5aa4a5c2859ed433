"""Load on loopback: many concurrent clients for a bounded time; every request completes with exactly the
text ``generate`` gives it alone, none is dropped or answered twice, and the server's memory stays bounded.
The full run (32 clients, 60 s, shipped model) is marked slow; a short one with a tiny model runs always,
and so does the load-and-abuse run: 32 clients mixing good requests with malformed and hostile ones, where
every bad one gets its 4xx naming the field, every good one its text alone, and /health answers
throughout."""

import json
import os
import random
import threading
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from setdlm.decoding import generate  # noqa: E402

from support import CharTokenizer, running, tiny_model  # noqa: E402


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def _load(model, requests, *, clients: int, seconds: float, max_batch: int, bad=(), **serve):
    """Run the load; returns (answers, rss samples in MB). Each answer: (request index, tag, response).
    ``bad``: (body bytes, content type, status, param) requests mixed in, each checked to get its error."""
    expected = [generate(model, r["prompt"], max_new_tokens=r["max_tokens"],
                         **{k: v for k, v in r.items() if k not in ("prompt", "max_tokens", "stream")}).texts[0]
                for r in requests]
    answers, errors, rss, health = [], [], [], []
    lock = threading.Lock()
    with running(model, "m", max_batch=max_batch, max_queue=4 * clients, **serve) as (url, app):
        stop = time.monotonic() + seconds

        def client(k):
            """Until the time is up, and at least one good request (client k < len(bad) sends bad[k] first):
            how much is sent depends on the machine's speed, what is checked does not."""
            rng = random.Random(k)
            n = 0
            first = len(requests) + k if k < len(bad) else None
            while time.monotonic() < stop or n == 0:
                i, first = (rng.randrange(len(requests) + len(bad)) if first is None else first), None
                if n == 0 and time.monotonic() >= stop:
                    i = rng.randrange(len(requests))
                if i >= len(requests):
                    got = _refused(url, *bad[i - len(requests)])
                    if got is not None:
                        with lock:
                            errors.append(got)
                        return
                    continue
                tag = f"{k}-{n}"
                body = json.dumps(dict(requests[i], user=tag)).encode()
                req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=120) as r:
                        raw = r.read().decode()
                    rid, text = _answer(raw, requests[i].get("stream", False))
                except Exception as e:  # recorded, the test fails below
                    with lock:
                        errors.append(repr(e))
                    return
                with lock:
                    answers.append((i, tag, rid, text))
                n += 1

        threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
        for t in threads:
            t.start()
        while True:  # sampled at least once, while the clients run
            rss.append(_rss_mb())
            if bad:
                try:
                    health.append(urllib.request.urlopen(url + "/health", timeout=60).status)
                except Exception as e:  # recorded, the test fails below
                    health.append(repr(e))
            if not any(t.is_alive() for t in threads):
                break
            time.sleep(0.25)
        for t in threads:
            t.join()
        stats = app.state.batcher.stats()
    assert not errors, errors[:3]
    assert all(h == 200 for h in health), health
    assert stats["running"] == 0 and stats["waiting"] == 0  # nothing left behind
    for i, tag, rid, text in answers:
        assert text == expected[i], (i, tag)
    assert len({rid for _, _, rid, _ in answers}) == len(answers)  # no response id twice
    assert len({tag for _, tag, _, _ in answers}) == len(answers)
    return answers, rss


def _refused(url, body: bytes, kind: str, status: int, param) -> str | None:
    """Send one bad request; None when it got ``status`` with the error naming ``param``, else what it got."""
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": kind})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return f"{body[:60]!r}: {r.status}, not {status}"
    except urllib.error.HTTPError as e:
        err = json.loads(e.read())["error"]
        if e.code != status or err["param"] != param or not err["message"]:
            return f"{body[:60]!r}: {e.code} {err}, not {status} naming {param}"
    return None


def _answer(raw: str, stream: bool) -> tuple[str, str]:
    """(response id, text) of a plain or streamed answer; a stream must be one id and end with [DONE]."""
    if not stream:
        out = json.loads(raw)
        return out["id"], out["choices"][0]["text"]
    chunks = [json.loads(line[6:]) for line in raw.split("\n\n") if line.startswith("data: {")]
    ids = {c["id"] for c in chunks}
    if not raw.rstrip().endswith("data: [DONE]") or len(ids) != 1:
        raise ValueError(f"a broken stream: {raw[-200:]!r}")
    return ids.pop(), "".join(c["choices"][0]["text"] for c in chunks)


def _requests(prompts, max_tokens):
    """Greedy and sampled (seeded), plain and streamed, with several thresholds and lengths."""
    out = []
    for j, p in enumerate(prompts):
        n = max_tokens - 4 * (j % 3)
        out.append({"prompt": p, "max_tokens": n, "threshold": 0.3})
        out.append({"prompt": p, "max_tokens": n, "temperature": 0.8, "seed": j, "stream": True})
        out.append({"prompt": p, "max_tokens": n // 2, "threshold": 0.1, "stream": True})
    return out


def test_short_load_tiny_model():
    model = tiny_model("setdlm", L=48, seed=2)
    model.tokenizer = CharTokenizer()
    answers, _ = _load(model, _requests(["to be", "or not", "a", "the cat sat"], 16), clients=8, seconds=3,
                       max_batch=4)
    assert len(answers) >= 8


JSON = "application/json"
BAD = [  # (body, content type, status, the field the error names)
    (json.dumps({"prompt": "to be", "seed": 2**64, "temperature": 0.5}).encode(), JSON, 400, "seed"),
    (json.dumps({"prompt": "to be", "window": 10**30}).encode(), JSON, 400, "window"),
    (json.dumps({"prompt": "to be", "block_size": 10**30}).encode(), JSON, 400, "block_size"),
    (json.dumps({"prompt": "to be", "temperature": -1}).encode(), JSON, 400, "temperature"),
    (b'{"prompt": "to \\ud800"}', JSON, 400, "prompt"),
    (b'{"prompt": "to be", "user": ' + b"[" * 64 + b"]" * 64 + b"}", JSON, 400, "user"),
    (b'{"prompt": "to be", "x": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", JSON, 400, None),  # RecursionError
    (b'{"prompt": "to be", "max_tokens": ' + b"9" * 5000 + b"}", JSON, 400, None),
    (b'{"prompt": "to \xff"}', JSON, 400, None),
    (b'{"prompt": "to be", "response_format": {"type": "yaml"}}', JSON, 400, "response_format"),
    (b'{"prompt": "to be"}', "text/plain", 415, "Content-Type"),
    (json.dumps({"prompt": "a" * 120_000}).encode(), JSON, 413, None),
    (b'{"prompt": "to be", "max_tokens": 100}', JSON, 400, "max_tokens"),
]


def test_load_and_abuse_32_clients():
    """32 clients for a few seconds, good and bad requests mixed: one bad request never fails another."""
    model = tiny_model("setdlm", L=48, seed=2)
    model.tokenizer = CharTokenizer()
    answers, rss = _load(model, _requests(["to be", "or not", "a", "the cat sat"], 16), clients=32, seconds=4,
                         max_batch=8, bad=BAD, max_body=100_000)
    assert len(answers) >= 32  # one good request per client at least, whatever the machine's speed
    assert max(rss) - min(rss) < 300, (min(rss), max(rss))  # the refused bodies were not kept


@pytest.mark.slow
def test_load_32_clients_shipped_model():
    from setdlm.loading import load

    seconds = float(os.environ.get("SETDLM_LOAD_SECONDS", "60"))
    model = load("shakespeare-setdlm-smax8")
    prompts = ["ROMEO:", "JULIET:\nO Romeo,", "First Citizen:\nBefore we proceed", "KING HENRY:\nOnce more",
               "To be, or not to be", "HAMLET:"]
    answers, rss = _load(model, _requests(prompts, 32), clients=32, seconds=seconds, max_batch=16)
    assert len(answers) >= 32
    warm = rss[len(rss) // 4:]  # after the first quarter, memory must not keep growing
    assert max(warm) - min(warm) < 300, (min(warm), max(warm))
    print(f"{len(answers)} requests in {seconds:.0f} s; RSS {min(rss):.0f}..{max(rss):.0f} MB")
