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

The backbone is the setdlm DiT (``"backbone": "dit"``, ``architecture`` = :class:`TransformerConfig`) or a
Hugging Face causal LM behind :class:`setdlm.formats.hf.HFBackbone` (``"backbone": "hf"``, ``architecture`` = its
``transformers`` config; weights under the backbone's own names, tied embeddings stored once).

A folder is first written under a temporary name next to its destination and then renamed, so a crash
(even SIGKILL) leaves either the previous checkpoint or the new one, never half of one; the hidden temporary
folder such a crash leaves is removed by the next write to that destination (:func:`remove_partial`). A
training run keeps its checkpoints as ``RUN/checkpoints/step-NNNNNNNN`` and a ``RUN/latest`` pointer
(replaced atomically); :func:`resolve` accepts the run folder too. This module knows only this format; resolving a name
(a shipped
model, a Hub id, the authors' layout, a GGUF file) is :func:`setdlm.formats.loading.load` (docs/pretrained.md).

Every loading error is a ``ValueError`` naming the file and the problem: a missing file, invalid JSON, a
truncated or corrupt safetensors file, tensors that do not match the config, a tokenizer whose vocabulary
does not match the model, or a config of another family than the one expected.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import socket
import tempfile
import typing
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor

from ..data.tokenizers import TOKENIZER_FILE, load_tokenizer
from ..errors import UserError
from ..family import FamilyConfig
from ..model import TransformerConfig, Transformer
from ..outputs import umask
from ..resources import check_fits
from .hf import config_dict, backbone_from_config
from .hub import push_folder, model_card

CONFIG, WEIGHTS, EMA_WEIGHTS, CARD = "config.json", "model.safetensors", "ema.safetensors", "README.md"
STATE, OPTIMIZER, LATEST = "training_state.json", "optimizer.safetensors", "latest"
SHARDED = "sharded"  # the torch.distributed.checkpoint folder of an FSDP run's checkpoint (setdlm.training.sharded)
FORMAT, FORMAT_VERSION = "setdlm", 1


# ---------------------------------------------------------------------------------------------------------
# atomic writes
# ---------------------------------------------------------------------------------------------------------


def _fsync_tree(folder: Path) -> None:
    for p in folder.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def is_checkpoint(folder: Path) -> bool:
    try:
        return json.loads((Path(folder) / CONFIG).read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def partial_folder(dst: Path, tag: str) -> Path:
    """The name of a temporary folder that becomes ``dst`` once complete: hidden, next to it, naming this
    host and process (``.NAME.TAG-HOST-PID``), so that :func:`remove_partial` knows when its writer is gone."""
    return dst.with_name(f".{dst.name}.{tag}-{socket.gethostname()}-{os.getpid()}")


def remove_partial(dst: Path) -> None:
    """Remove the temporary folders of writes into ``dst`` whose process was killed halfway (SIGKILL, power
    loss): never a checkpoint (a complete one is renamed into place), and never the folder of a process
    still running on this host, or of another host."""
    host = socket.gethostname()
    for tmp in [*dst.parent.glob(f".{dst.name}.*"), *dst.parent.glob(f"..{dst.name}.*")]:
        m = re.fullmatch(rf"\.?\.{re.escape(dst.name)}\.[a-z]+-{re.escape(host)}-(\d+)(?:-.*|\.tmp-.*)?", tmp.name)
        if m is not None and not _alive(int(m.group(1))):
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _commit_dir(tmp: Path, dst: Path, replaceable=is_checkpoint) -> None:
    """Move the finished folder ``tmp`` to ``dst``; an existing folder at ``dst`` that ``replaceable`` accepts (a
    checkpoint) is replaced."""
    if dst.exists():
        if not replaceable(dst):
            raise UserError(f"refusing to overwrite {str(dst)!r}: it exists and is not a setdlm checkpoint")
        old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
        os.replace(dst, old)
        os.replace(tmp, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, dst)


# ---------------------------------------------------------------------------------------------------------
# save
# ---------------------------------------------------------------------------------------------------------


def _contiguous(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.detach().contiguous().cpu() for k, v in sd.items()}


def is_hf_backbone(backbone) -> bool:
    return type(backbone).__name__ == "HFBackbone" and hasattr(backbone, "hf")


def unique_state_dict(module: torch.nn.Module) -> dict[str, Tensor]:
    """``module.state_dict()`` without aliases: a tensor reachable under several names (tied input and
    output embeddings) is kept under its first name only, as safetensors requires."""
    out, seen = {}, set()
    for k, v in module.state_dict().items():
        key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape), v.stride())
        if v.numel() and key in seen:
            continue
        seen.add(key)
        out[k] = v
    return out


def expected_shapes(module: torch.nn.Module) -> dict[str, tuple]:
    return {k: tuple(v.shape) for k, v in unique_state_dict(module).items()}


def load_weights(module: torch.nn.Module, sd: dict[str, Tensor]) -> None:
    """Load ``sd`` (alias-free, as :func:`unique_state_dict` makes it) into ``module``; names and shapes
    must match exactly, aliases follow the tensor they share."""
    expected = expected_shapes(module)
    missing, extra = [k for k in expected if k not in sd], [k for k in sd if k not in expected]
    if missing or extra:
        raise UserError(f"weights do not match the model (missing {missing[:3]}, unexpected {extra[:3]})")
    result = module.load_state_dict(sd, strict=False)
    aliases = set(module.state_dict()) - set(expected)
    if set(result.missing_keys) != aliases or result.unexpected_keys:
        raise UserError(f"weights left unset: {sorted(set(result.missing_keys) - aliases)[:3]}")


def model_config_dict(model, training_args: dict | None = None, source: dict | None = None) -> dict:
    backbone = model.backbone
    if isinstance(backbone, Transformer):
        kind, arch = "dit", backbone.config.to_dict()
    elif is_hf_backbone(backbone):
        kind, arch = "hf", config_dict(backbone)
    else:
        raise UserError(f"saving a {type(backbone).__name__} backbone is not supported: only the setdlm DiT "
                        "and setdlm.formats.hf.HFBackbone")
    tok = model.tokenizer
    cfg = {"format": FORMAT, "format_version": FORMAT_VERSION, "backbone": kind,
           "architecture": arch, "family": model.family.to_dict(),
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


def write_folder(dst: Path, fill, replaceable=is_checkpoint) -> Path:
    """Write the checkpoint folder ``dst`` atomically (the module docstring): ``fill(tmp)`` writes its files
    into a temporary folder next to ``dst``, which then replaces it (only a folder ``replaceable`` accepts is ever
    replaced); on an error nothing of it is kept."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    remove_partial(dst)  # what a save killed halfway left
    tmp = Path(tempfile.mkdtemp(dir=dst.parent, prefix=f"{partial_folder(dst, 'tmp').name}-"))
    try:
        mask = umask()
        tmp.chmod(0o777 & ~mask)  # an ordinary folder's permissions, not mkdtemp's 0700
        fill(tmp)
        for f in tmp.rglob("*"):  # safetensors writes 0600: an ordinary file's permissions instead
            f.chmod((0o777 if f.is_dir() else 0o666) & ~mask)
        _fsync_tree(tmp)
        _commit_dir(tmp, dst, replaceable)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) or type(e).__name__ == "SafetensorError":  # disk full, read-only, ...
            raise UserError(f"{dst}: cannot write the checkpoint ({str(e).splitlines()[0]}); nothing of it was "
                            "kept, an earlier checkpoint there is intact") from None
        raise
    return dst


def flatten_optimizer_state(sd: dict) -> tuple[dict[str, Tensor], dict]:
    """``optimizer.state_dict()`` → (tensors for safetensors, JSON-able rest). Keys ``"<param>.<name>"``."""
    tensors, scalars = {}, {}
    for pid, st in sd["state"].items():
        for name, v in st.items():
            if isinstance(v, Tensor):
                tensors[f"{pid}.{name}"] = v.detach().contiguous().cpu()
            else:
                scalars[f"{pid}.{name}"] = v
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def unflatten_optimizer_state(tensors: dict[str, Tensor], meta: dict) -> dict:
    state: dict[int, dict] = {}
    for key, v in list(tensors.items()) + list(meta["scalars"].items()):
        pid, name = key.split(".", 1)
        state.setdefault(int(pid), {})[name] = v
    groups = [{**g, "betas": tuple(g["betas"])} if "betas" in g else g for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


# ---------------------------------------------------------------------------------------------------------
# load
# ---------------------------------------------------------------------------------------------------------


def resolve(path: str | Path) -> Path:
    """A checkpoint folder, or a training run folder whose ``latest`` names one."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"checkpoint {str(p)!r} does not exist")
    if not p.is_dir():
        raise UserError(f"checkpoint {str(p)!r} is not a folder")
    if not (p / CONFIG).exists() and (p / LATEST).is_file():
        try:
            target = (p / LATEST).read_text(encoding="utf-8").strip()
        except UnicodeDecodeError:
            raise UserError(f"{p / LATEST}: not a text file (it should name a checkpoint folder, e.g. "
                            "checkpoints/step-00000100)") from None
        if not target or Path(target).is_absolute() or ".." in Path(target).parts:
            raise UserError(f"{p / LATEST}: {target!r} is not a checkpoint folder inside {p}")
        if not (p / target / CONFIG).exists():
            raise UserError(f"{p / LATEST}: points to {target!r}, which holds no {CONFIG}")
        return p / target
    return p


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    p = Path(run_dir) / LATEST
    return resolve(run_dir) if p.is_file() else None


def read_json(path: Path, missing: str) -> dict:
    """A JSON file, or a ``ValueError`` naming it: ``missing (<missing>)`` or ``not valid JSON``."""
    if not path.is_file():
        raise UserError(f"{path}: missing ({missing})")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None


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


_KINDS = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}
# keys added to the format after models were saved without them: absent means the behaviour from before the key
# existed (its default), so older checkpoints (the shipped models among them) load unchanged
_ADDED_LATER = {"keep_clean_bos", "ar_weight"}


def check_fields(path: Path, section: str, d: dict, cls) -> None:
    """Every field of the dataclass ``cls`` present in ``d`` (``config.json``'s ``section``) with a value of
    its type: a key that is missing or mistyped is an error naming the key and the file, never a default
    filled in (a 2-head checkpoint must not load as the default 4 heads)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in d and f.name in _ADDED_LATER:
            continue
        if f.name not in d:
            raise UserError(f"{path}: {section!r} lacks the key {f.name!r}; the file is incomplete or was edited "
                            "(re-save the model, or restore the key)")
        v, kind = d[f.name], hints[f.name]
        optional = type(None) in typing.get_args(kind)
        base = next((a for a in typing.get_args(kind) if a is not type(None)), kind)
        if v is None and optional:
            continue
        if (isinstance(v, bool) and base is not bool) or not isinstance(v, _KINDS.get(base, (base,))):
            want = base.__name__ + (" or null" if optional else "")
            raise UserError(f"{path}: {section}.{f.name} must be {want}, got {json.dumps(v)}")


def parse_configs(folder: Path, cfg: dict, family: str | None = None) -> tuple[TransformerConfig | dict, FamilyConfig]:
    """(architecture, family) of a config: a :class:`TransformerConfig` for the DiT, the ``transformers`` config
    dict for an HF backbone."""
    path = folder / CONFIG
    kind = cfg.get("backbone", "dit")
    if kind not in ("dit", "hf"):
        raise UserError(f"{path}: unknown backbone {kind!r} (expected 'dit' or 'hf')")
    if kind == "dit":
        check_fields(path, "architecture", cfg["architecture"], TransformerConfig)
    check_fields(path, "family", cfg["family"], FamilyConfig)
    try:
        arch = TransformerConfig.from_dict(cfg["architecture"]) if kind == "dit" else dict(cfg["architecture"])
    except (TypeError, ValueError) as e:
        raise UserError(f"{path}: bad architecture: {e}") from None
    vocab = arch.vocab_size if isinstance(arch, TransformerConfig) else arch.get("vocab_size")
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


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def is_pickle(path: Path) -> bool:
    """Whether ``path`` is a pickle: ``torch.save``'s zip archive or a bare pickle stream (protocol >= 2)."""
    with open(path, "rb") as f:
        head = f.read(9)
    if head[8:9] == b"{":  # safetensors: an 8-byte header length, then the JSON header
        return False
    return head.startswith(b"PK\x03\x04") or (head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"))


def refuse_pickle(path: Path) -> None:
    """Pickles can run code when loaded; setdlm never unpickles one (checkpoints are safetensors)."""
    if is_pickle(path):
        raise UserError(f"{path}: is a pickle file (torch.save / .bin / .pt), not safetensors; setdlm does not "
                        "load pickles, since loading one can run code. Convert it to safetensors where you trust it")


def check_safetensors(path: Path) -> None:
    """A ``ValueError`` naming ``path`` unless it is a complete safetensors file (header read, every tensor's
    bytes present): checks weights that another library (``transformers``) will load, before it does."""
    refuse_pickle(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n)) if 8 + n <= size else None
        if header is None:
            raise UserError("header runs past the end of the file")
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        if 8 + n + end > size:
            raise UserError(f"{size} bytes, but the header needs {8 + n + end}")
        with safe_open(str(path), "pt"):
            pass
    except Exception as e:  # json / safetensors raise their own error types
        raise UserError(f"{path}: corrupt or truncated safetensors file ({str(e).splitlines()[0]})") from None


def read_tensors(path: Path, expected: dict[str, tuple] | None = None, what: str = "") -> dict[str, Tensor]:
    """Load a safetensors file; check names and shapes against ``expected`` and that values are finite."""
    if not path.is_file():
        raise UserError(f"{path}: missing{what}")
    refuse_pickle(path)
    try:
        sd = load_file(str(path))
    except Exception as e:  # safetensors raises its own error type on a bad header / short file
        raise UserError(f"{path}: corrupt or truncated safetensors file ({str(e).splitlines()[0]})") from None
    if expected is not None:
        missing = [k for k in expected if k not in sd]
        extra = [k for k in sd if k not in expected]
        if missing or extra:
            raise UserError(f"{path}: tensors do not match config.json (missing {missing[:3]}, unexpected "
                            f"{extra[:3]})")
        for k, shape in expected.items():
            if tuple(sd[k].shape) != shape:
                raise UserError(f"{path}: tensor {k!r} has shape {tuple(sd[k].shape)} but config.json implies {shape}")
    for k, v in sd.items():
        if v.is_floating_point() and not torch.isfinite(v).all():
            raise UserError(f"{path}: tensor {k!r} holds non-finite values (corrupt file?)")
    return sd


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


def build_backbone(cfg: dict, arch: TransformerConfig | dict, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """An untrained backbone of the checkpoint's architecture (weights to be loaded)."""
    if cfg.get("backbone", "dit") == "hf":
        return backbone_from_config(arch, dtype=dtype)
    assert isinstance(arch, TransformerConfig)  # a DiT checkpoint's architecture (parse_configs)
    return Transformer(arch).to(dtype) if dtype is not None else Transformer(arch)


def count_parameters(cfg: dict, arch: TransformerConfig | dict) -> int:
    """The backbone's parameter count, computed without allocating it, before anything is built: 1- and
    2-layer copies of the architecture on the meta device give the embeddings and the per-layer count, so
    that ``n_layers: 1000000`` costs no more than ``n_layers: 2``."""
    one: TransformerConfig | dict
    two: TransformerConfig | dict
    if isinstance(arch, TransformerConfig):
        one, two = (dataclasses.replace(arch, n_layers=n) for n in (1, 2))
        layers = arch.n_layers
    else:
        key = "n_layer" if "n_layer" in arch else "num_hidden_layers"  # GPT-2's name, the others'
        types = arch.get("layer_types")  # one entry per layer where the config lists them (Qwen3)
        one, two = ({**arch, key: n, **({"layer_types": types[:n]} if isinstance(types, list) else {})} for n in (1, 2))
        given = arch.get(key)
        if not isinstance(given, int) or isinstance(given, bool) or given < 1:
            raise UserError(f"architecture.{key} must be a positive integer, got {given!r}")
        layers = given
    with torch.device("meta"):
        a, b = (sum(p.numel() for p in build_backbone(cfg, x).parameters()) for x in (one, two))
    return a + (layers - 1) * (b - a)


def check_model_size(path: Path, cfg: dict, arch: TransformerConfig | dict, device=None) -> None:
    """Refuse, before anything is allocated, an architecture whose float32 weights alone exceed the device's
    memory (``n_layers: 1000000``, ``hidden_size: 1000000``, ``vocab_size: 1e11`` in a corrupt or hostile
    ``config.json`` at ``path``): one line instead of an allocation failure or hours of swapping."""
    try:
        n = count_parameters(cfg, arch)
    except (ValueError, TypeError) as e:  # transformers' own check of its config
        raise UserError(f"{path}: bad architecture ({str(e).strip().splitlines()[-1]})") from None
    check_fits(f"{path}: the architecture ({n:,} parameters)", 4 * n,
               torch.device(device) if device is not None else torch.device("cpu"),
               "config.json is corrupt, or the model is too large for this machine")


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
    vocab = arch.vocab_size if isinstance(arch, TransformerConfig) else arch["vocab_size"]
    check_model_size(folder / CONFIG, cfg, arch, device)
    tok = load_checkpoint_tokenizer(folder, cfg, vocab, fam)
    backbone = build_backbone(cfg, arch)
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


def load_training_state(folder: str | Path) -> tuple[dict, dict | None]:
    """``(training_state, optimizer_state_dict or None)`` of a checkpoint folder, for resuming."""
    folder = Path(folder)
    state = read_json(folder / STATE, "the checkpoint cannot resume training")
    meta = state.pop("optimizer", None)
    if meta is None:
        return state, None
    return state, unflatten_optimizer_state(read_tensors(folder / OPTIMIZER), meta)
