"""The optimizer's state in a checkpoint (docs/method.md §9.3): its tensors (AdamW moments) in
``optimizer.safetensors``, the rest (hyper-parameters, step counts) in ``training_state.json``; never pickled."""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from .layout import OPTIMIZER, STATE, read_json
from .safety import read_tensors


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


def load_training_state(folder: str | Path) -> tuple[dict, dict | None]:
    """``(training_state, optimizer_state_dict or None)`` of a checkpoint folder, for resuming."""
    folder = Path(folder)
    state = read_json(folder / STATE, "the checkpoint cannot resume training")
    meta = state.pop("optimizer", None)
    if meta is None:
        return state, None
    return state, unflatten_optimizer_state(read_tensors(folder / OPTIMIZER), meta)
