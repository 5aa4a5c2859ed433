"""Checkpoints by path, evaluated: what ``setdlm eval`` and ``setdlm bench`` run (docs/evaluation.md).

:func:`evaluate_checkpoint` measures one checkpoint on a :class:`~setdlm.evaluation.spec.TaskSpec` and
returns the JSON-ready result; :func:`bench_checkpoints` sweeps decoding settings over several
(:mod:`setdlm.evaluation.sweeps`) and writes their table, plot and points (:mod:`setdlm.evaluation.reports`).
What differs between tasks is the task's registry entry (:mod:`setdlm.evaluation.registry`). Every argument is checked
before any model is
loaded; bad ones are :class:`setdlm.errors.UserError`\\ s naming the argument.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from ..decoding.settings import DecodeSettings
from ..data.tasks import LEVELS
from ..errors import InputWarning, UserError
from ..formats.loading import check_dtype, load
from ..lm import Model
from ..outputs import check_file, check_folder, write_text
from . import reports, sweeps
from .examples import task_examples, write_predictions
from .likelihood import training_args
from .passes import EvalRun, drain
from .registry import decoding, using
from .spec import TaskSpec
from .sweeps import BenchSpec


@dataclass(frozen=True)
class LoadOptions:
    """How an evaluation loads its checkpoints (:func:`setdlm.load`'s options): the ``ema`` weights, the
    ``device``, the ``dtype`` of the weights (bench: several, each checkpoint in each, side by side; docs/decoding.md
    "Precision"), a CPU ``quantize`` scheme. The dtypes are checked when built."""

    ema: bool = False
    device: str = "cpu"
    dtype: str | torch.dtype | Sequence[str | torch.dtype] | None = None
    quantize: str | None = None

    def __post_init__(self):
        for d in self.dtypes:
            check_dtype(d)

    @property
    def dtypes(self) -> list:
        """The dtypes, one or several; ``[None]`` (as stored) when none is given."""
        if self.dtype is None or isinstance(self.dtype, (str, torch.dtype)):
            return [self.dtype]
        return list(self.dtype) or [None]  # [] as None: as stored

    @staticmethod
    def of(load: LoadOptions | None, knobs: dict, what: str) -> LoadOptions:
        """``load`` (None: ``LoadOptions()``); a LoadOptions field among the keywords ``knobs`` of ``what`` (the
        way these options were once given) is a ``TypeError`` that says where it goes now."""
        named = [f.name for f in fields(LoadOptions) if f.name in knobs]
        if named:
            raise TypeError(f"{what}() takes {named[0]} in load=LoadOptions({named[0]}=...), not as a keyword")
        return LoadOptions() if load is None else load

    def load(self, checkpoint: str | Path, dtype: str | torch.dtype | None = None):
        """``checkpoint`` loaded with these options, in ``dtype`` (one of :attr:`dtypes`)."""
        return load(checkpoint, ema=self.ema, device=self.device, dtype=check_dtype(dtype), quantize=self.quantize)


def _check_options(spec: TaskSpec, run: EvalRun, *, bf16: bool, predictions: str | Path | None) -> None:
    """The options of an evaluation that apply to some tasks only (``Task.options``)."""
    for name, given in (("clock", run.clock is not None), ("bf16", bf16), ("predictions", predictions is not None)):
        if given and name not in spec.entry.options:
            raise UserError(f"{name} applies to task {'/'.join(using('options', name))}, not {spec.task}",
                            fields=(name, "task"))
    if run.warmup is not None and not spec.decoding:
        raise UserError(f"warmup applies to task {'/'.join(decoding())}, not {spec.task}", fields=("warmup", "task"))
    if run.seed is not None:
        raise UserError("the seed of an evaluation by path is the TaskSpec's: leave the EvalRun's seed unset",
                        fields=("seed",))


def decode_record(settings: DecodeSettings, **task) -> dict:
    """The settings that differ from the defaults, and the task's own decoding arguments that were given
    (recorded as ``"decode"`` in the JSON results)."""
    changed = {f.name: getattr(settings, f.name) for f in fields(DecodeSettings)
               if getattr(settings, f.name) != f.default}
    return {**changed, **{k: v for k, v in task.items() if v is not None}}


def evaluate_checkpoint(checkpoint: str | Path, task: TaskSpec | str = "likelihood",
                        settings: DecodeSettings | None = None, run: EvalRun | None = None, *, bf16: bool = False,
                        predictions: str | Path | None = None, load: LoadOptions | None = None,
                        **keywords) -> dict:
    """Evaluate a checkpoint (folder, run folder or shipped name) on ``task`` and return the JSON-ready result
    that ``setdlm eval`` prints.

    ``task``: a :class:`TaskSpec`, or a task name and the TaskSpec fields as keywords (``data=``,
    ``level=``, ``n=``, ...). A task that does not decode (likelihood:
    :func:`~setdlm.evaluation.likelihood.checkpoint_likelihood`, with ``data``, ``run.batch_size``, ``seed``,
    ``bf16``) gives its ``measure``. A decoding task (reasoning / parallel / infill / a registered one): the
    examples of :func:`~setdlm.evaluation.examples.task_examples` decoded and scored by the task's ``steps``
    (e.g. :func:`setdlm.evaluation.reasoning.reasoning`) with ``settings`` (a
    :class:`~setdlm.decoding.settings.DecodeSettings`, or its fields as keywords: ``threshold=``,
    ``window=``, ``max_new_tokens=``, ...) and ``run`` (an :class:`~setdlm.evaluation.passes.EvalRun`: its
    ``batch_size``, default 32, its ``clock`` and progress bar; the seed is the TaskSpec's), each example's
    prediction written to ``predictions`` (JSONL) when given. ``load``: how the checkpoint is loaded
    (:class:`LoadOptions`). Bad values are :class:`~setdlm.errors.UserError`\\ s raised before any loading."""

    spec, knobs = TaskSpec.of(task, keywords)
    run = EvalRun.of(run, knobs, "evaluate_checkpoint")
    load = LoadOptions.of(load, knobs, "evaluate_checkpoint")
    settings = DecodeSettings.of(settings, knobs, "evaluate_checkpoint")
    spec.check_settings(settings)
    _check_options(spec, run, bf16=bf16, predictions=predictions)
    if predictions is not None:
        check_file(predictions, "predictions")
    if len(load.dtypes) > 1:
        raise UserError("evaluate_checkpoint loads one dtype; setdlm bench compares several", fields=("dtype",))
    model = load.load(checkpoint, load.dtypes[0])
    entry = spec.entry
    if entry.measure is not None:  # a task that does not decode (registry.register)
        return entry.measure(model, checkpoint, spec, batch_size=run.batch_size, bf16=bf16)
    assert entry.steps is not None  # a decoding task (registry.register)
    settings = sweeps.fixed_settings(settings, {}, [model], spec.task, "evaluate_checkpoint")
    if spec.data is None:
        warn_other_data(spec, training_args(checkpoint).get("data"))
    examples, skipped = task_examples(spec, [model])
    task_args = entry.args(spec)
    result = drain(entry.steps(model, examples, settings, replace(run, seed=spec.seed), **task_args))
    if predictions is not None:
        write_predictions(predictions, examples, result, spec.task)
    decode = decode_record(settings, clock=run.clock, seed=spec.seed, **task_args)
    return {"task": spec.task, "family": model.family.family, "dtype": model.dtype, "data": spec.source,
            "split": spec.split or "test", "skipped_too_long": skipped, "decode": decode, **result.to_dict()}


def _kind(source: str) -> str:
    """What a data name holds, in one word: ``generated:medium`` and ``reasoning-medium`` are "reasoning",
    ``shakespeare-train`` is "shakespeare", a file is its own name."""
    name = source.rsplit(":", 1)[-1]
    return "reasoning" if name in LEVELS or name.startswith("reasoning") else name.split("-")[0]


def warn_other_data(spec: TaskSpec, trained_on: str | None) -> None:
    """An :class:`~setdlm.errors.InputWarning` when a task runs on its default text (no ``data``) and the model
    was trained on another kind of text (``arith-ar`` infilling Shakespeare: ROUGE 0): its score there says
    little; ``data`` picks the text."""
    if trained_on and _kind(str(trained_on)) != _kind(spec.source):
        warnings.warn(InputWarning(f"task {spec.task} runs on {spec.source} by default, but this model was trained "
                                   f"on {trained_on!r}: its score there says little; pass data (a file, folder or "
                                   "built-in corpus) to evaluate on the text it knows", fields=("data",)),
                      stacklevel=3)


def labels(paths: Sequence[str | Path]) -> list[str]:
    """Model labels: the run folder's name (a checkpoint inside RUN/checkpoints/ is named after RUN); repeated
    names get ``#2``, ``#3``, ..."""
    names = []
    for path in paths:
        p = Path(path).resolve()
        names.append(p.parent.parent.name if p.parent.name == "checkpoints" else p.name)
    return [n if names.count(n) == 1 else f"{n}#{names[:i + 1].count(n)}" for i, n in enumerate(names)]


@dataclass
class BenchRun:
    """What :func:`bench_checkpoints` measured and wrote."""

    points: list
    table: str  # the Markdown table (bench.md)
    files: tuple[Path, Path, Path]  # bench.md, bench.json, bench.png


def bench_checkpoints(checkpoints: Sequence[str | Path], task: TaskSpec | str, out: str | Path,
                      settings: DecodeSettings | None = None, bench: BenchSpec | None = None, *,
                      load: LoadOptions | None = None, **keywords) -> BenchRun:
    """Benchmark checkpoints on ``task`` (a :class:`TaskSpec`, or a task name and its fields as keywords)
    and write ``out``/bench.md, bench.json and bench.png (what ``setdlm bench`` runs).
    A decoding task: :func:`setdlm.evaluation.sweeps.sweep` over ``bench``'s lists (a
    :class:`~setdlm.evaluation.sweeps.BenchSpec`: ``thresholds``, default
    :data:`setdlm.evaluation.sweeps.THRESHOLDS`, ``windows`` (None = D), ``block_sizes`` (None = the model's)
    and ``batch_sizes`` (default 1), with ``sweep_speculate`` also each SetDLM window's self-speculative
    decode), the first ``bench.warmup`` examples untimed (default 50, at most a quarter of the examples), the other
    decoding settings fixed (``settings``, a :class:`~setdlm.decoding.settings.DecodeSettings`, or its fields
    as keywords); a task that does not decode (likelihood): its measure per checkpoint (on ``data`` or each
    run's held-out rows). ``load`` (:class:`LoadOptions`): its ``dtype`` may be several: each checkpoint in
    each, side by side, labelled ``NAME bfloat16`` (docs/decoding.md "Precision"). Every setting is checked
    before any model is loaded."""

    spec, knobs = TaskSpec.of(task, keywords)
    load = LoadOptions.of(load, knobs, "bench_checkpoints")
    settings = DecodeSettings.of(settings, knobs, "bench_checkpoints")
    bench = BenchSpec() if bench is None else bench
    if not spec.decoding and bench.given:
        names = ("thresholds", "windows", "block_sizes", "batch_sizes", "warmup", "sweep_speculate")
        raise UserError(f"{', '.join(names[:-1])} and {names[-1]} apply to the decoding tasks "
                        f"({'/'.join(decoding())})", fields=names)
    spec.check_settings(settings)
    _check_options(spec, EvalRun(clock=bench.clock), bf16=False, predictions=None)
    folder = check_folder(out)
    if spec.decoding:
        sweeps.check_unswept(settings)
    loaded = _load_all(checkpoints, load)
    meta: dict[str, Any] = {"task": spec.task, "checkpoints": {lab: str(c) for lab, c, _ in loaded},
                            "families": {lab: m.family.to_dict() for lab, _, m in loaded},
                            "dtypes": {lab: m.dtype for lab, _, m in loaded}}
    entry, models = spec.entry, [(lab, m) for lab, _, m in loaded]
    if entry.measure is not None:  # a task that does not decode (registry.register)
        points = [sweeps.measured_point(lab, m, spec.task, entry.measure(m, c, spec, batch_size=None, bf16=False))
                  for lab, c, m in loaded]
        meta["data"] = spec.source
    else:
        settings = sweeps.fixed_settings(settings, {}, [m for _, m in models], spec.task)
        examples, skipped = task_examples(spec, [m for _, m in models])
        warmup = min(50, len(examples) // 4) if bench.warmup is None else bench.warmup
        task_args = entry.args(spec)
        points = sweeps.sweep(models, spec.task, examples, settings, replace(bench, warmup=warmup),
                              task_args=task_args, seed=spec.seed)
        fixed = decode_record(settings, clock=bench.clock, seed=spec.seed, **task_args)
        meta.update(data=spec.source, split=spec.split or "test", examples=len(examples), skipped_too_long=skipped,
                    warmup=warmup, **{n: bench.grid(n) for n in ("thresholds", "windows", "block_sizes",
                                                                 "batch_sizes")},
                    speculate=bench.sweep_speculate, decode=fixed)
    table = reports.markdown_table(points)
    folder.mkdir(parents=True, exist_ok=True)
    md = write_text(folder / "bench.md", table, "out")
    js = reports.write_json(points, folder / "bench.json", **meta)
    png = reports.plot(points, folder / "bench.png", title=bench.title)
    return BenchRun(points, table, (md, js, png))


def _load_all(checkpoints: Sequence[str | Path], load: LoadOptions) -> list[tuple[str, str | Path, Model]]:
    """``(label, checkpoint, model)`` for each checkpoint in each of ``load``'s dtypes (labelled ``NAME bfloat16``
    when there are several)."""
    dtypes, names, per = load.dtypes, labels(checkpoints), len(checkpoints)
    if len(dtypes) > 1:  # each checkpoint in each precision, side by side, a curve each: "NAME bfloat16"
        names = [f"{n} {str(check_dtype(d)).removeprefix('torch.')}" for d in dtypes for n in names]
        checkpoints = [c for _ in dtypes for c in checkpoints]
    return [(lab, c, load.load(c, dtypes[i // per])) for i, (lab, c) in enumerate(zip(names, checkpoints))]
