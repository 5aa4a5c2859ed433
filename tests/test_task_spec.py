"""What an evaluation measures is one TaskSpec, checked when built; a run's held-out bound is rebuilt by the
evaluation package alone, equal to the trainer's (docs/evaluation.md)."""

import json

import pytest
import torch

import setdlm
import setdlm.cli.commands
from setdlm.decoding import DecodeSettings
from setdlm.errors import UserError, as_flags
from setdlm.evaluation import (TaskSpec, checkpoint_likelihood, evaluate_checkpoint, heldout_rows, task_examples,
                               training_args)

from support import write_hamlet


def test_defaults_and_sources():
    assert TaskSpec().task == "likelihood" and not TaskSpec().decoding
    assert TaskSpec("reasoning").source == "generated:medium" and TaskSpec("reasoning", level="hard").source == (
        "generated:hard")
    assert TaskSpec("infill").source == "shakespeare" and TaskSpec("parallel").source == "generated:parallel"
    assert TaskSpec("infill", data="t.txt", hidden=3, eos=True, n=4, seed=2).source == "t.txt"


@pytest.mark.parametrize("kwargs, message, flags", [
    (dict(task="bogus"), "unknown task 'bogus'; choose one of likelihood, reasoning, infill, parallel",
     "unknown --task 'bogus'"),
    (dict(task="infill", level="easy"), "level applies to task reasoning, not infill",
     "--level applies to --task reasoning, not infill"),
    (dict(task="likelihood", n=3), "n applies to task reasoning/infill/parallel, not likelihood",
     "--n applies to --task reasoning/infill/parallel, not likelihood"),
    (dict(task="reasoning", eos=True), "eos applies to task infill, not reasoning",
     "--eos applies to --task infill, not reasoning"),
    (dict(task="parallel", data="x.jsonl"), "data does not apply to task parallel", "--data does not apply to --task"),
    (dict(task="reasoning", level="medium_rare"), "level must be one of easy, medium, hard", "--level must be one"),
    (dict(task="reasoning", split="dev"), "split must be one of train, validation, test", "--split must be one"),
    (dict(task="reasoning", n=0), "n must be a positive integer, got 0", "--n must be a positive integer, got 0"),
    (dict(task="reasoning", n=True), "n must be a positive integer, got True", "--n must be"),
    (dict(task="infill", hidden=2), "hidden must be 1 or 3 (of 5 sentences), got 2", "--hidden must be 1 or 3"),
    (dict(task="infill", seed="1"), "seed must be an integer, got '1'", "--seed must be an integer"),
    (dict(task="reasoning", data="no/such.jsonl"), "GSM8K file 'no/such.jsonl' does not exist", "GSM8K file"),
])
def test_bad_fields_are_user_errors_naming_the_field(kwargs, message, flags):
    with pytest.raises(UserError) as e:
        TaskSpec(**kwargs)
    assert str(e.value).startswith(message) and as_flags(e.value).startswith(flags)


def test_a_gsm8k_file_takes_no_level(tmp_path):
    f = tmp_path / "g.jsonl"
    f.write_text('{"question": "1 + 1?", "answer": "#### 2"}\n')
    assert TaskSpec("reasoning", data=str(f)).source == str(f)
    with pytest.raises(UserError, match=f"level applies to generated problems; data {f} is a GSM8K file"):
        TaskSpec("reasoning", data=str(f), level="easy")


def test_one_spec_or_its_fields_and_the_settings_that_apply():
    spec, rest = TaskSpec.of("reasoning", {"level": "easy", "n": 3, "threshold": 0.5})
    assert spec == TaskSpec("reasoning", level="easy", n=3) and rest == {"threshold": 0.5}
    assert TaskSpec.of(spec, {"window": 2}) == (spec, {"window": 2})
    with pytest.raises(UserError, match=r"give a TaskSpec or its fields \(n\), not both"):
        TaskSpec.of(spec, {"n": 4})
    spec.check_settings(DecodeSettings(threshold=0.5, max_new_tokens=8))
    with pytest.raises(UserError, match="max_new_tokens applies to task reasoning/parallel, not infill"):
        TaskSpec("infill").check_settings(DecodeSettings(max_new_tokens=8))
    with pytest.raises(UserError, match="threshold applies to task reasoning/infill/parallel, not likelihood"):
        TaskSpec().check_settings(DecodeSettings(threshold=0.5))


def test_examples_of_a_spec_fit_every_model():
    model = setdlm.load("arith-ar")
    examples, skipped = task_examples(TaskSpec("reasoning", level="easy", n=5, seed=1), [model])
    assert len(examples) == 5 and skipped >= 0
    again, _ = task_examples(TaskSpec("reasoning", level="easy", n=5, seed=1), [model])
    assert [e.question for e in again] == [e.question for e in examples]  # the seed draws them
    with pytest.raises(UserError, match="task likelihood has no examples to decode"):
        task_examples(TaskSpec(), [model])


def test_the_heldout_bound_is_the_trainers(tmp_path):
    """The evaluation package rebuilds a run's held-out rows from its recorded arguments and scores them with
    the one estimator: the bound the trainer logged for the saved weights, without the training code."""
    torch.set_num_threads(1)
    data, run = write_hamlet(tmp_path / "hamlet.txt", 6000), tmp_path / "run"
    assert setdlm.cli.main(["train", "--out", str(run), "--data", str(data), "--family", "ar", "--length", "32",
                            "--hidden-size", "32", "--steps", "2", "--eval-every", "2", "--save-every", "0",
                            "--eval-fraction", "0.2", "--eval-max", "6", "--split-seed", "3", "--eval-seed", "5",
                            "--eval-batch-size", "4"]) == 0
    logged = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
              if r.get("split") == "heldout"][-1]
    model, args = setdlm.load(run), training_args(run)
    assert len(heldout_rows(args, model.tokenizer)) == 6
    got = checkpoint_likelihood(model, args)
    assert got["task"] == "likelihood" and got["tokens"] == logged["tokens"]
    assert got["nelbo"] == pytest.approx(logged["nelbo"], rel=1e-9)
    assert evaluate_checkpoint(run) == got  # what `setdlm eval RUN` prints
    with pytest.raises(UserError, match="the run records no eval_max, split_seed"):
        heldout_rows({k: v for k, v in args.items() if k not in ("eval_max", "split_seed")}, model.tokenizer)
