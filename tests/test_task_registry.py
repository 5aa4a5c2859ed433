"""The task registry (setdlm.evaluation.registry): one typed entry per task that the spec, the examples,
``setdlm eval`` / ``bench``, the sweeps, the reports and the CLI read, no task name compared anywhere else
in the package, and a task added in one file running through ``setdlm eval`` and ``setdlm bench``
(docs/evaluation.md, "Adding a task")."""

from __future__ import annotations

import ast
import importlib
import json
from dataclasses import fields
from pathlib import Path

import pytest

import setdlm
from setdlm.errors import UserError
from setdlm.evaluation import REGISTRY, Task, TaskSpec, get_task, register
from setdlm.evaluation.registry import OPTIONS, SPEC_FIELDS, decoding, generating, using

from support import png_size, run, save_tiny
from support.name_checks import literal_names, name_compares

SRC = Path(setdlm.__file__).resolve().parent
TASKS = ("likelihood", "reasoning", "infill", "parallel")
# the registry and the tasks' own files: the only places that decide by a task's name
OWNERS = {"evaluation/registry.py", *(f"evaluation/{t}.py" for t in TASKS)}


def task_dispatch(path: Path) -> list[str]:
    """``line: source`` of every decision by a task's name in ``path``: ``task == "infill"``, ``x != "likelihood"``,
    ``task in ("reasoning", "parallel")``, a dict keyed by task names, a table (tuple/list/set) of two or more
    task names. Not counted: the ``setdlm infill`` command's name (``args.command in ("generate", "infill")``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = name_compares(tree, TASKS, "command")
    compared = {id(x) for node in ast.walk(tree) if isinstance(node, ast.Compare) for x in node.comparators}
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and any(k is not None and literal_names(k, TASKS) for k in node.keys):
            found.append(f"{node.lineno}: dict keyed by task names {ast.unparse(node)[:60]}")
        elif (isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(literal_names(node, TASKS)) >= 2
              and id(node) not in compared):
            found.append(f"{node.lineno}: table of task names {ast.unparse(node)[:60]}")
    return found


def test_no_task_name_decisions_outside_the_registry_and_the_tasks_files():
    """Only the registry and each task's own file decide by a task's name; every other module reads the
    task's entry (``TaskSpec.entry``, ``get_task``)."""
    offenders = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in OWNERS:
            continue
        hits = task_dispatch(path)
        if hits:
            offenders[rel] = hits
    assert not offenders, f"task names compared outside the registry and the tasks' files: {offenders}"


def test_the_check_sees_every_form_of_dispatch(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('a = task == "infill"\nb = "likelihood" != spec.task\nc = t in ("reasoning", "parallel")\n'
                   'd = {"reasoning": 1, "other": 2}\nTASKS = ("likelihood", "reasoning")\n'
                   'e = args.command in ("generate", "infill")\nf = x == "infilling"\ng = f("infill")\n')
    assert [h.split(":")[0] for h in task_dispatch(src)] == ["1", "2", "3", "4", "5"]


def test_entries_name_real_fields_options_and_components():
    """Each entry's fields are TaskSpec fields, its options the evaluation's, and a decoding task gives its
    examples, decoding pass and prediction rows; one that does not decode gives its measure."""
    spec_fields = {f.name for f in fields(TaskSpec)}
    assert tuple(REGISTRY)[:4] == TASKS
    for task in (get_task(t) for t in TASKS):
        assert set(task.fields) <= set(SPEC_FIELDS) <= spec_fields and set(task.options) <= set(OPTIONS)
        assert task.decodes == (task.steps is not None) == (task.measure is None)
        if task.decodes:
            assert callable(task.examples) and callable(task.prediction) and task.mode in ("generate", "fill")
        assert isinstance(TaskSpec(task.name).source, str) and task.header and task.title


def test_derived_tables_are_the_documented_ones():
    """The tables read from the registry say what docs/evaluation.md and the error messages say."""
    assert decoding()[:3] == ("reasoning", "infill", "parallel") and generating()[:2] == ("reasoning", "parallel")
    assert {n: using("fields", n)[:3] for n in SPEC_FIELDS} == {
        "level": ("reasoning",), "split": ("reasoning", "infill", "parallel"), "n": ("reasoning", "infill", "parallel"),
        "hidden": ("infill",), "eos": ("infill",)}
    assert using("options", "bf16") == ("likelihood",) and using("options", "clock")[:3] == decoding()[:3]
    assert {t: get_task(t).quality for t in TASKS} == {"likelihood": "nelbo", "reasoning": "accuracy",
                                                       "infill": "rougeL", "parallel": "accuracy"}
    assert {t: get_task(t).header for t in TASKS} == {"likelihood": "nats/token", "reasoning": "accuracy (%)",
                                                      "infill": "ROUGE-L (×100)", "parallel": "accuracy (%)"}
    assert get_task("infill").args(TaskSpec("infill", eos=True)) == {"eos": True}
    assert get_task("reasoning").args(TaskSpec("reasoning")) == {}


def test_unknown_duplicate_and_incomplete_tasks_are_refused():
    with pytest.raises(UserError, match="unknown task 'bogus'; choose one of likelihood, reasoning, infill, parallel"):
        TaskSpec("bogus")
    with pytest.raises(UserError, match="task 'reasoning' is registered already"):
        register(get_task("reasoning"))
    with pytest.raises(UserError, match="a decoding task .* gives examples, steps and prediction"):
        register(Task("half", "t", "q", "h", source=str, mode="generate"))
    with pytest.raises(UserError, match="unknown fields or options"):
        register(Task("odd", "t", "q", "h", source=str, fields=("colour",), measure=print))
    assert "half" not in REGISTRY and "odd" not in REGISTRY


# -- a task added in one file ------------------------------------------------------------------------------


@pytest.fixture
def toy():
    """tests/support/toy_task.py registered (importing it registers it), and removed again afterwards so
    that no other test sees a fifth task."""
    module = importlib.import_module("support.toy_task")
    if "toy" not in REGISTRY:
        register(module.TOY)
    yield module
    REGISTRY.pop("toy")


def test_a_task_in_one_file_runs_through_setdlm_eval(toy, tmp_path, capsys):
    """``setdlm eval --task toy``: the toy's generated examples decoded by a saved model, scored by the toy's
    rule; the JSON line and the predictions file agree with the examples and with each other."""
    ckpt = save_tiny(tmp_path / "ckpt")
    code, out, err = run(["eval", ckpt, "--task", "toy", "--n", "5", "--seed", "3", "--batch-size", "2",
                          "--predictions", str(tmp_path / "pred.jsonl")], capsys)
    assert code == 0, err
    res = json.loads(out.strip().splitlines()[-1])
    assert res["task"] == "toy" and res["family"] == "setdlm" and res["data"] == "generated:toy"
    assert res["n"] == 5 and res["batch_size"] == 2 and res["skipped_too_long"] == 0
    assert res["max_new_tokens"] == 16 - max(len(e.prompt) for e in toy.draw(5, 3)) - 1  # the room after [BOS] word
    rows = [json.loads(line) for line in (tmp_path / "pred.jsonl").read_text().splitlines()]
    assert [(r["prompt"], r["reference"]) for r in rows] == [(e.prompt, e.completion) for e in toy.draw(5, 3)]
    assert all(r["agreement"] == toy.agreement(r["prediction"], r["reference"]) for r in rows)
    assert res["agreement"] == pytest.approx(sum(r["agreement"] for r in rows) / 5)
    assert res["generated_tokens"] > 0 and res["nfe"] > 0
    code, _, err = run(["eval", ckpt, "--task", "toy", "--level", "easy"], capsys)
    assert code == 2 and "--level applies to --task reasoning, not toy" in err  # its fields come from its entry


def test_a_task_in_one_file_runs_through_setdlm_bench(toy, tmp_path, capsys):
    """``setdlm bench --task toy``: a τ sweep of two checkpoints over the toy's examples; the table carries
    the toy's header, bench.json its points (quality = the toy's agreement), bench.png both panels."""
    a, b = save_tiny(tmp_path / "sd"), save_tiny(tmp_path / "ar", family="ar")
    code, out, err = run(["bench", a, b, "--task", "toy", "--n", "4", "--thresholds", "off,0.5", "--warmup", "1",
                          "--clock", "cpu", "--out", str(tmp_path / "b")], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert "| batch | agreement (%) | tokens/CPU-s |" in lines[0]
    assert [line.split(" | ")[:3] for line in lines[2:5]] == [["| sd", "setdlm", "off"], ["| sd", "setdlm", "0.5"],
                                                              ["| ar", "ar", "off"]]
    doc = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert doc["task"] == "toy" and doc["data"] == "generated:toy" and doc["examples"] == 4
    points = doc["points"]
    assert [(p["model"], p["threshold"]) for p in points] == [("sd", None), ("sd", 0.5), ("ar", None)]
    assert all(p["task"] == "toy" and p["quality"] == p["result"]["agreement"] for p in points)
    assert (tmp_path / "b" / "bench.md").read_text() == out
    width, height = png_size(tmp_path / "b" / "bench.png")
    assert width > height > 0  # two panels side by side


def test_the_guide_shows_the_toy_file_as_it_runs():
    """docs/evaluation.md's "Adding a task" block is tests/support/toy_task.py (its code, past the docstring),
    so the guide shows a task that the two tests above run."""
    guide = (SRC.parents[1] / "docs" / "evaluation.md").read_text(encoding="utf-8")
    section = guide[guide.index("## Adding a task"):]
    block = section[section.index("```python\n") + len("```python\n"):]
    block = block[:block.index("```")]
    toy = (Path(__file__).parent / "support" / "toy_task.py").read_text(encoding="utf-8")
    assert block == toy[toy.index("from __future__"):]
