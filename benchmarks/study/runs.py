"""The small-scale reproduction study: which models it trains and with which commands.

Two datasets, six families each, same backbone size and the same training tokens within a dataset
(same steps × batch × L): AR, MDLM, BD3LM S=4 and S=8, SetDLM S≤8 (D=4, M=8) and S≤16 (D=8, M=16).

* ``lm``     — the built-in Shakespeare corpus without the paragraphs of held-out infilling windows
  (``shakespeare-train``), byte-level BPE (2048), L = 128, d = 192, 4 layers.
* ``reason`` — the built-in arithmetic word problems (medium level), characters, L = 192, d = 128,
  4 layers; prompt = question (context, never in the loss), completion = worked solution + ``#### n``.

Every run is one ``setdlm train`` command (printed by ``python benchmarks/study/study.py commands``).
"""

from __future__ import annotations

from pathlib import Path

FAMILIES = {  # name -> family flags
    "ar": ["--family", "ar"],
    "mdlm": ["--family", "mdlm", "--block-size", "{L}"],
    "bd3lm-s4": ["--family", "bd3lm", "--block-size", "4"],
    "bd3lm-s8": ["--family", "bd3lm", "--block-size", "8"],
    "setdlm-smax8": ["--family", "setdlm", "--D", "4", "--M", "8"],
    "setdlm-smax16": ["--family", "setdlm", "--D", "8", "--M", "16"],
}

COMMON = ["--batch-size", "32", "--lr-schedule", "cosine", "--min-lr-ratio", "0.1", "--warmup", "100",
          "--bf16", "--seed", "0", "--save-every", "100", "--eval-every", "300", "--eval-max", "512",
          "--log-every", "20"]

DATASETS = {
    "lm": dict(L=128, steps=600, args=["--data", "shakespeare-train", "--tokenizer", "bpe", "--vocab-size", "2048",
                                        "--length", "128", "--hidden-size", "192", "--n-layers", "4",
                                        "--n-heads", "4", "--lr", "1e-3"]),
    "reason": dict(L=192, steps=1500, args=["--data", "{reason_data}", "--tokenizer", "char", "--length", "192",
                                            "--hidden-size", "128", "--n-layers", "4", "--n-heads", "4",
                                            "--lr", "2e-3"]),
}

# AR-to-SetDLM adaptation (issue: start from the AR checkpoint our trainer produced, fine-tune it as a
# SetDLM S<=8 for a short budget): architecture and tokenizer come from the AR run
ADAPT = {"setdlm-smax8-from-ar": dict(init="ar", steps=300, args=["--family", "setdlm", "--D", "4", "--M", "8",
                                                                 "--lr", "5e-4", "--warmup", "20"])}

# training order: the AR reasoning model first (its accuracy decides whether the level is right)
ORDER = [("reason", "ar"), ("lm", "ar")] + [(d, f) for d in ("reason", "lm") for f in FAMILIES if f != "ar"] \
    + [("reason", "setdlm-smax8-from-ar")]


def steps_of(dataset: str, family: str) -> int:
    return ADAPT[family]["steps"] if family in ADAPT else DATASETS[dataset]["steps"]


def train_command(dataset: str, family: str, out: str, reason_data: str) -> list[str]:
    spec = DATASETS[dataset]
    if family in ADAPT:
        a = ADAPT[family]
        init = str(Path(out).parent / f"{dataset}-{a['init']}")  # the AR run of the same dataset
        data = ["--data", reason_data if dataset == "reason" else "shakespeare-train", "--length", str(spec["L"])]
        i = COMMON.index("--warmup")
        common = COMMON[:i] + COMMON[i + 2:]  # the adaptation sets its own warmup
        return ["setdlm", "train", "--out", out, "--init-from", init, *data, *a["args"], "--steps", str(a["steps"]),
                *common]
    fam = [a.format(L=spec["L"]) for a in FAMILIES[family]]
    data = [a.format(reason_data=reason_data) for a in spec["args"]]
    return ["setdlm", "train", "--out", out, *data, *fam, "--steps", str(spec["steps"]), *COMMON]
