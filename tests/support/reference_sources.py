"""The reference-dit-tiny fixture reached every way a user reaches the authors' checkpoints (shared by the
parity tests, so that each parity check runs on each path):

* ``fixture``   — :func:`setdlm.formats.convert.load_reference` on the fixture folder;
* ``detected``  — ``setdlm.load(FIX, tokenizer=...)``: the authors' layout detected and converted on the fly;
* ``converted`` — ``setdlm convert --from-reference FIX OUT --tokenizer DIR`` (the CLI), then ``setdlm.load(OUT)``;
* ``hf-layout`` — the same weights in the layout of the released Hub repos: ``config.json`` with
  ``backbone_config`` / ``noise_config`` (``max_block_size`` = L, as exported configs may carry),
  ``pytorch_model.bin`` and the tokenizer files, loaded with ``setdlm.load``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer as Backend
from tokenizers import models, pre_tokenizers

import setdlm
from setdlm.cli import main as cli
from setdlm.formats.convert import load_reference
from setdlm.data.tokenizers import Tokenizer

FIX = Path(__file__).parents[1] / "fixtures" / "reference-dit-tiny"
SOURCES = ("fixture", "detected", "converted", "hf-layout")


def tokenizer_folder(folder: Path) -> Path:
    """A 64-token word-level tokenizer matching the fixture: <pad>, <s>, </s>, w0..w59, [MASK] = 63."""
    words = ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(60)] + ["[MASK]"]
    backend = Backend(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    Tokenizer(backend, kind="hf", bos="<s>", eos="</s>", pad="<pad>", mask="[MASK]").save(folder)
    return folder


def hf_layout(folder: Path) -> Path:
    """The fixture rewritten as a released Hub repo of the authors (config, pytorch_model.bin, tokenizer)."""
    cfg = json.loads((FIX / "config.json").read_text())
    folder.mkdir(parents=True)
    bb = {**cfg["backbone_config_passed"], "_target_": "backbone_dit.DIT"}
    noise = {k: v for k, v in cfg["setdlm"]["noise"].items() if k != "class"}
    noise.update(_target_="noise_schedule_noise_schedules.StaggeredNoise", max_block_size=cfg["length"])
    hf = {"architectures": ["SetDLM"], "model_type": "setdlm", "length": cfg["length"], "block_size": cfg["length"],
          "vocab_size": cfg["vocab_size"], "mask_token_id": cfg["mask_token_id"], "pad_token_id": 0,
          "bos_token_id": 1, "eos_token_id": 2, "backbone_config": bb, "noise_config": noise,
          "auto_map": {"AutoModelForMaskedLM": "setdlm.SetDLM"}}
    (folder / "config.json").write_text(json.dumps(hf, indent=1))
    torch.save(load_file(str(FIX / "setdlm_tiny.safetensors")), folder / "pytorch_model.bin")
    tokenizer_folder(folder)
    return folder


def reference_model(source: str, tmp: Path):
    """(backbone, family) of the fixture's weights reached through ``source``."""
    if source == "fixture":
        return load_reference(FIX)
    tok = tokenizer_folder(tmp / "tokenizer")
    if source == "detected":
        model = setdlm.load(FIX, tokenizer=str(tok))
    elif source == "converted":
        assert cli(["convert", "--from-reference", str(FIX), str(tmp / "converted"), "--tokenizer", str(tok)]) == 0
        model = setdlm.load(tmp / "converted")
    else:
        model = setdlm.load(hf_layout(tmp / "hub-repo"))
    assert model.tokenizer.mask_token_id == 63 and model.tokenizer.vocab_size == 64
    return model.backbone, model.family


def copy_fixture(folder: Path) -> Path:
    shutil.copytree(FIX, folder)
    return folder
