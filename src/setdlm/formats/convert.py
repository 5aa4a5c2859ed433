"""Load and convert the authors' checkpoints (``kuleshov-group/setdlms``) into setdlm (docs/method.md §3.1, §3.2, §5.7).

A folder (or Hub repo) in the authors' layout holds ``config.json`` (their ``backbone_config`` /
``noise_config`` dicts, or the flat layout of ``tests/fixtures/reference-dit-tiny``), the weights
(``*.safetensors`` or ``pytorch_model.bin``, sharded or not) and usually the tokenizer files.
:func:`load_reference_model` turns it into a :class:`~setdlm.lm.Model`; :func:`convert_reference`
(``setdlm convert --from-reference SRC OUT``) writes it as a setdlm checkpoint; ``setdlm.load`` detects
the layout by itself (:func:`is_reference_folder`).

Two backbones:

* the DiT (LM1B, OWT; ``_target_`` ``...dit.DIT``) becomes :class:`setdlm.model.Transformer`;
* ``AutoModelFromPreTrained`` (GSM8K: pretrained Qwen3-1.7B-Base; CNN/DM: the Qwen3-0.6B architecture
  re-initialised with overrides) wraps a ``Qwen3ForCausalLM`` as ``backbone.model``, so its keys are
  ``backbone.model.<transformers key>``; it becomes :class:`setdlm.formats.hf.HFBackbone`. Its config holds only
  the base model's name and the overrides, so the architecture is the base model's ``config.json`` (a
  local folder or Hub id: ``base=``, default the name recorded in the checkpoint) with the overrides
  applied. A missing ``lm_head.weight`` means tied embeddings.

DiT key map (official → ours)::

    backbone.vocab_embed.embedding                 → embed.weight
    backbone.blocks.N.{norm1,attn_qkv,attn_out,norm2}.weight, .mlp.{0,2}.{weight,bias}
                                                   → blocks.N.<same>
    backbone.output_layer.norm_final.weight        → norm_final.weight
    backbone.output_layer.linear.{weight,bias}     → head.{weight,bias}
    static_attention_mask, backbone.rotary_emb.inv_freq   (buffers, not weights: checked, dropped)

The family comes from the config's ``architectures`` or the name (SetDLM, BD3LM ``-s{N}``, MDLM, AR). The
SetDLM schedule is rebuilt the way their loader does (docs/method.md §5.7, §7.9): ``D`` from the config's
``desired_block_size`` or from ``d{N}`` / ``tgt{N}`` / ``smax{2N}`` in the name, ``M = min(2D, L)`` (the
exported configs may carry ``max_block_size = L``). Tokenizers: the checkpoint's own files, else
``tokenizer=`` (a folder or Hub name), else the config's ``tokenizer_name`` or the base model, else the
dataset's (``owt`` → ``gpt2`` + MASK, ``lm1b`` → ``bert-base-uncased``, ``gsm8k`` / ``cnndm`` → Qwen3); the
token at the checkpoint's ``mask_token_id`` becomes MASK (one past the vocabulary: a MASK token is added).
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor
from torch import nn

from ..data.tokenizers import Tokenizer, load_tokenizer
from ..errors import UserError
from ..family import FamilyConfig
from ..lm import Model
from ..model import TransformerConfig, Transformer
from .backbones import DIT, HF, BackboneFormat, check_model_size, expected_shapes, load_weights
from .checkpoint import read_config, save
from .layout import resolve
from .safety import refuse_pickle
from .hf import HFBackbone, backbone_from_config
from .hub import HubUnreachableError, is_hub_id, snapshot, snapshot_checkpoint

_BLOCK_PARAMS = ("norm1.weight", "attn_qkv.weight", "attn_out.weight", "norm2.weight",
                 "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias")
_BUFFERS = ("static_attention_mask", "backbone.rotary_emb.inv_freq")


def reference_key_map(n_layers: int) -> dict[str, str]:
    """Official key → setdlm key for a DiT with ``n_layers`` blocks."""
    m = {"backbone.vocab_embed.embedding": "embed.weight",
         "backbone.output_layer.norm_final.weight": "norm_final.weight",
         "backbone.output_layer.linear.weight": "head.weight",
         "backbone.output_layer.linear.bias": "head.bias"}
    for i in range(n_layers):
        for p in _BLOCK_PARAMS:
            m[f"backbone.blocks.{i}.{p}"] = f"blocks.{i}.{p}"
    return m


def is_reference_state_dict(sd: dict) -> bool:
    return "backbone.vocab_embed.embedding" in sd


def convert_reference_state_dict(sd: dict[str, Tensor], config: TransformerConfig) -> dict[str, Tensor]:
    """Map an official state dict onto ours. Raises ``ValueError`` naming the first missing key, unknown
    key or wrong shape; legacy adaLN (time-conditioned) DiTs are refused with a clear message."""
    ada = [k for k in sd if "adaLN" in k]
    if ada:
        raise UserError(f"checkpoint has time-conditioning (adaLN) weights, e.g. {ada[0]!r}: legacy "
                        "BD3LM/MDLM DiT checkpoints are not supported, only the SetDLM DiT without adaLN")
    kmap = reference_key_map(config.n_layers)
    expected = {k: tuple(v.shape) for k, v in Transformer(config).state_dict().items()}
    out: dict[str, Tensor] = {}
    for key in sd:
        if key in _BUFFERS:
            continue
        if key not in kmap:
            raise UserError(f"unknown key {key!r} in the reference checkpoint (not part of a "
                            f"{config.n_layers}-layer DiT)")
    for src, dst in kmap.items():
        if src not in sd:
            raise UserError(f"missing key {src!r} in the reference checkpoint")
        t = sd[src]
        if tuple(t.shape) != expected[dst]:
            raise UserError(f"wrong shape for {src!r}: expected {list(expected[dst])}, got {list(t.shape)}")
        out[dst] = t
    inv = sd.get("backbone.rotary_emb.inv_freq")
    if inv is not None:
        hd = config.head_dim
        ours = 1.0 / (config.rope_base ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        if inv.shape != ours.shape or not torch.allclose(inv.float(), ours, rtol=1e-5):
            raise UserError("backbone.rotary_emb.inv_freq does not match rotary base "
                            f"{config.rope_base} with head_dim {hd}")
    return out


def infer_D(name: str) -> int | None:
    """D from a run or Hub name: ``d4``, ``tgt4`` or ``smax8`` (= 2D) → 4; None if absent."""
    base = name.rstrip("/").split("/")[-1].lower()
    m = re.search(r"smax(\d+)", base)
    if m:
        return int(m.group(1)) // 2
    m = re.search(r"(?:^|[-_])(?:tgt|d)(\d+)(?:$|[-_])", base)
    return int(m.group(1)) if m else None


def _pick(d: dict, *names, default=None):
    for n in names:
        if n in d and d[n] is not None:
            return d[n]
    return default


# ---------------------------------------------------------------------------------------------------------
# the folder: config, weights, backbone kind
# ---------------------------------------------------------------------------------------------------------

_WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")
_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model")


def read_reference_config(folder: Path) -> dict:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise UserError(f"{path}: missing (a reference checkpoint folder needs config.json)")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{path}: expected a JSON object")
    return cfg


def is_reference_folder(folder: str | Path) -> bool:
    """Is ``folder`` a checkpoint in the authors' layout (not a setdlm checkpoint, not a plain HF model)?"""
    try:
        cfg = read_reference_config(Path(folder))
    except ValueError:
        return False
    return cfg.get("format") != "setdlm" and any(k in cfg for k in ("backbone_config", "backbone_config_passed",
                                                                    "noise_config", "setdlm"))


def read_reference_weights(folder: Path) -> dict[str, Tensor]:
    """Every tensor of the folder's weights (safetensors, or ``pytorch_model*.bin`` read with
    ``torch.load(weights_only=True)``: tensors only, no code), ``_orig_mod.`` prefixes (torch.compile)
    removed. One weights file, or the shards a ``*.index.json`` lists (its ``weight_map``, as
    transformers loads them); several files without an index are refused rather than overlaid."""
    folder = Path(folder)
    files = sorted(folder.glob(_WEIGHT_FILES[0])) or sorted(folder.glob(_WEIGHT_FILES[1]))
    if not files:
        raise UserError(f"{folder}: no weights found (expected *.safetensors or pytorch_model.bin)")
    index = _shard_index(folder, files[0].suffix)
    if index is None:
        if len(files) > 1:
            raise UserError(f"{folder}: {len(files)} weights files ({', '.join(f.name for f in files)}) and no "
                            "*.index.json saying how they combine; keep one, or add the sharded-checkpoint index")
        return _read_weight_file(files[0])
    path, weight_map = index
    sd: dict[str, Tensor] = {}
    for name in sorted(set(weight_map.values())):
        part = _read_weight_file(folder / name)
        twice = sorted(set(part) & set(sd))
        if twice:
            raise UserError(f"{path}: shard {name} repeats tensors of another shard: {twice[:3]}")
        sd.update(part)
    missing = sorted({k.replace("_orig_mod.", "") for k in weight_map} - set(sd))
    if missing:
        raise UserError(f"{path}: tensors listed in weight_map are in no shard: {missing[:3]}")
    return sd


def _shard_index(folder: Path, suffix: str) -> tuple[Path, dict[str, str]] | None:
    """The sharded-checkpoint index of the weights kind ``suffix`` (``model.safetensors.index.json`` or
    ``pytorch_model.bin.index.json``, transformers' names) as ``(path, weight_map)``, or None."""
    found = sorted(folder.glob(f"*{suffix}.index.json"))
    if not found:
        return None
    if len(found) > 1:
        raise UserError(f"{folder}: several sharded-checkpoint indexes ({', '.join(f.name for f in found)})")
    try:
        weight_map = json.loads(found[0].read_text(encoding="utf-8")).get("weight_map")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise UserError(f"{found[0]}: not a sharded-checkpoint index ({e})") from None
    if not (isinstance(weight_map, dict) and weight_map and all(isinstance(v, str) for v in weight_map.values())):
        raise UserError(f"{found[0]}: no weight_map (tensor name -> shard file) in the index")
    absent = sorted({v for v in weight_map.values() if not (folder / v).is_file()})
    if absent:
        raise UserError(f"{found[0]}: shard files missing from {folder}: {', '.join(absent)}")
    return found[0], weight_map


def _read_weight_file(f: Path) -> dict[str, Tensor]:
    if f.suffix == ".safetensors":
        refuse_pickle(f)
    try:
        part = load_file(str(f)) if f.suffix == ".safetensors" else torch.load(f, map_location="cpu",
                                                                                weights_only=True)
    except pickle.UnpicklingError:  # weights_only refused an object: never retried without it
        raise UserError(f"{f}: a pickle holding more than tensors; it is not loaded, since loading it could "
                        "run code") from None
    except Exception as e:  # safetensors / torch raise their own error types for corrupt files
        raise UserError(f"{f}: cannot read the weights ({str(e).splitlines()[0]})") from None
    if isinstance(part.get("state_dict"), dict):
        part = part["state_dict"]
    return {k.replace("_orig_mod.", ""): v for k, v in part.items() if isinstance(v, Tensor)}


def backbone_kind(cfg: dict, sd: dict) -> BackboneFormat:
    """The backbone format of :data:`setdlm.formats.backbones.REGISTRY` the folder holds: the DiT, or
    ``HF`` (AutoModelFromPreTrained around a transformers causal LM)."""
    target = str((cfg.get("backbone_config") or cfg.get("backbone_config_passed") or {}).get("_target_", ""))
    if "automodel" in target.lower() or any(k.startswith("backbone.model.") for k in sd):
        return HF
    if target.endswith("DIT") or is_reference_state_dict(sd):
        return DIT
    raise UserError(f"unsupported reference backbone {target or '(no _target_)'!r}: only the DiT and "
                    "AutoModelFromPreTrained (Qwen3) checkpoints load into setdlm")


# ---------------------------------------------------------------------------------------------------------
# configs: architecture, family, schedule
# ---------------------------------------------------------------------------------------------------------


def _backbone_cfg(cfg: dict) -> dict:
    return cfg.get("backbone_config") or cfg.get("backbone_config_passed") or cfg


def _noise_cfg(cfg: dict) -> dict:
    return cfg.get("noise_config") or cfg.get("setdlm", {}).get("noise") or cfg.get("noise") or {}


def reference_length(cfg: dict) -> int:
    L = _pick(cfg, "length", "model_length", "max_length", default=_pick(_backbone_cfg(cfg), "length"))
    if L is None:
        raise UserError("the reference config records no context length ('length')")
    return int(L)


def reference_keep_clean_bos(cfg: dict) -> bool:
    """The run's ``keep_clean_bos`` (BOS first in the order, scored in training, dropped from the bound):
    top level of the exported config, or its ``setdlm`` / ``model_config`` section; off when absent."""
    for d in (cfg, cfg.get("setdlm") or {}, cfg.get("model_config") or {}):
        v = d.get("keep_clean_bos") if isinstance(d, dict) else None
        if v is not None:
            if not isinstance(v, bool):
                raise UserError(f"the reference config's keep_clean_bos must be true or false, got {v!r}")
            return v
    return False


def reference_family(cfg: dict, name: str = "", *, mask_token_id: int, D: int | None = None,
                     M: int | None = None) -> FamilyConfig:
    """The family of an authors' checkpoint, with the schedule rebuilt their way (see the module docstring)."""
    L = reference_length(cfg)
    noise = _noise_cfg(cfg)
    base = name.rstrip("/").split("/")[-1].lower()
    noise_class = str(noise.get("_target_", noise.get("class", "")))
    hay = " ".join([*(cfg.get("architectures") or []), base, noise_class]).lower()
    if "setdlm" in cfg or any(w in hay for w in ("setdlm", "aoarm", "staggered", "easeoutpower")):
        D = D or _pick(noise, "desired_block_size") or infer_D(name)
        if D is None:
            raise UserError(f"cannot tell D for {name or 'this checkpoint'}: no noise desired_block_size in its "
                            "config and no d{N}/tgt{N}/smax{2N} in its name; pass D explicitly")
        return FamilyConfig("setdlm", length=L, mask_token_id=mask_token_id, D=int(D), M=M or min(2 * int(D), L),
                            keep_clean_bos=reference_keep_clean_bos(cfg))
    if "bd3lm" in hay:
        m = re.search(r"(?:^|[-_])s(\d+)(?:$|[-_])", base)
        S = int(m.group(1)) if m else _pick(cfg, "block_size")
        if S is None or (int(S) >= L and not m):  # SetDLM-style configs record block_size = L
            raise UserError(f"cannot tell the BD3LM block size of {name or 'this checkpoint'}")
        return FamilyConfig("bd3lm", length=L, mask_token_id=mask_token_id, block_size=int(S))
    if "mdlm" in hay:
        return FamilyConfig("mdlm", length=L, mask_token_id=mask_token_id)
    if re.search(r"(?:^|[^a-z0-9])ar(?:$|[^a-z0-9])", hay):
        return FamilyConfig("ar", length=L, mask_token_id=mask_token_id)
    raise UserError(f"cannot tell the family of {name or 'this checkpoint'} (setdlm, bd3lm, mdlm or ar) from its "
                    "config's architectures or its name")


def reference_configs(cfg: dict, name: str = "", *, D: int | None = None,
                      M: int | None = None) -> tuple[TransformerConfig, FamilyConfig]:
    """Our (TransformerConfig, FamilyConfig) of a DiT checkpoint from its config dict (the authors' HF config with
    ``backbone_config`` / ``noise_config``, the fixture's layout, or a flat config with the same names)."""
    bb = _backbone_cfg(cfg)
    if _pick(bb, "adaln", default=False):
        raise UserError("config has adaln=true: legacy time-conditioned DiTs are not supported")
    mc = TransformerConfig(vocab_size=int(_pick(bb, "vocab_size", default=cfg.get("vocab_size"))),
                     hidden_size=int(_pick(bb, "hidden_size", "hidden_dim")),
                     n_heads=int(_pick(bb, "n_heads", "num_attention_heads")),
                     n_layers=int(_pick(bb, "num_layers", "n_blocks", "num_hidden_layers")),
                     dropout=float(_pick(bb, "dropout", default=0.0)))
    mask_id = int(_pick(cfg, "mask_token_id", "mask_index", default=mc.vocab_size - 1))
    return mc, reference_family(cfg, name, mask_token_id=mask_id, D=D, M=M)


# ---------------------------------------------------------------------------------------------------------
# Qwen3 (and other transformers causal LMs) wrapped as `backbone.model`
# ---------------------------------------------------------------------------------------------------------

# AutoModelFromPreTrained's own arguments; every other backbone_config entry overrides the base config
_AUTOMODEL_ARGS = {"_target_", "_recursive_", "_partial_", "automodel_cls", "pretrained_model_name_or_path",
                   "trust_remote_code", "keep_bottom_n_layers", "reinit_model", "torch_dtype", "dtype",
                   "attn_implementation", "revision"}


def _base_config(base: str):
    """The transformers config of the base model: a local folder, or a Hub id (config.json only)."""
    from transformers import AutoConfig


    path = Path(base).expanduser()
    if path.is_dir():
        return AutoConfig.from_pretrained(str(path))
    if not is_hub_id(base):
        raise UserError(f"base model {base!r} is neither a local folder nor a Hub id")
    try:
        return AutoConfig.from_pretrained(str(snapshot(base, allow_patterns=["config.json"])))
    except HubUnreachableError as e:
        raise HubUnreachableError(f"the checkpoint's architecture is that of its base model: {e}; or pass "
                                  "base=DIR (setdlm convert --base DIR), a folder holding the base model's "
                                  "config.json") from None


def hf_reference_state_dict(sd: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The transformers state dict inside an AutoModelFromPreTrained checkpoint (``backbone.model.`` or
    ``backbone.`` prefix removed; attention-mask and rotary buffers dropped) and a map back to the original
    key names (for error messages)."""
    out, names = {}, {}
    for k, v in sd.items():
        if k in _BUFFERS or k.endswith("rotary_emb.inv_freq"):
            continue
        if not k.startswith("backbone."):
            raise UserError(f"unknown key {k!r} in the reference checkpoint (expected backbone.model.*)")
        new = k[len("backbone."):]
        if new.startswith("model.model.") or new.startswith("model.lm_head."):
            new = new[len("model."):]
        out[new], names[new] = v, k
    return out, names


def reference_hf_backbone(cfg: dict, sd: dict[str, Tensor], *, base: str | None = None) -> HFBackbone:
    """An :class:`~setdlm.formats.hf.HFBackbone` holding the weights of an AutoModelFromPreTrained checkpoint."""
    bb = cfg.get("backbone_config") or {}
    base = base or bb.get("pretrained_model_name_or_path")
    if not base:
        raise UserError("the checkpoint names no base model (backbone_config.pretrained_model_name_or_path): "
                        "pass base= (a folder or Hub id whose config.json gives the architecture)")
    arch = json.loads(_base_config(str(base)).to_json_string(use_diff=False))
    overrides = {k: v for k, v in bb.items() if k not in _AUTOMODEL_ARGS}
    keep = bb.get("keep_bottom_n_layers", -1)
    if keep not in (None, -1):
        overrides["num_hidden_layers"] = int(keep)
    if "num_hidden_layers" in overrides:
        arch.pop("layer_types", None)  # derived from the layer count again
    arch.update(overrides)
    hf_sd, names = hf_reference_state_dict(sd)
    embed = next((v for k, v in hf_sd.items() if k.endswith("embed_tokens.weight") or k.endswith("wte.weight")), None)
    head = hf_sd.get("lm_head.weight")
    arch["tie_word_embeddings"] = head is None or (embed is not None and head.shape == embed.shape
                                                  and torch.equal(head, embed))
    if head is not None and arch["tie_word_embeddings"]:
        del hf_sd["lm_head.weight"]
    dtype = next(iter(hf_sd.values())).dtype if hf_sd else None
    backbone = backbone_from_config(arch, dtype=dtype)
    expected = expected_shapes(backbone)
    for k in hf_sd:
        if "hf." + k not in expected:
            raise UserError(f"unknown key {names[k]!r} in the reference checkpoint (not part of the "
                            f"{arch.get('model_type')} architecture of {base})")
    for k, shape in expected.items():
        key = k[len("hf."):]
        if key not in hf_sd:
            raise UserError(f"missing key {'backbone.model.' + key!r} in the reference checkpoint")
        if tuple(hf_sd[key].shape) != shape:
            raise UserError(f"wrong shape for {names[key]!r}: expected {list(shape)}, got "
                            f"{list(hf_sd[key].shape)}")
    load_weights(backbone, {"hf." + k: v for k, v in hf_sd.items()})
    return backbone.eval()


# ---------------------------------------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------------------------------------

_DATASET_TOKENIZERS = (("owt", "gpt2"), ("openwebtext", "gpt2"), ("lm1b", "bert-base-uncased"),
                       ("gsm8k", "Qwen/Qwen3-1.7B-Base"), ("cnndm", "Qwen/Qwen3-0.6B-Base"),
                       ("cnn", "Qwen/Qwen3-0.6B-Base"))


def default_tokenizer_name(name: str) -> str | None:
    """The tokenizer the paper used for the dataset in a checkpoint's name (docs/method.md §2.9), or None."""
    base = name.rstrip("/").split("/")[-1].lower()
    for key, tok in _DATASET_TOKENIZERS:
        if re.search(rf"(?:^|[-_]){key}(?:$|[-_])", base):
            return tok
    return None


def reference_tokenizer(folder: Path, cfg: dict, name: str, *, tokenizer=None, base: str | None = None,
                        mask_token_id: int):
    """The checkpoint's tokenizer as a setdlm Tokenizer whose MASK id is the checkpoint's, or None when no
    source is known (see the module docstring for the order of the sources)."""
    if isinstance(tokenizer, Tokenizer):
        if tokenizer.mask_token_id != mask_token_id:
            raise UserError(f"the tokenizer's MASK id {tokenizer.mask_token_id} differs from the checkpoint's "
                            f"{mask_token_id}")
        return tokenizer
    spec = tokenizer
    if spec is None and any((Path(folder) / f).is_file() for f in _TOKENIZER_FILES):
        spec = str(folder)
    spec = spec or cfg.get("tokenizer_name") or base or default_tokenizer_name(name)
    if spec is None:
        return None
    spec = str(spec)
    path = Path(spec).expanduser()
    if not path.is_dir():
        if not (is_hub_id(spec) or re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", spec)):  # "gpt2" is a Hub name
            raise UserError(f"tokenizer {spec!r} is neither a local folder nor a Hub name")
        path = snapshot(spec, allow_patterns=["tokenizer*", "special_tokens_map.json", "vocab*", "merges.txt",
                                              "*.model", "chat_template*"])
    tok = load_tokenizer(path, mask_id=mask_token_id)
    tok.prompt = "bos"  # the authors' rows start with BOS ([BOS] text [EOS]), whatever the tokenizer
    return tok


# ---------------------------------------------------------------------------------------------------------
# entry points
# ---------------------------------------------------------------------------------------------------------


def load_reference_model(path: str | Path, *, name: str | None = None, tokenizer=None, D: int | None = None,
                         M: int | None = None, base: str | None = None, dtype: torch.dtype | None = None) -> Model:
    """A :class:`~setdlm.lm.Model` from a folder in the authors' layout (a Hub id: use ``setdlm.load``).

    ``tokenizer``: a folder, a Hub name or a setdlm Tokenizer (default: see the module docstring; None
    when no source is known). ``D``, ``M``: override the schedule (default: D from the config or name,
    M = min(2D, L)). ``base``: where the Qwen3 architecture comes from (default: the recorded base model).
    ``name``: the name the schedule and tokenizer defaults are read from (default: the folder's).
    """
    folder = Path(path).expanduser()
    cfg = read_reference_config(folder)
    name = name or folder.name
    sd = read_reference_weights(folder)
    kind = backbone_kind(cfg, sd)
    if kind is DIT:
        mc, fam = reference_configs(cfg, name, D=D, M=M)
        check_model_size(folder / "config.json", DIT, mc)
        backbone: nn.Module = Transformer(mc)
        backbone.load_state_dict(convert_reference_state_dict(sd, mc))
        vocab = mc.vocab_size
    else:
        hf = reference_hf_backbone(cfg, sd, base=base)
        backbone, vocab = hf, hf.vocab_size
        mask_id = _pick(cfg, "mask_token_id")
        if mask_id is None:
            raise UserError(f"{folder / 'config.json'}: records no mask_token_id")
        fam = reference_family(cfg, name, mask_token_id=int(mask_id), D=D, M=M)
        base = base or (cfg.get("backbone_config") or {}).get("pretrained_model_name_or_path")
    if not 0 <= fam.mask_token_id < vocab:
        raise UserError(f"mask_token_id {fam.mask_token_id} is outside the model's vocabulary of {vocab}")
    tok = None if tokenizer is _NO_TOKENIZER else reference_tokenizer(
        folder, cfg, name, tokenizer=tokenizer, base=base if kind is HF else None, mask_token_id=fam.mask_token_id)
    if tok is not None and tok.vocab_size > vocab:
        raise UserError(f"the tokenizer has {tok.vocab_size} tokens, more than the model's vocabulary of {vocab}")
    if dtype is not None:
        backbone.to(dtype)
    return Model(backbone.eval(), fam, tok)


def load_reference(path: str | Path, *, D: int | None = None) -> tuple[nn.Module, FamilyConfig]:
    """(backbone, family) of a folder in the authors' layout; the tokenizer is not loaded."""
    model = load_reference_model(path, D=D, tokenizer=_NO_TOKENIZER)
    return model.backbone, model.family


class _NoTokenizer:  # sentinel: load_reference_model without looking for a tokenizer
    pass


_NO_TOKENIZER = _NoTokenizer()


def convert_reference(src: str | Path, out: str | Path, *, tokenizer=None, D: int | None = None,
                      M: int | None = None, base: str | None = None, dtype: torch.dtype | None = None,
                      revision: str | None = None) -> Path:
    """Write the authors' checkpoint ``src`` (a folder or Hub id) as a setdlm checkpoint at ``out``.
    Keywords: as :func:`load_reference_model` (``dtype`` also by name: ``"bfloat16"``). A tokenizer is
    required (a checkpoint always carries one)."""
    for name, v in (("D", D), ("M", M)):
        if v is not None and not (isinstance(v, int) and v >= 1):
            raise UserError(f"{name} must be a positive integer, got {v}", fields=(name,))
    if isinstance(dtype, str):
        if dtype not in ("float32", "bfloat16", "float16"):
            raise UserError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}", fields=("dtype",))
        dtype = getattr(torch, dtype)
    local = Path(src).expanduser()
    if local.exists():
        folder = resolve(local)
    elif is_hub_id(str(src)):
        folder = snapshot_checkpoint(str(src), revision=revision)
    else:
        folder = local
    if not folder.is_dir():
        raise UserError(f"reference checkpoint {str(src)!r} does not exist")
    if not is_reference_folder(folder):  # a setdlm checkpoint is not one either
        raise UserError(f"{src}: not a checkpoint in the authors' layout (config.json has no backbone_config / "
                        "noise_config)")
    model = load_reference_model(folder, name=str(src), tokenizer=tokenizer, D=D, M=M, base=base, dtype=dtype)
    if model.tokenizer is None:
        raise UserError(f"{src}: no tokenizer found; pass one (tokenizer DIR or a Hub name such as gpt2, "
                        "bert-base-uncased, Qwen/Qwen3-1.7B-Base)", fields=("tokenizer",))
    source = {"name": str(src), "layout": "kuleshov-group/setdlms", "revision": revision}
    return save(out, model, source=source)


def describe(folder: str | Path) -> str:
    """One line about a converted checkpoint: family, context length (D and M for SetDLM), backbone, mask id
    and vocabulary (what ``setdlm convert`` prints)."""
    cfg = read_config(folder)
    fam = cfg["family"]
    extra = f" D={fam['D']} M={fam['M']}" if fam.get("D") is not None else ""
    return (f"{fam['family']} L={fam['length']}{extra}, {cfg['backbone']} backbone, mask id {fam['mask_token_id']}, "
            f"tokenizer of {cfg['tokenizer']['vocab_size']} tokens")
