"""Checkpoints in a Hugging Face-style folder, written atomically and never pickled (docs/method.md §9.3, §9.5).

A checkpoint folder holds::

    config.json            architecture (TransformerConfig), family (FamilyConfig), tokenizer info, training args
    model.safetensors      the weights
    ema.safetensors        EMA weights (when training kept them)
    tokenizer.json         the tokenizer (+ tokenizer_config.json naming its special tokens)
    training_state.json    step, data position, optimizer hyper-parameters, ... (to resume training)
    optimizer.safetensors  the optimizer's tensors (AdamW moments)
    sharded/               instead of the three files of tensors: an FSDP run's sharded checkpoint
                           (torch.distributed.checkpoint), converted by setdlm export

    README.md              a model card: family, schedule, training data, results (Hugging Face Hub ready)

The backbone is one format of :data:`setdlm.formats.backbones.REGISTRY` (``"backbone"``): the setdlm DiT
(``"dit"``, ``architecture`` = :class:`~setdlm.model.TransformerConfig`) or a Hugging Face causal LM behind
:class:`setdlm.formats.hf.HFBackbone` (``"hf"``, ``architecture`` = its ``transformers`` config; weights under the
backbone's own names, tied embeddings stored once).

The folder is written atomically (:mod:`setdlm.formats.atomic`): a crash, even SIGKILL, leaves either the previous
checkpoint or the new one, never half of one. A training run keeps its checkpoints as
``RUN/checkpoints/step-NNNNNNNN`` and a ``RUN/latest`` pointer (replaced atomically);
:func:`setdlm.formats.layout.resolve` accepts the run folder too. The other concerns have their own modules: file
names and reading config.json's fields (:mod:`~setdlm.formats.layout`), pickle refusal and safetensors checks
(:mod:`~setdlm.formats.safety`), the optimizer's state (:mod:`~setdlm.formats.optim_state`), the model card
(:mod:`~setdlm.formats.card`). This module knows only this format; resolving a name (a shipped model, a Hub id,
the authors' layout, a GGUF file) is :func:`setdlm.formats.loading.load` (docs/pretrained.md).

Every loading error is a ``ValueError`` naming the file and the problem: a missing file, invalid JSON, a
truncated or corrupt safetensors file, tensors that do not match the config, a tokenizer whose vocabulary
does not match the model, or a config of another family than the one expected.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor

from ..data.tokenizers import TOKENIZER_FILE, load_tokenizer
from ..errors import UserError
from ..family import FamilyConfig
from .atomic import write_folder
from .backbones import Architecture, check_model_size, expected_shapes, format_named, format_of, load_weights, \
    unique_state_dict
from .card import model_card
from .hub import push_folder
from .layout import CARD, CONFIG, EMA_WEIGHTS, FORMAT, FORMAT_VERSION, OPTIMIZER, SHARDED, STATE, WEIGHTS, \
    check_fields, read_json, resolve
from .optim_state import flatten_optimizer_state
from .safety import read_tensors


# ---------------------------------------------------------------------------------------------------------
# save
# ---------------------------------------------------------------------------------------------------------


def _contiguous(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.detach().contiguous().cpu() for k, v in sd.items()}


def model_config_dict(model, training_args: dict | None = None, source: dict | None = None) -> dict:
    backbone = model.backbone
    fmt = format_of(backbone)
    tok = model.tokenizer
    cfg = {"format": FORMAT, "format_version": FORMAT_VERSION, "backbone": fmt.name,
           "architecture": fmt.to_dict(backbone), "family": model.family.to_dict(),
           "tokenizer": tok.info() if hasattr(tok, "info") else None,
           "dtype": str(next(backbone.parameters()).dtype).removeprefix("torch."),
           "training": training_args}
    if source is not None:
        cfg["source"] = source
    return cfg


def save(path: str | Path, model, *, ema: dict[str, Tensor] | None = None,
         training_args: dict | None = None, training_state: dict | None = None,
         optimizer_state: dict | None = None, source: dict | None = None, bench=None,
         push_to_hub: str | None = None, private: bool | None = None, token: str | None = None,
         commit_message: str | None = None) -> Path:
    """Write ``model`` (a :class:`setdlm.lm.Model`: its ``backbone``, ``family`` and ``tokenizer``) as a
    checkpoint folder at ``path`` atomically (see the module docstring), with a model card
    (``README.md``; ``bench``: a results table, see :func:`setdlm.formats.hub.model_card`). Returns ``path``.

    ``push_to_hub="user/repo"`` then uploads the folder to the Hugging Face Hub (needs ``huggingface_hub``,
    network and a token; ``private``, ``token``, ``commit_message`` go to the upload). The optimizer state
    is not uploaded. ``source``: where the weights came from (recorded in config.json, e.g. by convert).
    """
    dst = Path(path)
    if getattr(model.backbone, "quantization", None):
        raise UserError(f"a {model.backbone.quantization}-quantized backbone decodes only and is not saved; "
                        "save the model loaded without quantize=")
    if model.tokenizer is None or not hasattr(model.tokenizer, "save"):
        raise UserError("a checkpoint needs the model's tokenizer (a setdlm.data.Tokenizer); model.tokenizer is "
                        f"{type(model.tokenizer).__name__}")
    config = model_config_dict(model, training_args, source)
    config["ema"] = ema is not None
    weights = unique_state_dict(model.backbone)

    def fill(tmp: Path) -> None:
        save_file(_contiguous(weights), str(tmp / WEIGHTS), metadata={"format": "pt"})
        if ema is not None:
            save_file(_contiguous({k: ema[k] for k in weights}), str(tmp / EMA_WEIGHTS), metadata={"format": "pt"})
        state = training_state
        if optimizer_state is not None:
            tensors, meta = flatten_optimizer_state(optimizer_state)
            save_file(tensors, str(tmp / OPTIMIZER), metadata={"format": "pt"})
            state = {**(training_state or {}), "optimizer": meta}
        write_description(tmp, model, config, state, bench=bench, repo_id=push_to_hub)

    write_folder(dst, fill)
    if push_to_hub is not None:
        push_folder(dst, push_to_hub, private=private, token=token, commit_message=commit_message)
    return dst


def write_description(folder: Path, model, config: dict, training_state: dict | None, *, bench=None,
                      repo_id: str | None = None) -> None:
    """The files of a checkpoint besides its tensors: tokenizer, ``training_state.json``, ``config.json`` and
    the model card."""
    model.tokenizer.save(folder)
    if training_state is not None:
        (folder / STATE).write_text(json.dumps(training_state, indent=2) + "\n", encoding="utf-8")
    (folder / CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (folder / CARD).write_text(model_card(config, bench=bench, repo_id=repo_id), encoding="utf-8")


# ---------------------------------------------------------------------------------------------------------
# load
# ---------------------------------------------------------------------------------------------------------


def read_config(folder: str | Path) -> dict:
    path = resolve(folder) / CONFIG
    cfg = read_json(path, "not a setdlm checkpoint folder")
    if not isinstance(cfg, dict) or cfg.get("format") != FORMAT:
        hint = ("it is a Hugging Face causal LM: load it with setdlm.formats.hf.load_pretrained, or train from it "
                "with init_from" if isinstance(cfg, dict) and "model_type" in cfg
                else "Hugging Face models load through setdlm.formats.hf")
        raise UserError(f"{path}: not a setdlm config (no \"format\": \"setdlm\"); {hint}", fields=("init_from",))
    for key in ("architecture", "family"):
        if not isinstance(cfg.get(key), dict):
            raise UserError(f"{path}: missing the {key!r} section")
    return cfg


def parse_configs(folder: Path, cfg: dict, family: str | None = None) -> tuple[Architecture, FamilyConfig]:
    """(architecture, family) of a config: a :class:`TransformerConfig` for the DiT, the ``transformers`` config
    dict for an HF backbone."""
    path = folder / CONFIG
    fmt = format_named(cfg, path)
    fmt.check(path, cfg["architecture"])
    check_fields(path, "family", cfg["family"], FamilyConfig)
    try:
        arch = fmt.from_dict(cfg["architecture"])
    except (TypeError, ValueError) as e:
        raise UserError(f"{path}: bad architecture: {e}") from None
    vocab = fmt.vocab_size(arch)
    if not isinstance(vocab, int) or vocab < 1:
        raise UserError(f"{path}: the architecture records no vocab_size")
    try:
        fam = FamilyConfig.from_dict(cfg["family"])
    except (TypeError, ValueError) as e:
        raise UserError(f"{path}: bad family config: {e}") from None
    if family is not None and fam.family != family:
        raise UserError(f"{path}: a {fam.family!r} model, but a {family!r} model was expected")
    if not 0 <= fam.mask_token_id < vocab:
        raise UserError(f"{path}: mask_token_id {fam.mask_token_id} is outside the vocabulary of {vocab}")
    return arch, fam


def load_checkpoint_tokenizer(folder: Path, cfg: dict, vocab_size: int, fam: FamilyConfig):
    path = folder / TOKENIZER_FILE
    if not path.is_file():
        raise UserError(f"{path}: missing (the checkpoint's tokenizer)")
    tok = load_tokenizer(folder)
    if cfg.get("training") and not _records_prompt(folder):  # trained by setdlm before the convention was saved
        tok.prompt = "bos"
    recorded = (cfg.get("tokenizer") or {}).get("vocab_size")
    if recorded is not None and tok.vocab_size != recorded:
        raise UserError(f"{path}: vocabulary of {tok.vocab_size} tokens, but config.json records {recorded}")
    if tok.vocab_size > vocab_size:
        raise UserError(f"{path}: vocabulary of {tok.vocab_size} tokens does not fit the model's "
                        f"vocab_size {vocab_size}")
    if tok.mask_token_id != fam.mask_token_id:
        raise UserError(f"{path}: MASK token id {tok.mask_token_id} differs from the family's mask_token_id "
                        f"{fam.mask_token_id}")
    return tok


def _records_prompt(folder: Path) -> bool:
    """Does the folder's tokenizer_config.json record the prompt convention (``setdlm_prompt``)?"""
    try:
        return "setdlm_prompt" in json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


class Stored(typing.NamedTuple):
    """What a checkpoint folder holds for decoding; ``setdlm.lm.Model(*stored)`` is the ready model (this
    module stays below :mod:`setdlm.lm`, whose ``Model.save`` writes through :func:`save`)."""

    backbone: torch.nn.Module  # in eval mode
    family: FamilyConfig
    tokenizer: object | None


def read(folder: str | Path, *, ema: bool = False, family: str | None = None, device=None,
         dtype: torch.dtype | None = None, config: dict | None = None) -> Stored:
    """The backbone (eval mode), family and tokenizer stored in checkpoint ``folder`` (this module's format).

    ``ema=True``: the EMA weights. ``family``: the family you expect (an error otherwise). ``dtype``: cast the
    weights (weights stored in bf16/fp16 load as float32 unless given). ``config``: the folder's
    ``config.json`` when the caller has already read it (:func:`read_config`), so it is read once.
    Names (shipped models, Hub ids, the authors' layout, GGUF) are resolved, and the
    :class:`~setdlm.lm.Model` built, by :func:`setdlm.formats.loading.load`.
    """
    folder = Path(folder)
    cfg = read_config(folder) if config is None else config
    arch, fam = parse_configs(folder, cfg, family)
    fmt = format_named(cfg)
    vocab = fmt.vocab_size(arch)
    assert isinstance(vocab, int)  # parse_configs checked it
    check_model_size(folder / CONFIG, fmt, arch, device)
    tok = load_checkpoint_tokenizer(folder, cfg, vocab, fam)
    backbone = fmt.build(arch, None)
    file = folder / (EMA_WEIGHTS if ema else WEIGHTS)
    if not file.exists() and (folder / SHARDED).is_dir():
        raise UserError(f"{folder}: a sharded checkpoint of an FSDP run; convert it to one file first: "
                         f"setdlm export {folder}")
    sd = read_tensors(file, expected_shapes(backbone), " (this checkpoint kept no EMA weights)" if ema else "")
    saved = sd[next(iter(sd))].dtype
    backbone.to(saved)
    load_weights(backbone, sd)
    if dtype is None and saved in (torch.bfloat16, torch.float16):
        dtype = torch.float32  # half-precision storage is for size (the shipped models): compute in float32
    backbone.to(device=device, dtype=dtype)
    return Stored(backbone.eval(), fam, tok)
