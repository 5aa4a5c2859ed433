"""The family registry (setdlm.family): one typed entry per family that every layer reads, and no family
name compared anywhere else in the package (docs/method.md §9.1)."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import pytest
import torch

import setdlm
from setdlm import training
from setdlm.batch import Batch
from setdlm.decoding import api
from setdlm.decoding.settings import SETTING_FAMILIES, DecodeSettings
from setdlm.family import (FAMILIES, REGISTRY, Family, FamilyConfig, family_from_flags, get_family, register,
                           using)
from setdlm.objectives import OBJECTIVES, compute_loss

from support import make_model
from support.models import FAMILY_KW
from support.name_checks import name_compares

SRC = Path(setdlm.__file__).resolve().parent

# files that still compare family names, each with what removes it; the entry fails once its reason is gone
PENDING: dict[str, str] = {}  # modules allowed a family compare for now, with why (none left)


def family_compares(path: Path) -> list[str]:
    """``line: source`` of every comparison with a family name in ``path``: ``x == "ar"``, ``x != "setdlm"``,
    ``x in ("bd3lm", "mdlm")``. Not counted: the checkpoint format's name (``cfg.get("format") == "setdlm"``)
    and substring / key tests (``"setdlm" in cfg``)."""
    return name_compares(ast.parse(path.read_text(encoding="utf-8")), FAMILIES, "format")


def test_no_family_string_compares_outside_the_registry():
    """Only setdlm/family.py decides by a family's name; every other module reads its registry entry."""
    offenders = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "family.py" or rel in PENDING:
            continue
        hits = family_compares(path)
        if hits:
            offenders[rel] = hits
    assert not offenders, f"family names compared outside setdlm/family.py (use FamilyConfig.spec): {offenders}"
    for rel, why in PENDING.items():  # a stale entry must go
        assert (SRC / rel).exists() and family_compares(SRC / rel), f"remove {rel} from PENDING ({why})"


def test_the_check_sees_every_form_of_compare(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('a = f == "ar"\nb = "mdlm" != x.family\nc = fam.family in ("setdlm", "bd3lm")\n'
                   'd = x not in ["bd3lm"]\ne = cfg.get("format") == "setdlm"\nf = "setdlm" in cfg\n'
                   'g = x == "arx"\n')
    assert [h.split(":")[0] for h in family_compares(src)] == ["1", "2", "3", "4"]


def test_every_entry_names_real_components():
    """Each family's decoder, objective, decode settings, training options and config fields exist."""
    settings = {f.name for f in fields(DecodeSettings)}
    train_fields = {f.name for f in training.config_fields()}
    config_fields = {f.name for f in fields(FamilyConfig)}
    assert FAMILIES == ("ar", "mdlm", "bd3lm", "setdlm")
    for spec in REGISTRY.values():
        assert spec.decoder in api.DECODERS and spec.objective in OBJECTIVES
        assert set(spec.decode_settings) <= settings and set(spec.train_flags) <= train_fields
        assert set(spec.config_fields) <= config_fields and spec.streams in (1, 2)
        assert spec.cache_holds in (None, *spec.decode_settings)


def test_derived_tables_are_the_documented_ones():
    """The knob-to-family tables read from the registry say what docs/decoding.md and docs/training.md say."""
    assert SETTING_FAMILIES == {"window": ("setdlm",), "block_size": ("bd3lm", "mdlm"),
                                "threshold": ("setdlm", "bd3lm", "mdlm"), "speculate": ("setdlm",)}
    assert {n: using("train_flags", n) for n in ("D", "M", "k", "block_size", "keep_clean_bos")} == {
        "D": ("setdlm",), "M": ("setdlm",), "k": ("setdlm",), "block_size": ("bd3lm", "mdlm"),
        "keep_clean_bos": ("setdlm",)}
    assert {f: get_family(f).streams for f in FAMILIES} == {"ar": 1, "mdlm": 1, "bd3lm": 2, "setdlm": 2}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("flags", [dict(D=4, M=None, k=None, block_size=None, keep_clean_bos=False),
                                   dict(D=2, M=4, k=1.5, block_size=8, keep_clean_bos=True)])
def test_family_from_flags_is_the_trainers_config(family, flags):
    """The registry builds from training options the FamilyConfig the trainer builds (BD3LM's S defaults to D,
    the other families' options are dropped)."""
    if flags["keep_clean_bos"] and family != "setdlm":
        flags = {**flags, "keep_clean_bos": False}  # the trainer refuses it for the others
    cfg = training.TrainConfig(out="x", family=family, length=16, **training.knobs_for(family, **flags))
    assert family_from_flags(family, 16, 3, flags) == cfg.family_config(mask_token_id=3)
    recorded = training.TrainConfig.from_record({"out": "x", "family": family, "length": 16, **flags})  # an old run's
    assert recorded.family_config(mask_token_id=3) == cfg.family_config(mask_token_id=3)


@pytest.mark.parametrize("family", FAMILIES)
def test_streams_are_what_the_objective_feeds(family):
    """``streams`` (the memory check's activations) is the backbone input length per row over L."""
    L, seen = 8, []
    backbone = make_model()

    def recording(ids, pos, mask, *args, **kw):
        seen.append(ids.shape[1])
        return backbone(ids, pos, mask, *args, **kw)

    fam = FamilyConfig(family, length=L, mask_token_id=31, **FAMILY_KW[family])
    batch = Batch(torch.randint(0, 30, (2, L), generator=torch.Generator().manual_seed(0)),
                  torch.ones(2, L, dtype=torch.bool), torch.zeros(2, L, dtype=torch.bool))
    compute_loss(recording, fam, batch, generator=torch.Generator().manual_seed(1))
    assert seen == [fam.spec.streams * L]


def test_decode_sizes_default_to_the_models_own():
    set_cfg = FamilyConfig("setdlm", length=16, mask_token_id=3, D=4)
    bd_cfg = FamilyConfig("bd3lm", length=16, mask_token_id=3, block_size=8)
    assert set_cfg.spec.decode_sizes(set_cfg, None, None) == (4, 1)
    assert set_cfg.spec.decode_sizes(set_cfg, 2, None) == (2, 1)
    assert bd_cfg.spec.decode_sizes(bd_cfg, None, None) == (1, 8)
    assert bd_cfg.spec.decode_sizes(bd_cfg, None, 2) == (1, 2)
    ar_cfg = FamilyConfig("ar", length=16, mask_token_id=3)
    assert ar_cfg.spec.decode_sizes(ar_cfg, None, None) == (1, 1)


def test_family_config_keeps_its_dict_and_reads_its_entry():
    """config.json's "family": the nine keys plus ``ar_weight`` (added later: a dict without it, as every model
    saved before, loads with 0, the paper's objective), and a dict loads back to an equal config."""
    cfg = FamilyConfig("setdlm", length=16, mask_token_id=3, D=4)
    d = cfg.to_dict()
    assert d == {"family": "setdlm", "length": 16, "mask_token_id": 3, "block_size": None, "D": 4, "M": 8,
                 "k": None, "b": None, "keep_clean_bos": False, "ar_weight": 0.0}
    assert FamilyConfig.from_dict({k: v for k, v in d.items() if k != "ar_weight"}) == cfg
    assert FamilyConfig.from_dict(d) == cfg and cfg.spec is get_family("setdlm") and isinstance(cfg.spec, Family)
    assert FamilyConfig("mdlm", length=16, mask_token_id=3).block_size == 16  # MDLM's default sub-block, min(32, L)


def test_unknown_and_duplicate_families_are_refused():
    with pytest.raises(ValueError, match="unknown family 'gpt'; choose one of ar, mdlm, bd3lm, setdlm"):
        FamilyConfig("gpt", length=16, mask_token_id=3)
    with pytest.raises(ValueError, match="unknown family"):
        get_family(["ar"])
    with pytest.raises(ValueError, match="family 'ar' is registered already"):
        register(get_family("ar"))
    with pytest.raises(ValueError, match="keep_clean_bos applies to family 'setdlm' only, not to 'bd3lm'"):
        FamilyConfig("bd3lm", length=16, mask_token_id=3, block_size=4, keep_clean_bos=True)
