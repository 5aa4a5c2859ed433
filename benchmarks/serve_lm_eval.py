"""lm-eval's multiple-choice pipeline through ``setdlm serve`` beside the in-process adapter (docs/serve.md,
"lm-eval through the server"; benchmarks/RESULTS.md "lm-eval through the server").

The task is local (no download): ``n`` held-out ``medium`` word problems; the context is the question and the
worked solution up to its last line, the choices that last line and the final answer with the right result
and three wrong ones (result ± 1, + 10), so the model has to do the last step's arithmetic. Both runs use
lm-eval's ``simple_evaluate``: ``--model setdlm`` in process, and ``--model local-completions`` against the
server (the shipped tokenizer as lm-eval's Hugging Face tokenizer, ``add_bos_token=True``, batches of 8).

    python benchmarks/serve_lm_eval.py --models arith-ar arith-setdlm-smax8 --n 300
"""

from __future__ import annotations

import argparse
import json
import socket
import tempfile
import threading
import time
from pathlib import Path

import lm_eval.models  # noqa: F401  (every lm-eval model; its registry loads them only while empty)
import uvicorn
from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager

import setdlm
import setdlm.evaluation.harness  # noqa: F401  (registers --model setdlm with lm-eval releases before plugins)
from setdlm.data.tasks import reasoning_split
from setdlm.formats import pretrained
from setdlm.serve import ServeOptions, create_app


def docs(n: int) -> list[dict]:
    out = []
    for ex in reasoning_split("test", n, level="medium"):
        lines = ex.completion.split("\n")
        last, answer = lines[-2], int(lines[-1].removeprefix("#### "))
        head = ex.prompt + "".join(line + "\n" for line in lines[:-2])
        wrong = [r for r in (answer + 1, answer - 1, answer + 10) if r >= 0 and r != answer][:3]
        choices = [f"{last.rsplit('=', 1)[0]}={r}\n#### {r}" for r in [answer] + wrong]
        out.append({"context": head, "choices": choices, "label": 0})
    return out


def task(folder: Path, n: int) -> TaskManager:
    data = folder / "mc.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs(n)))
    (folder / "mc.yaml").write_text(
        f"task: arith_last_step\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{context}}'\ntarget_delimiter: ''\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{label}}'\nmetric_list:\n  - metric: acc\n")
    return TaskManager(include_path=str(folder), include_defaults=False)


def evaluate(model: str, args: str, tasks: TaskManager, batch_size: int) -> tuple[float, float, list]:
    start = time.perf_counter()
    res = simple_evaluate(model=model, model_args=args, tasks=["arith_last_step"], task_manager=tasks,
                          batch_size=batch_size, device="cpu", log_samples=True)
    scores = [[r[0][0] for r in s["resps"]] for s in sorted(res["samples"]["arith_last_step"], key=lambda s: s["doc_id"])]
    return res["results"]["arith_last_step"]["acc,none"], time.perf_counter() - start, scores


def served(name: str, tasks: TaskManager, batch_size: int) -> tuple[float, float, list]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(setdlm.load(name), name, ServeOptions(port=port, max_batch=batch_size))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        args = f"model={name},base_url=http://127.0.0.1:{port}/v1/completions,tokenizer_backend=huggingface," \
               f"tokenizer={pretrained.path(name)},add_bos_token=True,num_concurrent=1,max_retries=1"
        return evaluate("local-completions", args, tasks, batch_size)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["arith-ar", "arith-setdlm-smax8"])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=8)
    a = ap.parse_args()
    tasks = task(Path(tempfile.mkdtemp()), a.n)
    print("| model | in process: acc | s | through the server: acc | s | largest |Δ log-likelihood| |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in a.models:
        acc_in, t_in, s_in = evaluate("setdlm", f"pretrained={name}", tasks, a.batch_size)
        acc_sv, t_sv, s_sv = served(name, tasks, a.batch_size)
        delta = max(abs(x - y) for d_in, d_sv in zip(s_in, s_sv) for x, y in zip(d_in, d_sv))
        print(f"| {name} | {acc_in:.3f} | {t_in:.1f} | {acc_sv:.3f} | {t_sv:.1f} | {delta:.2g} |", flush=True)


if __name__ == "__main__":
    main()
