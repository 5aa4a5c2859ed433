"""Load on loopback: many concurrent clients, a fixed number of requests each (not a duration: what is sent
and checked does not depend on the machine's speed); every request completes with exactly the text
``generate`` gives it alone, none is dropped or answered twice, and the server's memory stays bounded.
The full run (32 clients x 16 requests, shipped model) is marked slow; a short one with a tiny model runs
always, and so does the load-and-abuse run: 32 clients mixing good requests with malformed and hostile
ones, where every bad one gets its 4xx naming the field, every good one its text alone, and /health
answers throughout (after every request, while the others are in flight)."""

import json
import os
import random
import threading
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


def _load(model, requests, *, clients: int, per_client: int, max_batch: int, bad=(), **serve):
    """Run the load: each of ``clients`` clients sends ``per_client`` requests one after another, drawn from
    ``requests`` and ``bad`` by its own seeded RNG (client k < len(bad) sends bad[k] first, so that every bad
    kind is sent; at least one good request each), and after every answer asks /health and samples the
    server's RSS, so both are checked while the other clients' requests are in flight. A fixed number of
    requests, whatever the machine's speed. Returns (answers, rss samples in MB); each answer: (request
    index, tag, response id, text). ``bad``: (body bytes, content type, status, param) requests, each checked
    to get its error."""
    expected = [generate(model, r["prompt"], max_new_tokens=r["max_tokens"],
                         **{k: v for k, v in r.items() if k not in ("prompt", "max_tokens", "stream")}).texts[0]
                for r in requests]
    plans = []
    for k in range(clients):
        rng = random.Random(k)
        plan = ([len(requests) + k] if k < len(bad) else [])
        plan += [rng.randrange(len(requests) + len(bad)) for _ in range(per_client - len(plan))]
        if all(i >= len(requests) for i in plan):
            plan[-1] = rng.randrange(len(requests))
        plans.append(plan)
    answers, errors, rss, health = [], [], [], []
    lock = threading.Lock()
    with running(model, "m", max_batch=max_batch, max_queue=4 * clients, **serve) as (url, app):

        def client(k):
            for n, i in enumerate(plans[k]):
                if i >= len(requests):
                    got = _refused(url, *bad[i - len(requests)])
                else:
                    tag = f"{k}-{n}"
                    body = json.dumps(dict(requests[i], user=tag)).encode()
                    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
                    try:
                        with urllib.request.urlopen(req, timeout=120) as r:
                            raw = r.read().decode()
                        rid, text = _answer(raw, requests[i].get("stream", False))
                        got = None
                    except Exception as e:  # recorded, the test fails below
                        got = repr(e)
                    else:
                        with lock:
                            answers.append((i, tag, rid, text))
                try:
                    status = urllib.request.urlopen(url + "/health", timeout=60).status
                except Exception as e:  # recorded, the test fails below
                    status = repr(e)
                with lock:
                    errors.extend([got] if got is not None else [])
                    health.append(status)
                    rss.append(_rss_mb())

        threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # the last answers may arrive before the loop has let their rows go: wait for it (a hang guard)
        assert app.state.batcher.wait(lambda stats: stats["running"] == 0 and stats["waiting"] == 0, 60)
    assert not errors, errors[:3]
    assert health == [200] * clients * per_client  # /health answered after every request
    good = [i for plan in plans for i in plan if i < len(requests)]
    assert sorted(i for i, _, _, _ in answers) == sorted(good)  # every good request answered, once
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
    answers, _ = _load(model, _requests(["to be", "or not", "a", "the cat sat"], 16), clients=8, per_client=4,
                       max_batch=4)
    assert len(answers) == 32


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
    """32 clients, 4 requests each, good and bad requests mixed: one bad request never fails another."""
    model = tiny_model("setdlm", L=48, seed=2)
    model.tokenizer = CharTokenizer()
    answers, rss = _load(model, _requests(["to be", "or not", "a", "the cat sat"], 16), clients=32, per_client=4,
                         max_batch=8, bad=BAD, max_body_mb=100_000 / 2**20)
    assert len(answers) >= 32  # one good request per client at least
    assert max(rss) - min(rss) < 300, (min(rss), max(rss))  # the refused bodies were not kept


@pytest.mark.slow
def test_load_32_clients_shipped_model():
    from setdlm.formats.loading import load

    per_client = int(os.environ.get("SETDLM_LOAD_REQUESTS", "16"))
    model = load("shakespeare-setdlm-smax8")
    prompts = ["ROMEO:", "JULIET:\nO Romeo,", "First Citizen:\nBefore we proceed", "KING HENRY:\nOnce more",
               "To be, or not to be", "HAMLET:"]
    answers, rss = _load(model, _requests(prompts, 32), clients=32, per_client=per_client, max_batch=16)
    assert len(answers) == 32 * per_client
    warm = rss[len(rss) // 4:]  # after the first quarter, memory must not keep growing
    assert max(warm) - min(warm) < 300, (min(warm), max(warm))
    print(f"{len(answers)} requests; RSS {min(rss):.0f}..{max(rss):.0f} MB")
