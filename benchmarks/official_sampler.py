"""setdlm against the authors' own sampler (``kuleshov-group/setdlms``) on a probe-size DiT with the same weights.

    # their code and a benchmark-only environment (never setdlm's; none of their files edited):
    git clone https://github.com/kuleshov-group/setdlms /work/official-src
    python3 -m venv /work/official-venv
    /work/official-venv/bin/pip install torch==2.13.0 transformers==4.52.4 hydra-core==1.3.2 einops safetensors
    PYTHONPATH=src python benchmarks/official_sampler.py --official-src /work/official-src \
        --official-python /work/official-venv/bin/python --threads 1            # RESULTS.md

The DiT (V = 4096, d = 256, 4 heads, 4 layers, L = 256) is setdlm's :class:`setdlm.model.Transformer`
initialised from ``--seed`` at the reference fixture's weight scales (:func:`spread_init`), written once
with the authors' key names (``setdlm.formats.convert.reference_key_map``
inverted) into two folders in their layout (a SetDLM with D = 4 and a BD3LM with S = 4), and loaded by both
sides from those files: setdlm by :func:`setdlm.formats.convert.load_reference`, theirs by
``benchmarks/official_worker.py`` (their ``SetDLM`` / ``BD3LM`` denoiser around their DiT) in a subprocess of
the other environment. Decoding: greedy, threshold off (one token per forward), ``--new`` tokens after
``--prompt-len``-token prompts, stopping off on setdlm's side; SetDLM with window w = 4, BD3LM with S = 4
aligned blocks. The greedy tokens of both must be identical for every prompt (else the script stops). Timing:
batch 1 and batch B (setdlm decodes the B rows together; their ``generate`` takes one sequence, so their batch B
is B decodes in a row), each configuration warmed up once, then ``--repeats`` rounds alternating setdlm and
theirs, best time kept; both at ``--threads`` torch threads; then (SetDLM folder) the raw forward of each DiT
on the same ids at batch 1 (no cache, full attention; w + 1 and prompt + new positions), alternated. Their
progress bars are off (``disable_pbar=True``, as their evaluation scripts run it off rank 0).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from setdlm import Model
from setdlm.formats.convert import load_reference, reference_key_map
from setdlm.decoding import generate
from setdlm.model import Transformer, TransformerConfig

WORKER = Path(__file__).with_name("official_worker.py")


def spread_init(sd: dict[str, torch.Tensor], d: int, seed: int) -> None:
    """Re-draw the weights in place at the scales of the reference fixture (tests/fixtures/reference-dit-tiny,
    its config's ``init``): a trained-model-like spread, so that greedy decoding depends on the context. At the
    training init (std 0.02) the random DiT's greedy output is one token everywhere and the token check is empty."""
    g = torch.Generator().manual_seed(seed + 1000)
    std = {"embed.weight": 1.0, "head.weight": 0.5, "head.bias": 0.1, "attn_qkv.weight": 2 / d ** 0.5,
           "attn_out.weight": 2 / d ** 0.5, "mlp.0.weight": 1 / d ** 0.5, "mlp.2.weight": 1 / (4 * d) ** 0.5}
    for name, w in sd.items():
        if name.endswith(("norm1.weight", "norm2.weight", "norm_final.weight")):
            w.copy_(1 + 0.1 * torch.randn(w.shape, generator=g))
        elif (key := next((k for k in std if name.endswith(k)), None)) is not None:
            w.copy_(std[key] * torch.randn(w.shape, generator=g))


def write_reference_folders(out: Path, *, V: int, d: int, heads: int, layers: int, L: int, D: int, S: int,
                            seed: int) -> dict[str, Path]:
    """One random DiT saved twice in the authors' layout: ``setdlm`` (StaggeredNoise, D) and ``bd3lm`` (S)."""
    torch.manual_seed(seed)
    ours = Transformer(TransformerConfig(vocab_size=V, hidden_size=d, n_heads=heads, n_layers=layers)).state_dict()
    spread_init(ours, d, seed)
    theirs = {k: ours[v].contiguous() for k, v in reference_key_map(layers).items()}
    backbone = {"_target_": "src.backbone.dit.DIT", "length": L, "causal_attention": False, "adaln": False,
                "hidden_size": d, "cond_dim": 128, "n_heads": heads, "num_layers": layers, "dropout": 0.0,
                "tie_word_embeddings": True, "attn_backend": "sdpa", "vocab_size": V, "block_size": L,
                "pretrained_model_name_or_path": None}
    ids = {"vocab_size": V, "mask_token_id": V - 1, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
           "length": L}
    configs = {
        "setdlm": {**ids, "architectures": ["SetDLM"], "block_size": L, "backbone_config": backbone,
                   "noise_config": {"_target_": "src.noise_schedule.noise_schedules.StaggeredNoise", "eps": 1e-3,
                                    "block_size": L, "desired_block_size": D, "max_block_size": min(2 * D, L),
                                    "length": L}},
        "bd3lm": {**ids, "architectures": ["BD3LM"], "block_size": S,
                  "backbone_config": {**backbone, "block_size": S},
                  "noise_config": {"_target_": "src.noise_schedule.noise_schedules.LinearNoise"}},
    }
    folders = {}
    for family, cfg in configs.items():
        folder = out / f"probe-dit-{family}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(cfg, indent=1))
        save_file(theirs, str(folder / "model.safetensors"))
        folders[family] = folder
    return folders


class Official:
    """The authors' sampler in its own environment, one request per JSON line (benchmarks/official_worker.py)."""

    def __init__(self, python: str, src: str, spec: dict, threads: int):
        env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": str(threads)}
        self.proc = subprocess.Popen([python, str(WORKER), json.dumps(spec), str(threads)], cwd=src, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if not json.loads(self.proc.stdout.readline() or "{}").get("ready"):
            raise SystemExit("the official worker did not start (see its error above)")

    def ask(self, **req) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("the official worker stopped (see its error above)")
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--official-src", required=True, help="checkout of kuleshov-group/setdlms")
    ap.add_argument("--official-python", required=True, help="python of the environment holding their deps")
    ap.add_argument("--out", default="/tmp/official-sampler", help="folder for the two checkpoints")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--families", nargs="+", default=["setdlm", "bd3lm"], choices=["setdlm", "bd3lm"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    V, d, heads, layers, L, D, S = 4096, 256, 4, 4, 256, 4, 4
    folders = write_reference_folders(Path(args.out), V=V, d=d, heads=heads, layers=layers, L=L, D=D, S=S,
                                      seed=args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    prompts = [[1] + torch.randint(3, V - 1, (args.prompt_len - 1,), generator=g).tolist() for _ in range(args.batch)]
    rows = []
    for family in args.families:
        backbone, fam = load_reference(folders[family])
        model = Model(backbone.eval(), fam)
        knobs = {"window": D} if family == "setdlm" else {}
        spec = {"family": family, "vocab_size": V, "length": L, "hidden_size": d, "n_heads": heads,
                "num_layers": layers, "D": D, "S": S, "window": D,
                "weights": str(folders[family] / "model.safetensors")}
        official = Official(args.official_python, args.official_src, spec, args.threads)

        def ours(batch):
            return generate(model, batch, max_new_tokens=args.new, threshold=None, ignore_eos=True, **knobs).tokens

        mine, theirs = ours(prompts), official.ask(op="decode", prompts=prompts, max_new_tokens=args.new)["tokens"]
        same = sum(a == b for a, b in zip(mine, theirs))
        print(f"{family}: greedy tokens identical for {same}/{len(prompts)} prompts "
              f"({len({t for row in mine for t in row})} distinct tokens among {sum(map(len, mine))})", flush=True)
        if same != len(prompts):
            first = next(i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b)
            raise SystemExit(f"{family}: tokens differ on prompt {first}:\n ours   {mine[first]}\n"
                             f" theirs {theirs[first]}")
        for B in (1, args.batch):
            batch = prompts[:B]
            best = {"setdlm": float("inf"), "official": float("inf")}
            ours(batch), official.ask(op="time", prompts=batch, max_new_tokens=args.new, reps=1)  # warm-up
            for r in range(args.repeats):
                for who in (("setdlm", "official") if r % 2 == 0 else ("official", "setdlm")):
                    if who == "setdlm":
                        t0 = time.perf_counter()
                        ours(batch)
                        best[who] = min(best[who], time.perf_counter() - t0)
                    else:
                        secs = official.ask(op="time", prompts=batch, max_new_tokens=args.new, reps=1)["seconds"]
                        best[who] = min(best[who], secs[0])
            n = B * args.new
            rows.append((family, B, n / best["setdlm"], n / best["official"]))
            print(f"{family} batch {B}: setdlm {n / best['setdlm']:.1f} tok/s, official "
                  f"{n / best['official']:.1f} tok/s, {best['official'] / best['setdlm']:.2f}x", flush=True)
        if family == "setdlm":  # the raw forward of both DiTs on the same ids: where a batch-1 step's time goes
            for T in (D + 1, args.prompt_len + args.new):  # a SetDLM step's w + 1 queries; a whole row
                ids = [(prompts[0] + mine[0])[:T]]  # the prompt and its decoded tokens
                x, pos = torch.tensor(ids), torch.arange(T)[None]
                best = {"setdlm": float("inf"), "official": float("inf")}
                for r in range(args.repeats + 1):  # the first round warms up
                    t0 = time.perf_counter()
                    with torch.no_grad():
                        for _ in range(50):
                            model.backbone(x, pos)
                    ours_ms = (time.perf_counter() - t0) / 50 * 1e3
                    theirs_ms = official.ask(op="forward", ids=ids, calls=50)["ms"]
                    if r:
                        best = {"setdlm": min(best["setdlm"], ours_ms), "official": min(best["official"], theirs_ms)}
                print(f"raw DiT forward, batch 1, {T} positions, no cache: setdlm {best['setdlm']:.2f} ms, official "
                      f"{best['official']:.2f} ms", flush=True)
        official.close()
    print("\n| family | batch | setdlm tok/s | official tok/s | setdlm / official |\n|---|---:|---:|---:|---:|")
    for family, B, a, b in rows:
        print(f"| {'SetDLM w=4' if family == 'setdlm' else 'BD3LM S=4'} | {B} | {a:.1f} | {b:.1f} | {a / b:.2f}x |")


if __name__ == "__main__":
    main()
