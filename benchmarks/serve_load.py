"""Serving throughput and latency under concurrent clients, side by side in one run (docs/serve.md).

    PYTHONPATH=src python benchmarks/serve_load.py                       # the RESULTS.md table
    PYTHONPATH=src python benchmarks/serve_load.py --model shakespeare-ar --requests 32

Starts ``setdlm serve MODEL`` as a subprocess on 127.0.0.1 and sends the same ``--requests`` requests
(shipped-model prompts, ``--max-tokens`` each, greedy, ``--threshold``, streamed) with 1, 4, 16 and 32
concurrent clients (threads, each sending its next request when the last one finished). Reported per
level: aggregate tokens/s (all completion tokens / wall seconds of the level), p50/p99 request latency,
p50/p99 time to the first streamed event (TTFE), the speed-up over one client at a time, and the mean
decoding batch (rows per forward, from the server's own counters). The levels run ``--rounds`` times,
interleaved (1, 4, 16, 32, then 32, 16, 4, 1, ...); each figure is the median over rounds, and the range
shows how much the (possibly shared) machine drifted during the run. The text of every answer is checked
against the one-client answer of the same request (continuous batching must not change results).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

PROMPTS = ["ROMEO:", "JULIET:\nO Romeo, Romeo!", "First Citizen:\nBefore we proceed any further,", "KING HENRY:",
           "HAMLET:\nTo be, or not to be,", "MACBETH:\nIs this a dagger", "PORTIA:\nThe quality of mercy",
           "LEAR:\nBlow, winds,"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_request(url: str, body: dict) -> dict:
    """Stream one completion; returns text, tokens, latency and time to first event (seconds)."""
    t0 = time.perf_counter()
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    first, text, tokens = None, [], 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if not line.startswith(b"data: {"):
                continue
            if first is None:
                first = time.perf_counter() - t0
            ev = json.loads(line[6:])
            text.append(ev["choices"][0]["text"])
            if "usage" in ev:
                tokens = ev["usage"]["completion_tokens"]
    return {"text": "".join(text), "tokens": tokens, "latency": time.perf_counter() - t0, "ttfe": first}


def counters(url: str) -> tuple[int, int]:
    h = json.loads(urllib.request.urlopen(url + "/health", timeout=10).read())
    return h["forwards"], h["row_steps"]


def level(url: str, bodies: list[dict], clients: int) -> tuple[list[dict], float, float]:
    """Send every body with ``clients`` concurrent clients; returns per-request results, wall seconds and
    the mean decoding batch (rows per forward)."""
    f0, r0 = counters(url)
    results: list[dict | None] = [None] * len(bodies)
    nxt, lock = [0], threading.Lock()

    def client():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(bodies):
                return
            results[i] = one_request(url, bodies[i])

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    f1, r1 = counters(url)
    return results, wall, (r1 - r0) / max(f1 - f0, 1)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="shakespeare-setdlm-smax8")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threshold", type=float, default=0.1)
    ap.add_argument("--levels", default="1,4,16,32")
    ap.add_argument("--rounds", type=int, default=3, help="passes over the levels, alternating direction")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    port = free_port()
    env = dict(os.environ)
    server = subprocess.Popen([sys.executable, "-m", "setdlm", "serve", args.model, "--port", str(port),
                               "--max-batch", str(max(levels)), "--max-queue", str(4 * max(levels)),
                               "--name", "m"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/health", timeout=2)
                break
            except OSError:
                time.sleep(0.2)
        bodies = [{"model": "m", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": args.max_tokens - (i % 4) * 4,
                   "threshold": args.threshold, "stream": True} for i in range(args.requests)]
        level(url, bodies[:2], 2)  # warm up
        order = [c for r in range(args.rounds) for c in (levels if r % 2 == 0 else levels[::-1])]
        runs = []
        for c in order:
            res, wall, batch = level(url, bodies, c)
            runs.append((c, res, wall, batch))
            print(f"  clients={c}: {wall:.1f} s", file=sys.stderr)
    finally:
        server.terminate()
        server.wait(timeout=30)
    reference = {i: r["text"] for i, r in enumerate(runs[0][1])}
    for c, res, _, _ in runs:
        bad = [i for i, r in enumerate(res) if r["text"] != reference[i]]
        assert not bad, f"clients={c}: answers {bad} differ from the one-client answers"
    tps = {}
    for c, res, wall, _ in runs:
        tps.setdefault(c, []).append(sum(r["tokens"] for r in res) / wall)
    base = statistics.median(tps[levels[0]])
    print(f"\nmodel {args.model}, {args.requests} requests of <= {args.max_tokens} tokens, threshold "
          f"{args.threshold}, streamed; {args.rounds} rounds, medians (range over rounds)\n")
    print("| clients | tokens/s | speed-up vs 1 at a time | mean batch | p50 latency (s) | p99 latency (s) "
          "| p50 TTFE (s) | p99 TTFE (s) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in levels:
        res = [r for cc, rr, _, _ in runs if cc == c for r in rr]
        batch = statistics.mean(b for cc, _, _, b in runs if cc == c)
        lat, ttfe = [r["latency"] for r in res], [r["ttfe"] for r in res]
        t = statistics.median(tps[c])
        print(f"| {c} | {t:.1f} ({min(tps[c]):.0f}–{max(tps[c]):.0f}) | {t / base:.2f}x | {batch:.1f} "
              f"| {pct(lat, .5):.2f} | {pct(lat, .99):.2f} | {pct(ttfe, .5):.3f} | {pct(ttfe, .99):.3f} |")


if __name__ == "__main__":
    main()
