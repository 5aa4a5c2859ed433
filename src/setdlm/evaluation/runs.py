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
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from ..decoding.settings import DecodeSettings
from ..data.tasks import LEVELS
from ..errors import InputWarning, UserError
from ..formats.loading import check_dtype, load
from ..outputs import check_file, check_folder, write_text
from . import reports, sweeps
from .examples import task_examples, write_predictions
from .likelihood import training_args
from .passes import CLOCKS, drain
from .registry import decoding, using
from .spec import TaskSpec


def _check_options(spec: TaskSpec, *, clock: str | None, batch_size: int | None, bf16: bool,
                   predictions: str | Path | None) -> None:
    """The options of an evaluation that apply to some tasks only (``Task.options``), and their values."""
    for name, given in (("clock", clock is not None), ("bf16", bf16), ("predictions", predictions is not None)):
        if given and name not in spec.entry.options:
            raise UserError(f"{name} applies to task {'/'.join(using('options', name))}, not {spec.task}",
                            fields=(name, "task"))
    if clock is not None and clock not in CLOCKS:
        raise UserError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}", fields=("clock",))
    if batch_size is not None and not (isinstance(batch_size, int) and batch_size >= 1):
        raise UserError(f"batch_size must be a positive integer, got {batch_size!r}", fields=("batch_size",))


def decode_record(settings: DecodeSettings, **task) -> dict:
    """The settings that differ from the defaults, and the task's own decoding arguments that were given
    (recorded as ``"decode"`` in the JSON results)."""
    changed = {f.name: getattr(settings, f.name) for f in fields(DecodeSettings)
               if getattr(settings, f.name) != f.default}
    return {**changed, **{k: v for k, v in task.items() if v is not None}}


def evaluate_checkpoint(checkpoint: str | Path, task: TaskSpec | str = "likelihood",
                        settings: DecodeSettings | None = None, *, clock: str | None = None,
                        batch_size: int | None = None, bf16: bool = False, ema: bool = False, device: str = "cpu",
                        predictions: str | Path | None = None, quantize: str | None = None, dtype: str | None = None,
                        **keywords) -> dict:
    """Evaluate a checkpoint (folder, run folder or shipped name) on ``task`` and return the JSON-ready result
    that ``setdlm eval`` prints.

    ``task``: a :class:`TaskSpec`, or a task name and the TaskSpec fields as keywords (``data=``,
    ``level=``, ``n=``, ...). A task that does not decode (likelihood:
    :func:`~setdlm.evaluation.likelihood.checkpoint_likelihood`, with ``data``, ``batch_size``, ``seed``,
    ``bf16``) gives its ``measure``. A decoding task (reasoning / parallel / infill / a registered one): the
    examples of :func:`~setdlm.evaluation.examples.task_examples` decoded and scored by the task's ``steps``
    (e.g. :func:`setdlm.evaluation.reasoning.reasoning`) with ``settings`` (a
    :class:`~setdlm.decoding.settings.DecodeSettings`, or its fields as keywords: ``threshold=``,
    ``window=``, ``max_new_tokens=``, ...), each example's prediction written to ``predictions`` (JSONL)
    when given. Bad values are :class:`~setdlm.errors.UserError`\\ s raised before any loading."""

    spec, knobs = TaskSpec.of(task, keywords)
    settings = DecodeSettings.of(settings, knobs, "evaluate_checkpoint")
    spec.check_settings(settings)
    _check_options(spec, clock=clock, batch_size=batch_size, bf16=bf16, predictions=predictions)
    if predictions is not None:
        check_file(predictions, "predictions")
    model = load(checkpoint, ema=ema, device=device, dtype=dtype, quantize=quantize)
    entry = spec.entry
    if not entry.decodes:
        return entry.measure(model, checkpoint, spec, batch_size=batch_size, bf16=bf16)
    settings = sweeps.fixed_settings(settings, {}, [model], spec.task, "evaluate_checkpoint")
    if spec.data is None:
        warn_other_data(spec, training_args(checkpoint).get("data"))
    examples, skipped = task_examples(spec, [model])
    task_args = entry.args(spec)
    result = drain(entry.steps(model, examples, settings, batch_size=batch_size or 32, warmup=0,
                               clock=clock or "wall", seed=spec.seed, progress=True, **task_args))
    if predictions is not None:
        write_predictions(predictions, examples, result, spec.task)
    decode = decode_record(settings, clock=clock, seed=spec.seed, **task_args)
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
                      settings: DecodeSettings | None = None, *, title: str | None = None,
                      thresholds: Sequence[float | None] | None = None, windows: Sequence[int | None] | None = None,
                      batch_sizes: Sequence[int] | None = None, block_sizes: Sequence[int | None] | None = None,
                      warmup: int | None = None, clock: str | None = None, ema: bool = False, device: str = "cpu",
                      sweep_speculate: bool = False, quantize: str | None = None,
                      dtype: str | Sequence[str] | None = None, **keywords) -> BenchRun:
    """Benchmark checkpoints on ``task`` (a :class:`TaskSpec`, or a task name and its fields as keywords)
    and write ``out``/bench.md, bench.json and bench.png (what ``setdlm bench`` runs).
    A decoding task: :func:`setdlm.evaluation.sweeps.sweep` over ``thresholds`` (default
    :data:`setdlm.evaluation.sweeps.THRESHOLDS`), ``windows`` (None = D), ``block_sizes`` (None = the model's)
    and ``batch_sizes`` (default 1), with ``sweep_speculate`` also each SetDLM window's self-speculative
    decode, the first ``warmup`` examples untimed (default 50, at most a quarter of the examples), the other
    decoding settings fixed (``settings``, a :class:`~setdlm.decoding.settings.DecodeSettings`, or its fields
    as keywords); a task that does not decode (likelihood): its measure per checkpoint (on ``data`` or each
    run's held-out rows). ``dtype``: the precision of the weights (:func:`setdlm.load`), or several: each
    checkpoint in each, side by side, labelled ``NAME bfloat16`` (docs/decoding.md "Precision"). Every setting is
    checked before any model is loaded."""

    spec, knobs = TaskSpec.of(task, keywords)
    settings = DecodeSettings.of(settings, knobs, "bench_checkpoints")
    swept = (thresholds, windows, batch_sizes, block_sizes, warmup is not None, sweep_speculate)
    if not spec.decoding and any(swept):
        names = ("thresholds", "windows", "block_sizes", "batch_sizes", "warmup", "sweep_speculate")
        raise UserError(f"{', '.join(names[:-1])} and {names[-1]} apply to the decoding tasks "
                        f"({'/'.join(decoding())})", fields=names)
    spec.check_settings(settings)
    _check_options(spec, clock=clock, batch_size=None, bf16=False, predictions=None)
    folder = check_folder(out)
    if spec.decoding:
        sweeps.check_sweep(thresholds or sweeps.THRESHOLDS, windows or [None], batch_sizes or [1],
                           50 if warmup is None else warmup, block_sizes or [None])
        sweeps.check_unswept(settings)
    single = dtype is None or isinstance(dtype, (str, torch.dtype))
    dtypes = [check_dtype(d) for d in ([dtype] if single else dtype)] or [None]  # [] as None: as stored
    names, per = labels(checkpoints), len(checkpoints)
    if len(dtypes) > 1:  # each checkpoint in each precision, side by side, a curve each: "NAME bfloat16"
        names = [f"{n} {str(d).removeprefix('torch.')}" for d in dtypes for n in names]
        checkpoints = [c for _ in dtypes for c in checkpoints]
    models = [load(c, ema=ema, device=device, dtype=dtypes[i // per], quantize=quantize)
              for i, c in enumerate(checkpoints)]
    meta = {"task": spec.task, "checkpoints": dict(zip(names, map(str, checkpoints))),
            "families": {lab: m.family.to_dict() for lab, m in zip(names, models)},
            "dtypes": {lab: m.dtype for lab, m in zip(names, models)}}
    entry = spec.entry
    if not entry.decodes:
        points = [sweeps.measured_point(lab, m, spec.task, entry.measure(m, c, spec, batch_size=None, bf16=False))
                  for c, lab, m in zip(checkpoints, names, models)]
        meta["data"] = spec.source
    else:
        settings = sweeps.fixed_settings(settings, {}, models, spec.task)
        examples, skipped = task_examples(spec, models)
        warmup = min(50, len(examples) // 4) if warmup is None else warmup
        thresholds, windows = list(thresholds or sweeps.THRESHOLDS), list(windows or [None])
        batch_sizes, block_sizes = list(batch_sizes or [1]), list(block_sizes or [None])
        task_args = entry.args(spec)
        points = sweeps.sweep(list(zip(names, models)), spec.task, examples, settings, thresholds=thresholds,
                              windows=windows, batch_sizes=batch_sizes, block_sizes=block_sizes, warmup=warmup,
                              clock=clock or "wall", seed=spec.seed, speculate=sweep_speculate, task_args=task_args)
        fixed = decode_record(settings, clock=clock, seed=spec.seed, **task_args)
        meta.update(data=spec.source, split=spec.split or "test", examples=len(examples), skipped_too_long=skipped,
                    warmup=warmup, thresholds=thresholds, windows=windows, block_sizes=block_sizes,
                    batch_sizes=batch_sizes, speculate=sweep_speculate, decode=fixed)
    table = reports.markdown_table(points)
    folder.mkdir(parents=True, exist_ok=True)
    md = write_text(folder / "bench.md", table, "out")
    js = reports.write_json(points, folder / "bench.json", **meta)
    png = reports.plot(points, folder / "bench.png", title=title)
    return BenchRun(points, table, (md, js, png))
