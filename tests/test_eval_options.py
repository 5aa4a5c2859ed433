"""How an evaluation runs, as objects checked when built (docs/evaluation.md, "From Python"): ``EvalRun`` (batch
size, warm-up, clock, seed, progress) for every task's pass and for throughput, ``BenchSpec`` for a sweep
(``setdlm bench``), ``LoadOptions`` for the checkpoints; a bad value is a ``UserError`` naming the field. The
task registry decides how ``throughput`` decodes its items (``Task.example`` and ``Task.mode``), and the
functions of ``setdlm.evaluation`` stay small (docs/architecture.md)."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import setdlm
from setdlm.data.tasks import InfillExample, ReasoningExample
from setdlm.errors import UserError
from setdlm.evaluation import REGISTRY, BenchSpec, EvalRun, LoadOptions, evaluate_checkpoint, register
from setdlm.evaluation.registry import decoding, get_task, task_of
from setdlm.evaluation.sweeps import THRESHOLDS
from setdlm.evaluation.throughput import throughput

from support import save_tiny

SRC = Path(setdlm.__file__).resolve().parent


@pytest.mark.parametrize("field, value", [("batch_size", 0), ("batch_size", True), ("batch_size", 2.0),
                                          ("warmup", -1), ("warmup", "3"), ("clock", "gpu"), ("seed", "1"),
                                          ("seed", True), ("progress", "yes")])
def test_a_bad_eval_run_names_its_field(field, value):
    with pytest.raises(UserError, match=field) as caught:
        EvalRun(**{field: value})
    assert caught.value.fields == (field,)


def test_an_eval_run_fills_the_calls_defaults():
    assert EvalRun().options(batch_size=32, warmup=0) == {"batch_size": 32, "warmup": 0, "clock": "wall",
                                                          "progress": True}
    run = EvalRun(batch_size=4, warmup=1, clock="cpu", seed=3, progress=False)
    assert run.options(batch_size=1, warmup=50) == {"batch_size": 4, "warmup": 1, "clock": "cpu", "progress": False}
    assert EvalRun.of(None, {"threshold": 0.9}, "reasoning") == EvalRun()
    with pytest.raises(TypeError, match=r"reasoning\(\) takes batch_size in run=EvalRun\(batch_size=...\)"):
        EvalRun.of(None, {"batch_size": 2, "threshold": 0.9}, "reasoning")
    with pytest.raises(TypeError, match="run must be an EvalRun"):
        EvalRun.of({"batch_size": 2}, {}, "reasoning")  # type: ignore[arg-type]


@pytest.mark.parametrize("field, value, named", [
    ("thresholds", [1.5], "thresholds must lie in"), ("windows", [0], "windows must be"),
    ("batch_sizes", [0], "batch sizes must be"), ("block_sizes", [-2], "block sizes must be"),
    ("warmup", -1, "warmup must be"), ("warmup", True, "warmup must be")])
def test_a_bad_sweep_list_is_named_as_setdlm_bench_prints_it(field, value, named):
    """The lists and the warm-up keep the words ``setdlm bench`` prints (docs/errors.md), flags unchanged."""
    with pytest.raises(UserError, match=named):
        BenchSpec(**{field: value})


@pytest.mark.parametrize("field, value", [("thresholds", 0.9), ("batch_sizes", "1,2"), ("clock", "gpu"),
                                          ("sweep_speculate", "yes"), ("progress", 1)])
def test_a_bad_bench_spec_names_its_field(field, value):
    with pytest.raises(UserError, match=field) as caught:
        BenchSpec(**{field: value})
    assert caught.value.fields == (field,)


def test_a_bench_spec_gives_the_default_lists_and_what_was_given():
    spec = BenchSpec()
    assert spec.grid("thresholds") == list(THRESHOLDS) and spec.grid("windows") == [None]
    assert spec.grid("batch_sizes") == [1] and spec.grid("block_sizes") == [None] and spec.given == ()
    spec = BenchSpec(thresholds=[None, 0.9], batch_sizes=[1, 4], warmup=0, sweep_speculate=True, clock="cpu")
    assert spec.grid("thresholds") == [None, 0.9] and spec.given == ("thresholds", "batch_sizes", "warmup",
                                                                      "sweep_speculate")


def test_load_options_check_the_dtypes():
    assert LoadOptions().dtypes == [None] and LoadOptions(dtype="bfloat16").dtypes == ["bfloat16"]
    assert LoadOptions(dtype=["float32", "bfloat16"]).dtypes == ["float32", "bfloat16"]
    with pytest.raises(UserError) as caught:
        LoadOptions(dtype=["float32", "float8"])
    assert caught.value.fields == ("dtype",)


@pytest.mark.parametrize("name", ["quantize", "dtype", "ema", "device"])
def test_a_load_option_given_as_a_keyword_says_where_it_goes(name):
    from setdlm.evaluation import bench_checkpoints

    with pytest.raises(TypeError, match=rf"takes {name} in load=LoadOptions\({name}=\.\.\.\)"):
        evaluate_checkpoint("no-such-checkpoint", "reasoning", **{name: "int8"})
    with pytest.raises(TypeError, match=rf"bench_checkpoints\(\) takes {name} in load=LoadOptions"):
        bench_checkpoints(["no-such-checkpoint"], "reasoning", "out", **{name: "int8"})


def test_an_evaluation_by_path_refuses_what_its_task_sets_before_loading():
    with pytest.raises(UserError, match="the TaskSpec's") as caught:
        evaluate_checkpoint("no-such-checkpoint", "reasoning", run=EvalRun(seed=1))
    assert caught.value.fields == ("seed",)
    with pytest.raises(UserError, match="warmup applies to task"):
        evaluate_checkpoint("no-such-checkpoint", run=EvalRun(warmup=1))
    with pytest.raises(UserError, match="clock applies to task"):
        evaluate_checkpoint("no-such-checkpoint", run=EvalRun(clock="cpu"))
    with pytest.raises(UserError, match="loads one dtype"):
        evaluate_checkpoint("no-such-checkpoint", load=LoadOptions(dtype=["float32", "bfloat16"]))


def test_every_decoding_task_takes_its_run_in_one_place():
    """The steps of every registered decoding task take ``(model, examples, settings, run, **args)``."""
    for name in decoding():
        params = list(inspect.signature(get_task(name).steps).parameters)
        assert params[:4] == ["model", "examples", "settings", "run"], name


# -- throughput asks the task registry ---------------------------------------------------------------------


def test_the_registry_says_whose_examples_an_item_is():
    problem = ReasoningExample("q", "a", 1)
    window = InfillExample("p", "m", "s")
    assert task_of(problem) is get_task("reasoning") and task_of(window) is get_task("infill")
    assert task_of("2+2=") is None and task_of([5, 6]) is None


@pytest.fixture
def toy():
    module = importlib.import_module("support.toy_task")
    if "toy" not in REGISTRY:
        register(module.TOY)
    yield module
    REGISTRY.pop("toy")


def test_throughput_decodes_a_registered_tasks_examples_as_its_task_does(toy, tmp_path):
    """The toy task registers ToyExample with mode generate: throughput continues each example's prompt, the
    same decode as the prompts given as strings; once the task is gone, its examples are not prompts."""
    model = setdlm.load(save_tiny(tmp_path / "ckpt"))
    examples = toy.draw(4, 0)
    run = EvalRun(warmup=1, progress=False)
    by_task = throughput(model, examples, run=run, max_new_tokens=4, ignore_eos=True)
    by_text = throughput(model, [e.prompt for e in examples], run=run, max_new_tokens=4, ignore_eos=True)
    assert (by_task.calls, by_task.tokens) == (3, 12)  # 4 examples at batch 1, the first untimed; 4 tokens each
    assert (by_task.tokens, by_task.nfe, by_task.row_nfe) == (by_text.tokens, by_text.nfe, by_text.row_nfe)
    REGISTRY.pop("toy")
    try:
        with pytest.raises(UserError, match="neither an example, a string nor a list of token ids"):
            throughput(model, examples, run=run, max_new_tokens=4)
    finally:
        register(toy.TOY)


# -- small functions ---------------------------------------------------------------------------------------

# the one exception (docs/architecture.md): lm-eval passes every model argument as a keyword of the constructor
LARGE = {"harness.py:SetDLMLM.__init__"}


def test_evaluation_functions_stay_small():
    """No function of setdlm.evaluation takes more than 8 parameters or runs over 80 lines."""
    found = []
    for path in sorted((SRC / "evaluation").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        owners = {id(f): c.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body}
        for f in ast.walk(tree):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = f.args
                n = len(a.posonlyargs + a.args + a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
                name = f"{path.name}:{owners[id(f)] + '.' if id(f) in owners else ''}{f.name}"
                if (n > 8 or f.end_lineno - f.lineno + 1 > 80) and name not in LARGE:
                    found.append(f"{name}: {n} parameters, {f.end_lineno - f.lineno + 1} lines")
    assert not found, found
