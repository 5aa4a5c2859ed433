"""Which task an evaluation measures: the task registry (docs/evaluation.md, "Adding a task").

Every rule that depends on the task lives in one :class:`Task` per task, registered by name
(:data:`REGISTRY`, as :mod:`setdlm.family` registers the families). :class:`~setdlm.evaluation.spec.TaskSpec`,
the examples, ``setdlm eval`` / ``setdlm bench`` (:mod:`setdlm.evaluation.runs`), the sweeps, the reports and
the command line's ``--task`` read the task's entry instead of comparing its name. Each task's file defines
and registers it (registration order is the order the choices and messages list the tasks in):

==============  ==========================================  ================  ==========================
task            examples                                    decoded by        quality
==============  ==========================================  ================  ==========================
``likelihood``  a text source, or the run's held-out rows   — (a bound)       nats/token (``nelbo``)
``reasoning``   generated problems, or a GSM8K JSONL        generate          exact-match accuracy
``infill``      5-sentence windows of a text source         fill              ROUGE-L
``parallel``    the parallel-dependency suite (generated)   generate          exact accuracy
==============  ==========================================  ================  ==========================

A new task is one file that builds a :class:`Task` and calls :func:`register` (``tests/support/toy_task.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..decoding.settings import DecodeSettings
from ..errors import UserError
from ..lm import Model
from .passes import DecodingRun, EvalRun

SPEC_FIELDS = ("level", "split", "n", "hidden", "eos")  # the TaskSpec fields that pick examples for some tasks
OPTIONS = ("clock", "predictions", "bf16")  # the evaluation options that apply to some tasks
MODES = ("generate", "fill")  # how a decoding task decodes (DecodeSettings.check_for's modes)


class TaskResult(Protocol):
    """What a decoding task's pass returns (besides its ``quality`` attribute, named by ``Task.quality``)."""

    @property
    def run(self) -> DecodingRun: ...  # what decoding cost, its speed included

    @property
    def predictions(self) -> tuple[str, ...]: ...  # one per example, in order

    def to_dict(self) -> dict: ...  # the numbers, JSON-ready (predictions left out)


class Steps(Protocol):
    """A decoding task's pass: ``(model, examples, settings, run, **args)`` (``args``: the task's own, from
    ``Task.args``), a generator that decodes and scores the examples, yields after every decoding call and returns
    a :class:`TaskResult`."""

    def __call__(self, model: Model, examples: Sequence[Any], settings: DecodeSettings | None = None,
                 run: EvalRun | None = None, **args: Any) -> Generator[None, None, TaskResult]: ...


class Measure(Protocol):
    """A task that does not decode: ``(model, checkpoint, spec, *, batch_size, bf16)`` -> its JSON-ready result
    (the ``quality`` key included)."""

    def __call__(self, model: Model, checkpoint: str | Path, spec: Any, *, batch_size: int | None,
                 bf16: bool) -> dict: ...


def _no_check(spec) -> None:
    return None


def _no_args(spec) -> dict:
    return {}


@dataclass(frozen=True)
class Task:
    """Everything that differs between the evaluation tasks."""

    name: str  # TaskSpec.task, the CLI's --task, the "task" of every result and bench point
    title: str  # "reasoning accuracy": the --task help's words
    quality: str  # the result field that is the task's quality (a BenchPoint's quality, the table's column)
    header: str  # that column's header and the plot's quality axis: "accuracy (%)"
    # the callables below take a TaskSpec, typed Any: evaluation.spec imports this module
    source: Callable[[Any], str]  # TaskSpec -> the examples' source as results record it (data when given)
    fields: tuple[str, ...] = ()  # the SPEC_FIELDS that apply to it (data and seed apply to every task)
    options: tuple[str, ...] = ()  # the OPTIONS that apply to it
    mode: str | None = None  # "generate" or "fill": the decode settings that apply; None: it does not decode
    percent: bool = True  # quality is a fraction in [0, 1], shown ×100 (False: shown as measured)
    check: Callable[[Any], None] = _no_check  # TaskSpec -> None: the task's own checks of its fields
    # (TaskSpec, models) -> (examples that fit every model, number skipped)
    examples: Callable[[Any, Sequence[Model]], tuple[list[Any], int]] | None = None
    steps: Steps | None = None  # decodes and scores the examples (a generator over the decoding calls)
    args: Callable[[Any], dict] = _no_args  # TaskSpec -> the task's own keyword arguments of ``steps``
    prediction: Callable[[Any, str], dict] | None = None  # (example, prediction) -> a --predictions JSONL row
    measure: Measure | None = None  # a task that does not decode: its result for a checkpoint
    example: type | None = None  # the class of its examples: throughput decodes a list of them as ``mode`` says
    notes: dict = field(default_factory=dict)  # TaskSpec field -> what it means for this task (the flags' help)

    @property
    def decodes(self) -> bool:
        """True for the tasks that decode examples (all but likelihood)."""
        return self.mode is not None


REGISTRY: dict[str, Task] = {}


def register(task: Task) -> Task:
    """Add ``task`` to :data:`REGISTRY` under its name; a name registered twice, or an entry that neither
    decodes nor measures, is a ``UserError``."""
    if task.name in REGISTRY:
        raise UserError(f"task {task.name!r} is registered already")
    if task.mode not in (None, *MODES):
        raise UserError(f"task {task.name!r}: mode must be one of {', '.join(MODES)} or None, got {task.mode!r}")
    parts = (task.examples, task.steps, task.prediction)
    if task.decodes and None in parts or not task.decodes and (task.measure is None or any(parts)):
        raise UserError(f"task {task.name!r}: a decoding task (mode set) gives examples, steps and prediction; "
                        "one that does not decode gives measure")
    unknown = [n for n in (*task.fields, *task.options) if n not in SPEC_FIELDS + OPTIONS]
    if unknown:
        raise UserError(f"task {task.name!r}: unknown fields or options {unknown}")
    REGISTRY[task.name] = task
    return task


def get_task(name: str) -> Task:
    """The registered task called ``name``; an unknown name is a ``UserError`` naming ``task``."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise UserError(f"unknown task {name!r}; choose one of {', '.join(REGISTRY)}", fields=("task",)) from None


def using(kind: str, name: str) -> tuple[str, ...]:
    """The tasks whose ``kind`` (``"fields"`` or ``"options"``) include ``name``, in registration order."""
    return tuple(t.name for t in REGISTRY.values() if name in getattr(t, kind))


def decoding() -> tuple[str, ...]:
    """The tasks that decode, in registration order."""
    return tuple(t.name for t in REGISTRY.values() if t.decodes)


def task_of(item: object) -> Task | None:
    """The first registered task whose examples (``Task.example``) ``item`` is one of; None for any other item
    (a prompt)."""
    return next((t for t in REGISTRY.values() if t.example is not None and isinstance(item, t.example)), None)


def generating() -> tuple[str, ...]:
    """The decoding tasks that generate (infilling fills a gap): those the generate-only settings apply to."""
    return tuple(t.name for t in REGISTRY.values() if t.mode == "generate")
