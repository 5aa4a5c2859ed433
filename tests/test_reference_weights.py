"""Weights files of a folder in the authors' layout (issue 13 item 5): one file loads as is; several files
load only as the shards a ``*.index.json`` lists (transformers' sharded layout), and are refused otherwise
instead of being overlaid with the last file winning."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import setdlm
from setdlm.formats.convert import read_reference_weights

from support.reference_sources import FIX, copy_fixture, tokenizer_folder


def _shard(folder, suffix: str) -> dict:
    """Split the fixture's weights into two shards of kind ``suffix`` with transformers' index."""
    (folder / "setdlm_tiny.safetensors").unlink()
    sd = load_file(str(FIX / "setdlm_tiny.safetensors"))
    keys = sorted(sd)
    stem = "model" if suffix == ".safetensors" else "pytorch_model"  # transformers' names
    names = [f"{stem}-0000{i}-of-00002{suffix}" for i in (1, 2)]
    parts = [{k: sd[k] for k in keys[: len(keys) // 2]}, {k: sd[k] for k in keys[len(keys) // 2:]}]
    for name, part in zip(names, parts):
        save_file(part, str(folder / name)) if suffix == ".safetensors" else torch.save(part, folder / name)
    index = {"metadata": {}, "weight_map": {k: names[i] for i, p in enumerate(parts) for k in p}}
    (folder / f"{stem}{suffix}.index.json").write_text(json.dumps(index))
    return sd


@pytest.mark.parametrize("suffix", [".safetensors", ".bin"])
def test_sharded_weights_load_as_one(tmp_path, suffix):
    folder = copy_fixture(tmp_path / "ref")
    sd = _shard(folder, suffix)
    got = read_reference_weights(folder)
    assert sorted(got) == sorted(sd) and all(torch.equal(got[k], sd[k]) for k in sd)
    tok = str(tokenizer_folder(tmp_path / "tok"))
    ref = setdlm.load(FIX, tokenizer=tok)
    sharded = setdlm.load(folder, tokenizer=tok)
    for (k, a), (_, b) in zip(ref.backbone.state_dict().items(), sharded.backbone.state_dict().items()):
        assert torch.equal(a, b), k


def test_several_weights_files_without_index_are_refused(tmp_path):
    folder = copy_fixture(tmp_path / "ref")
    sd = load_file(str(folder / "setdlm_tiny.safetensors"))
    save_file({k: torch.zeros_like(v) for k, v in sd.items()}, str(folder / "zeros.safetensors"))
    with pytest.raises(ValueError, match=r"2 weights files \(setdlm_tiny.safetensors, zeros.safetensors\) and no "
                                         r"\*.index.json"):
        read_reference_weights(folder)
    with pytest.raises(ValueError, match="zeros.safetensors"):
        setdlm.load(folder, tokenizer=str(tokenizer_folder(tmp_path / "tok")))


def test_bad_shard_indexes_are_named(tmp_path):
    folder = copy_fixture(tmp_path / "ref")
    _shard(folder, ".safetensors")
    index = folder / "model.safetensors.index.json"
    good = json.loads(index.read_text())
    (folder / "model-00002-of-00002.safetensors").rename(tmp_path / "away")
    with pytest.raises(ValueError, match="shard files missing from .*: model-00002-of-00002.safetensors"):
        read_reference_weights(folder)
    (tmp_path / "away").rename(folder / "model-00002-of-00002.safetensors")
    index.write_text(json.dumps({"weight_map": {**good["weight_map"], "backbone.ghost": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(ValueError, match=r"in no shard: \['backbone.ghost'\]"):
        read_reference_weights(folder)
    index.write_text("{}")
    with pytest.raises(ValueError, match="no weight_map"):
        read_reference_weights(folder)
