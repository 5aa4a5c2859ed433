"""What an evaluation measures: :class:`TaskSpec`, built once by ``setdlm eval``/``bench``, the demo and
Python callers, and checked when built (docs/evaluation.md).

A task is an entry of :data:`setdlm.evaluation.registry.REGISTRY`: the likelihood bound (docs/method.md §5.1),
reasoning accuracy (§5.2), the parallel-dependency suite, or sentence infilling (§5.4). The fields that pick
its examples apply to some tasks only (``Task.fields``); giving one to another task, or a value out of range,
is a :class:`setdlm.errors.UserError` naming the field, raised before any model is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..data.tasks import LEVELS, SPLITS
from ..decoding.settings import DecodeSettings, GENERATE_ONLY
from ..errors import UserError
from .registry import SPEC_FIELDS, Task, decoding, generating, get_task, using


@dataclass(frozen=True)
class TaskSpec:
    """The examples of an evaluation.

    ``task``: a registered task (:data:`~setdlm.evaluation.registry.REGISTRY`). ``data``: likelihood, a text source
    (default: the run's held-out rows);
    reasoning, a GSM8K-format JSONL (default: generated problems); infill, a text source (default the
    built-in ``shakespeare``); parallel takes none (its examples are generated). ``level`` (generated
    problems: easy, medium, hard; default medium), ``split`` (default test), ``n`` examples (default 200
    generated problems or suite examples; every infilling window that fits), ``hidden`` sentences of 5
    (infill: 1 or 3, default 1), ``eos`` (infill: EOS after the suffix), ``seed`` (the example draw and
    sampling; likelihood: the bound's orders and masks, default the run's). Unset fields are None; the
    properties give the defaults."""

    task: str = "likelihood"
    data: str | None = None
    level: str | None = None
    split: str | None = None
    n: int | None = None
    hidden: int | None = None
    eos: bool = False
    seed: int | None = None

    def __post_init__(self):

        task = get_task(self.task)
        for name in SPEC_FIELDS:
            if getattr(self, name) not in (None, False) and name not in task.fields:
                tasks = using("fields", name)
                raise UserError(f"{name} applies to task {'/'.join(tasks)}, not {self.task}", fields=(name, "task"))
        task.check(self)
        if self.level is not None and self.level not in LEVELS:
            raise UserError(f"level must be one of {', '.join(LEVELS)}, got {self.level!r}", fields=("level",))
        if self.split is not None and self.split not in SPLITS:
            raise UserError(f"split must be one of {', '.join(SPLITS)}, got {self.split!r}", fields=("split",))
        if self.n is not None and not (isinstance(self.n, int) and not isinstance(self.n, bool) and self.n >= 1):
            raise UserError(f"n must be a positive integer, got {self.n!r}", fields=("n",))
        if self.hidden is not None and self.hidden not in (1, 3):
            raise UserError(f"hidden must be 1 or 3 (of 5 sentences), got {self.hidden!r}", fields=("hidden",))
        if self.seed is not None and not (isinstance(self.seed, int) and not isinstance(self.seed, bool)):
            raise UserError(f"seed must be an integer, got {self.seed!r}", fields=("seed",))

    @classmethod
    def of(cls, task: TaskSpec | str, keywords: dict) -> tuple[TaskSpec, dict]:
        """``task`` (a :class:`TaskSpec`, or a task name completed by the TaskSpec fields among ``keywords``)
        and the keywords left; a TaskSpec and its fields together is a ``UserError``."""
        names = [f.name for f in fields(cls) if f.name != "task" and f.name in keywords]
        rest = {k: v for k, v in keywords.items() if k not in names}
        if isinstance(task, TaskSpec):
            if names:
                raise UserError(f"give a TaskSpec or its fields ({', '.join(names)}), not both")
            return task, rest
        return cls(task, **{k: keywords[k] for k in names}), rest

    @property
    def entry(self) -> Task:
        """The task's registry entry (:class:`~setdlm.evaluation.registry.Task`)."""
        return get_task(self.task)

    @property
    def decoding(self) -> bool:
        """True for the tasks that decode (all but likelihood)."""
        return self.entry.decodes

    @property
    def source(self) -> str:
        """The examples' source as results record it: ``data``, or the task's default (``generated:LEVEL``,
        ``generated:parallel``, ``shakespeare``)."""
        return self.data if self.data is not None else self.entry.source(self)

    def check_settings(self, settings: DecodeSettings) -> None:
        """Decoding settings apply to the decoding tasks; those of generate only (the budget, EOS stop, stop
        strings, cache order) to the tasks that generate."""
        for name in (f.name for f in fields(DecodeSettings) if getattr(settings, f.name) != f.default):
            tasks = generating() if name in GENERATE_ONLY else decoding()
            if self.task not in tasks:
                raise UserError(f"{name} applies to task {'/'.join(tasks)}, not {self.task}", fields=(name, "task"))
