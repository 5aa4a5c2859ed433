"""The small trained models shipped inside the package (the embedded default).

They come from the reproduction study (``benchmarks/study``; ``benchmarks/RESULTS.md`` lists the command
that trained each) and are stored in bf16 under ``setdlm/pretrained/<name>/`` in the ordinary checkpoint
layout, so ``setdlm.load`` (:func:`setdlm.formats.loading.load`) reads them by name like any other checkpoint:

======================================  ========================================================
``shakespeare-setdlm-smax8``            SetDLM S≤8 (D=4, M=8) on the built-in Shakespeare (BPE)
``shakespeare-bd3lm-s4``                BD3LM S=4, same data and budget
``shakespeare-ar``                      AR, same data and budget
``arith-setdlm-smax8``                  SetDLM S≤8 on the medium arithmetic word problems (characters)
``arith-bd3lm-s4`` / ``arith-ar``       the baselines of the same task
``arith-setdlm-smax8-ar``               ``arith-setdlm-smax8`` with a next-token head (``ar_weight``, 1000 steps)
======================================  ========================================================

``setdlm generate`` and ``setdlm infill`` use ``shakespeare-setdlm-smax8`` when no checkpoint is given.
:func:`available` lists the names, :func:`describe` what each is (``setdlm models`` prints it), and
:func:`closest` the name a mistyped one was probably meant to be. The word-problem models read a question
followed by a newline, as they were trained: their tokenizer adds it to a prompt that lacks it
(``prompt_end``, :func:`setdlm.data.prompt.encode_prompt`).
"""

from __future__ import annotations

import difflib
import json
from importlib import resources
from pathlib import Path

from ..errors import UserError

# a shipped model's training text -> the task it does, in words
TASKS = {"shakespeare-train": "Shakespeare text (continue, infill)",
         "reasoning-medium": "arithmetic word problems (question, then newline)"}

DEFAULT = "shakespeare-setdlm-smax8"


def root() -> Path:
    return Path(str(resources.files("setdlm"))) / "pretrained"


def available() -> list[str]:
    r = root()
    return sorted(p.name for p in r.iterdir() if (p / "config.json").is_file()) if r.is_dir() else []


def path(name: str = DEFAULT) -> Path:
    """The folder of a shipped model; a clear error naming the choices when it is not there."""
    p = root() / name
    if not (p / "config.json").is_file():
        have = ", ".join(available()) or "none in this installation"
        near = closest(name)
        hint = f"did you mean {near!r}? " if near else ""
        raise UserError(f"no shipped model {name!r}; {hint}shipped models: {have}")
    return p



def describe(name: str) -> dict:
    """What the shipped model ``name`` is: ``name``, ``parameters`` (count), ``size`` (MiB on disk),
    ``family`` (with its sizes, e.g. ``setdlm D=4 M=8``), ``task`` and ``context`` (L, tokens)."""
    folder = path(name)
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    with (folder / "model.safetensors").open("rb") as f:  # the header alone: each tensor's shape
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    count = 0
    for key, t in header.items():
        if key != "__metadata__":
            n = 1
            for d in t["shape"]:
                n *= d
            count += n
    fam = cfg["family"]
    sizes = " ".join(f"{k}={fam[k]:g}" for k in ("D", "M", "block_size", "ar_weight") if fam.get(k))
    data = (cfg.get("training") or {}).get("data")
    return {"name": name, "parameters": count, "size": sum(f.stat().st_size for f in folder.iterdir()) / 2**20,
            "family": f"{fam['family']} {sizes}".strip(), "task": TASKS.get(data, data) if data else "?",
            "context": fam["length"]}


def drafters_root() -> Path:
    return Path(str(resources.files("setdlm"))) / "drafters"


def drafters() -> list[str]:
    """The set drafters shipped inside the package (docs/drafter.md): each loads over its base by name."""
    r = drafters_root()
    return sorted(p.name for p in r.iterdir() if (p / "config.json").is_file()) if r.is_dir() else []


def describe_drafter(name: str) -> dict:
    """:func:`describe` for a shipped drafter: its own parameters and size, the base it drafts for."""
    folder = drafters_root() / name
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    d = cfg["drafter"]
    per_layer = d["hidden_size"] * (2 * d["n_heads"] + 2 * d["n_kv_heads"]) * d["head_dim"] + \
        3 * d["hidden_size"] * d["intermediate_size"] + 2 * d["hidden_size"]
    count = d["n_layers"] * per_layer + len(d["feature_layers"]) * d["hidden_size"] ** 2 + 2 * d["hidden_size"]
    return {"name": name, "parameters": count, "size": sum(f.stat().st_size for f in folder.iterdir()) / 2**20,
            "family": f"ar + set drafter w={d['window']}", "task": f"drafts for {cfg['base']} (speculate='next_token')",
            "context": "base's"}


def table() -> str:
    """The shipped models and drafters as aligned text lines, one per model under a header (``setdlm models``)."""
    rows = [("NAME", "PARAMETERS", "SIZE", "FAMILY", "CONTEXT", "TASK")]
    for d in [*map(describe, available()), *map(describe_drafter, drafters())]:
        rows.append((d["name"], f"{d['parameters'] / 1e6:.2f}M", f"{d['size']:.1f} MiB", d["family"],
                     str(d["context"]), d["task"]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows)


def closest(name: str, others: tuple[str, ...] = ()) -> str | None:
    """The shipped model name (or one of ``others``, e.g. packaged GGUF models) nearest to ``name``, when one is
    near enough to be a typo of it; else None."""
    match = difflib.get_close_matches(name, [*available(), *drafters(), *others], n=1, cutoff=0.75)
    return match[0] if match else None
