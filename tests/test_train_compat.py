"""The training package keeps what the single-module trainer promised: a run folder written by it
(tests/fixtures/train-run-v1, made before the package existed) loads and resumes to the weights that version
trained without interruption; its recorded arguments are the package's flat names, one flag each; and the
configuration's groups check their own fields."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import setdlm
from setdlm.errors import UserError
from setdlm.evaluation.likelihood import likelihood
from setdlm.training import (CheckpointArgs, CorpusArgs, EvalArgs, ObjectiveArgs, ModelArgs, OptimArgs, SystemArgs,
                             TrainConfig, config_fields, heldout_of, resume_config, train)
from setdlm.cli.train import build_parser

from support import write_hamlet

FIXTURE = Path(__file__).parent / "fixtures/train-run-v1"
STEP2 = "checkpoints/step-00000002"


@pytest.fixture
def old_run(tmp_path):
    """The fixture run folder, with its data (4000 characters of Hamlet) moved to ``tmp_path``: the run
    recorded its data's absolute path, so ``config.json`` is pointed at the new place (only that key)."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run, ignore=shutil.ignore_patterns("step-4-*", "README.txt"))
    data = write_hamlet(tmp_path / "hamlet.txt", 4000)
    config = run / STEP2 / "config.json"
    cfg = json.loads(config.read_text())
    cfg["training"]["data"] = data
    config.write_text(json.dumps(cfg, indent=2))
    return run


def test_an_old_checkpoint_loads(old_run):
    model, ema = setdlm.load(old_run), setdlm.load(old_run, ema=True)
    assert model.family.family == "setdlm" and model.family.D == 2 and model.tokenizer.vocab_size == 65
    weights = load_file(old_run / STEP2 / "model.safetensors")
    assert all(torch.equal(p, weights[k]) for k, p in model.backbone.state_dict().items())
    ids = torch.tensor([model.tokenizer.encode("To be, or not to be")[:16]])
    assert not torch.equal(model.backbone(ids), ema.backbone(ids))


def test_an_old_run_resumes_to_the_weights_it_would_have_trained(old_run):
    """Resumed by the package from step 2 to 4, the old run ends where the old trainer's uninterrupted
    4-step run ended (same data recipe: the checkpoint's data digest is checked on resume)."""
    saved = json.loads((old_run / STEP2 / "config.json").read_text())["training"]
    cfg = resume_config(old_run, steps=4)
    flat = cfg.to_dict()
    assert {k: flat[k] for k in saved if k not in ("out", "steps", "resume")} == \
        {k: v for k, v in saved.items() if k not in ("out", "steps", "resume")}
    assert flat["strategy"] == "ddp"  # a field added since: its default
    res = train(cfg)
    assert res.resumed_from == 2 and res.step == 4
    # the old trainer's numbers, computed on the machine that made the fixture: equal to float rounding (another
    # CPU may round a matmul differently; on the same machine they are equal bitwise)
    for name in ("model", "ema"):
        want = load_file(FIXTURE / f"step-4-{name}.safetensors")
        got = load_file(old_run / "checkpoints/step-00000004" / f"{name}.safetensors")
        assert want.keys() == got.keys()
        assert all(torch.allclose(want[k], got[k], rtol=0, atol=1e-6) for k in want), name
    old, new = (_rows(FIXTURE / "step-4-metrics.jsonl"), _rows(old_run / "metrics.jsonl"))
    assert [r["step"] for r in new[0]] == [r["step"] for r in old[0]] == [1, 2, 3, 4]
    assert [r["loss"] for r in new[0]] == pytest.approx([r["loss"] for r in old[0]], rel=1e-6)
    assert [r["step"] for r in new[1]] == [2, 4] and new[1][-1]["nelbo"] == pytest.approx(old[1][-1]["nelbo"], rel=1e-6)


def _rows(path):
    """(training rows, held-out rows) of a metrics log."""
    rows = [json.loads(r) for r in path.read_text().splitlines()]
    return [r for r in rows if "split" not in r], [r for r in rows if "split" in r]


def test_recorded_arguments_are_the_flags():
    saved = json.loads((FIXTURE / STEP2 / "config.json").read_text())["training"]
    names = [f.name for f in config_fields()]
    assert set(names) == set(saved) | {"strategy", "ar_weight"}  # every old argument, and the two added since
    flags = {a.dest for a in build_parser()._actions} - {"help"}
    assert flags == set(names)
    args = build_parser().parse_args(["--out", "r", "--hidden-size", "48", "--D", "3", "--strategy", "fsdp"])
    assert (args.hidden_size, args.D, args.strategy) == (48, 3, "fsdp")


def test_groups_check_their_own_fields():
    with pytest.raises(ValueError, match="hidden_size 30 is not divisible by n_heads 4"):
        ModelArgs(hidden_size=30, n_heads=4)
    with pytest.raises(ValueError, match="unknown family 'gpt'"):
        ObjectiveArgs(family="gpt")
    with pytest.raises(ValueError, match="batch_size 10 is not divisible by grad_accum 4"):
        OptimArgs(batch_size=10, grad_accum=4)
    with pytest.raises(TypeError, match="lr must be a number"):
        OptimArgs(lr="fast")
    with pytest.raises(ValueError, match="length .* at least 2"):
        CorpusArgs(length=1)
    with pytest.raises(ValueError, match="log_every must be a positive integer"):
        EvalArgs(log_every=0)
    with pytest.raises(ValueError, match="out .* is required"):
        CheckpointArgs(out="")
    with pytest.raises(ValueError, match="strategy must be one of ddp, fsdp"):
        SystemArgs(strategy="zero3")


def test_each_group_is_named_as_its_class():
    """``cfg.objective`` is an ``ObjectiveArgs``, ``cfg.corpus`` a ``CorpusArgs``, ...: the group's name and its
    class agree (``EvalArgs`` for ``evaluation``, ``CheckpointArgs`` for ``checkpointing``)."""
    from setdlm.training.config import GROUPS

    cfg = TrainConfig(out="r")
    for group, cls in GROUPS.items():
        assert group.startswith(cls.__name__.removesuffix("Args").lower()) and isinstance(getattr(cfg, group), cls)


def test_flat_and_grouped_construction_agree():
    flat = TrainConfig(out="r", steps=7, hidden_size=48, n_heads=4, D=3)
    grouped = TrainConfig(checkpointing=CheckpointArgs(out="r"), optim=OptimArgs(steps=7),
                          model=ModelArgs(hidden_size=48, n_heads=4), objective=ObjectiveArgs(D=3))
    assert flat == grouped and flat.steps == flat.optim.steps == 7 and flat.to_dict() == grouped.to_dict()
    assert flat.replace(steps=9).optim.steps == 9 and flat.optim.steps == 7
    with pytest.raises(AttributeError, match="use cfg.replace"):
        flat.steps = 9
    with pytest.raises(TypeError, match="unknown training argument.*'stepz'"):
        TrainConfig(out="r", stepz=3)
    with pytest.raises(TypeError, match="give steps inside optim="):
        TrainConfig(out="r", optim=OptimArgs(), steps=3)
    with pytest.raises(ValueError, match="eval_ema needs EMA weights"):  # a check across groups
        TrainConfig(out="r", eval_ema=True)
    with pytest.raises(ValueError, match="M"):  # the family's knobs against the data's context length
        TrainConfig(out="r", length=8, D=2, M=16)


@pytest.mark.parametrize("given, name, families", [
    (dict(family="ar", D=8), "D", "setdlm"),
    (dict(family="ar", D=4), "D", "setdlm"),  # given is given, even at the default
    (dict(family="mdlm", keep_clean_bos=True), "keep_clean_bos", "setdlm"),
    (dict(family="ar", block_size=4), "block_size", "bd3lm and mdlm"),
    (dict(objective=ObjectiveArgs(family="bd3lm", M=6)), "M", "setdlm"),  # a group's knob off its default
])
def test_a_knob_of_another_family_is_refused_by_the_library(given, name, families):
    family = given.get("family") or given["objective"].family
    with pytest.raises(UserError) as e:
        TrainConfig(out="r", **given)
    assert str(e.value) == f"{name} applies to {families}, not to family {family!r}" and e.value.fields == (name,)
    with pytest.raises(UserError, match=f"^{name} applies to"):  # an override of a preset, a replace
        TrainConfig.from_preset("tiny", out="r", **given)
    if "objective" not in given:
        with pytest.raises(UserError, match=f"^{name} applies to"):
            TrainConfig(out="r", family=family).replace(**{k: v for k, v in given.items() if k != "family"})


def test_values_a_preset_or_a_record_brings_are_not_refused():
    cfg = TrainConfig.from_preset("lm1b", out="r", family="ar")  # lm1b sets D, block_size, keep_clean_bos
    assert (cfg.family, cfg.D, cfg.block_size, cfg.keep_clean_bos) == ("ar", 4, 4, True)
    assert cfg.replace(steps=3).steps == 3 and TrainConfig(objective=ObjectiveArgs(family="ar"), out="r").D == 4
    old = TrainConfig.from_record({"family": "ar", "D": 8, "out": "r", "retired_field": 1}, steps=3)
    assert (old.D, old.steps) == (8, 3)  # an old run that recorded D for AR still loads and resumes
    with pytest.raises(UserError, match="^D applies to setdlm, not to family 'ar'"):
        TrainConfig.from_record({"family": "ar", "out": "r"}, D=2)


def test_eval_ema_scores_the_ema_weights_and_leaves_the_raw_ones(tmp_path):
    """``eval_ema`` evaluates with the EMA weights swapped into the model for the evaluation only: the bound
    logged is the saved EMA weights' bound, and training goes on from the raw weights as without it."""
    kw = dict(data=write_hamlet(tmp_path / "hamlet.txt", 4000), family="setdlm", D=2, length=32, hidden_size=16,
              n_layers=1, n_heads=2, batch_size=4, lr=3e-3, warmup=1, ema=0.9, dropout=0.1, steps=4, eval_every=2,
              save_every=0, eval_fraction=0.1, eval_max=8, eval_batch_size=8, log_every=1)
    plain = train(TrainConfig(out=str(tmp_path / "plain"), **kw))
    swapped = train(TrainConfig(out=str(tmp_path / "ema"), eval_ema=True, **kw))
    for name in ("model", "ema"):
        a, b = (load_file(r.checkpoint / f"{name}.safetensors") for r in (plain, swapped))
        assert all(torch.equal(a[k], b[k]) for k in a), name
    ema = setdlm.load(swapped.checkpoint, ema=True)
    args = json.loads((swapped.checkpoint / "config.json").read_text())["training"]
    bound = likelihood(ema, heldout_of(args, ema.tokenizer).batches(8), seed=args["eval_seed"], progress=False)
    assert bound.nats_per_token == pytest.approx(swapped.eval["nelbo"], rel=1e-9)
    assert swapped.eval["nelbo"] != plain.eval["nelbo"]
