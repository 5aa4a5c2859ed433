"""Sharded checkpoints of an FSDP run (docs/training.md, "FSDP2"), written with ``torch.distributed.checkpoint``
(DCP): every process writes its shards of the parameters, AdamW moments and EMA, none gathers the model.

An FSDP run's checkpoint folder holds ``config.json``, the tokenizer, ``training_state.json`` and the model
card like any other, and ``sharded/`` (one ``.distcp`` file per process and DCP's ``.metadata``) in place of
``model.safetensors``, ``ema.safetensors`` and ``optimizer.safetensors``. ``--resume`` loads it into any
number of processes (DCP reshards; the same number continues the run bitwise). :func:`consolidate`
(``setdlm export FOLDER``, one process, no GPU) adds the single-file weights that
``setdlm.load`` reads. Multi-node runs need ``--out`` on a file system that every node sees.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from ..errors import UserError
from ..formats import checkpoint as ckpt
from ..formats import atomic, backbones, layout
from .distributed import Dist


def _state(net: nn.Module, optimizer, ema: dict | None) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict  # FSDP only (as dcp below)

    model, optim = get_state_dict(net, optimizer)  # (sharded) tensors by parameter name
    return {"model": model, "optim": optim, **({"ema": ema} if ema is not None else {})}


def save_sharded(dst: Path, model, net: nn.Module, optimizer, ema: dict | None, training_args: dict,
                 training_state: dict, dist: Dist) -> Path:
    """Write the checkpoint folder ``dst`` (atomically, as every checkpoint): collective, every process
    calls it. ``model``: the :class:`~setdlm.lm.Model` whose config and tokenizer are recorded."""
    import torch.distributed.checkpoint as dcp  # half a second to import: only FSDP runs and export need it

    state = _state(net, optimizer, ema)
    if not dist.is_main:  # rank 0 names the temporary folder that all write into
        where = [""]  # a placeholder: rank 0's broadcast fills in the temporary folder
        torch.distributed.broadcast_object_list(where, 0)
        dcp.save(state, checkpoint_id=Path(where[0]) / layout.SHARDED)
        torch.distributed.barrier()
        return dst
    config = ckpt.model_config_dict(model, training_args)
    config["ema"] = ema is not None

    def fill(tmp: Path) -> None:
        torch.distributed.broadcast_object_list([str(tmp)], 0)
        dcp.save(state, checkpoint_id=tmp / layout.SHARDED)
        ckpt.write_description(tmp, model, config, training_state)

    atomic.write_folder(dst, fill)
    torch.distributed.barrier()
    return dst


def load_sharded(folder: Path, net: nn.Module, optimizer, ema: dict | None) -> None:
    """Load a sharded checkpoint into the (sharded) ``net``, ``optimizer`` and ``ema`` in place: collective."""
    import torch.distributed.checkpoint as dcp  # half a second to import: only FSDP runs and export need it
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _state(net, optimizer, ema)
    dcp.load(state, checkpoint_id=folder / layout.SHARDED)
    set_state_dict(net, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def is_sharded(folder: Path) -> bool:
    return (Path(folder) / layout.SHARDED).is_dir()


def read_skeleton(folder: Path, config: dict) -> ckpt.Stored:
    """The backbone (freshly initialised, to be filled by :func:`load_sharded`), family and tokenizer that a
    sharded checkpoint's ``config.json`` describes."""
    arch, fam = ckpt.parse_configs(folder, config)
    fmt = backbones.format_named(config)
    vocab = fmt.vocab_size(arch)
    assert isinstance(vocab, int)  # parse_configs checked it
    tokenizer = ckpt.load_checkpoint_tokenizer(folder, config, vocab, fam)
    return ckpt.Stored(fmt.build(arch, None), fam, tokenizer)


def consolidate(path: str | Path) -> Path:
    """Write ``model.safetensors`` (and ``ema.safetensors``) into the sharded checkpoint ``path`` (a checkpoint
    folder, or a run folder: its latest), so that ``setdlm.load`` reads it; one process, on the CPU. The
    sharded files stay (``--resume`` reads them). Returns the checkpoint folder."""
    import torch.distributed.checkpoint as dcp  # half a second to import: only FSDP runs and export need it
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    folder = layout.resolve(path)
    if not is_sharded(folder):
        raise UserError(f"{folder}: not a sharded checkpoint (no {layout.SHARDED}/ folder)")
    config = ckpt.read_config(folder)
    backbone = read_skeleton(folder, config).backbone
    weights = backbones.unique_state_dict(backbone)
    state = {"model": backbone.state_dict()}
    if config.get("ema"):
        state["ema"] = {k: torch.empty_like(v, dtype=torch.float32) for k, v in weights.items()}
    disabled = logging.root.manager.disable  # DCP logs each failing read's traceback on the root logger
    with warnings.catch_warnings():  # DCP says that it reads in one process: that is the intent here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        logging.disable(logging.CRITICAL)
        try:  # no process group: this process reads every shard
            dcp.load(state, checkpoint_id=folder / layout.SHARDED)
        except (Exception, CheckpointException) as e:  # EOFError, pickle's or DCP's errors on a cut or damaged file
            cause = next(iter(getattr(e, "failures", {}).values()), e)  # DCP wraps each rank's error
            cause = cause[0] if isinstance(cause, tuple) and cause else cause  # (exception, traceback)
            detail = (str(cause).splitlines() or [""])[0][:120]
            raise UserError(f"{folder}: its sharded weights cannot be read ({type(cause).__name__}: {detail}): the "
                            "checkpoint is truncated or corrupt; export an earlier one") from None
        finally:
            logging.disable(disabled)
    files = {layout.WEIGHTS: weights, **({layout.EMA_WEIGHTS: state["ema"]} if "ema" in state else {})}
    for name, tensors in files.items():
        tmp = folder / f".{name}.tmp-{os.getpid()}"
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, folder / name)
    return folder
