"""The reports of a sweep (docs/evaluation.md, "Benchmarks"): a Markdown table, a Pareto plot and the raw
numbers as JSON, read back by :func:`read_json` (e.g. to plot several runs together).

The table has one row per :class:`~setdlm.evaluation.sweeps.BenchPoint` (quality under the task's
``header``, tokens/s, NFE, TPF, forwards/token, and × AR when the sweep holds an AR model), then the AUP of
each τ curve (:func:`setdlm.evaluation.metrics.aup_scores`). The plot needs matplotlib (extra ``plot``),
imported only when a plot is drawn.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Sequence
from pathlib import Path

from .. import __version__
from ..errors import UserError
from ..outputs import write_text
from .metrics import AUP_DROP, aup_scores
from .registry import Task, get_task
from .sweeps import BenchPoint, Setting, against_ar, pareto_front


def _tau(t: float | None) -> str:
    return "off" if t is None else f"{t:g}"


def _rate_unit(points: Sequence[BenchPoint]) -> str:
    return "tokens/CPU-s" if points[0].result.get("clock") == "cpu" else "tokens/s"


def _quality_text(task: Task, q: float) -> str:
    return f"{100 * q:.1f}" if task.percent else f"{q:.4f}"


def _dash(v) -> str:
    return "–" if v is None else str(v)


def _per_task(points: Sequence[BenchPoint]) -> list[str]:
    """The tasks of the parallel suite that the points report accuracies for (none for other tasks)."""
    return list(dict.fromkeys(t for p in points for t in p.result.get("per_task", {})))


def markdown_table(points: Sequence[BenchPoint]) -> str:
    """One row per point: model, family, τ, w (``4 spec``: self-speculative), block size, batch, quality (and, for the
    parallel suite, the
    accuracy of each task), tokens/s, NFE/example, TPF, forwards/token; then, for a decoding sweep, the AUP of each
    curve
    (:func:`aup_scores`)."""
    if not points:
        raise UserError("no points to tabulate")
    task = get_task(points[0].task)
    head = task.header
    subtasks = _per_task(points)
    vs_ar = against_ar(points)
    ar_head = " × AR quality | × AR tok/s |" if vs_ar else ""
    rows = [f"| model | family | τ | w | block | batch | {head} | " + "".join(f"{t} (%) | " for t in subtasks)
            + f"{_rate_unit(points)} | NFE | TPF | forwards/token |{ar_head}",
            "|---" * (11 + len(subtasks) + 2 * bool(vs_ar)) + "|"]
    for i, p in enumerate(points):
        s = p.setting
        if p.tokens_per_second is None:
            speed = nfe = tpf = fpt = "–"
        else:
            speed = f"{p.tokens_per_second:.1f}" + (f" ± {p.tokens_per_second_std:.1f}"
                                                     if p.tokens_per_second_std is not None else "")
            nfe, tpf, fpt = f"{p.nfe:.1f}", f"{p.tokens_per_step:.2f}", f"{p.forwards_per_token:.3f}"
        tau, batch = (_tau(s.threshold), s.batch_size) if task.decodes else ("–", "–")
        per = "".join(f"{100 * p.result['per_task'][t]:.1f} | " if t in p.result.get("per_task", {}) else "– | "
                      for t in subtasks)
        rows.append(f"| {p.model} | {p.family} | {tau} | {_dash(s.window)}{_spec(s.speculate)} | "
                    f"{_dash(s.block_size)} | {batch} | "
                    f"{_quality_text(task, p.quality)} | {per}{speed} | {nfe} | {tpf} | {fpt} |"
                    + ("".join(f" {r:.2f}x |" for r in vs_ar[i]) if i in vs_ar else " – | – |" if vs_ar else ""))
    scores = aup_scores(points)
    if scores:
        rows += ["", f"AUP over τ (d3LLM's accuracy under parallelism: ρ = TPF, y = {head}, only points within "
                 f"{AUP_DROP:g} of the least parallel one's y count; y_max = {scores[0].y_max:.1f}):", "",
                 "| model | family | w | block | batch | AUP | points counted | max TPF counted |",
                 "|---|---|---|---|---|---|---|---|"]
        rows += [f"| {a.model} | {a.family} | {_dash(a.window)}{_spec(a.speculate)} | {_dash(a.block_size)} | "
                 f"{a.batch_size} | "
                 f"{a.aup:.1f} | {a.counted} of {a.points} | {a.max_tpf:.2f} |" for a in scores]
    return "\n".join(rows) + "\n"


def _spec(speculate) -> str:
    """The table's mark of a speculative point: " spec" (verified by the ``window=1`` decode), " next-token"
    (by the next-token head), or nothing."""
    return {True: " spec", "next_token": " next-token"}.get(speculate, "")


def plot(points: Sequence[BenchPoint], path: str | Path, *, title: str | None = None, dpi: int = 100) -> Path:
    """Write a PNG. Decoding tasks, two panels: quality against tokens/s, one curve per model (per model and
    batch size when several batch sizes were swept) through its Pareto front, every point marked and
    labelled with its τ; and quality against TPF, one curve per model, window, block size and batch through
    its points in τ order, its AUP in the legend. Likelihood: a bar per model. Needs matplotlib
    (``pip install 'setdlm[plot]'``)."""
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError("the plot needs matplotlib: pip install 'setdlm[plot]'") from e
    if not points:
        raise UserError("no points to plot")
    task = get_task(points[0].task)
    decoding = task.decodes
    fig = Figure(figsize=(12 if decoding else 7, 4.5), dpi=dpi, layout="constrained")
    ax, *tpf_ax = fig.subplots(1, 2 if decoding else 1, squeeze=False)[0]
    if not decoding:
        labels = [p.model for p in points]
        ax.barh(labels, [p.quality for p in points], color="tab:blue")
        ax.invert_yaxis()
        ax.set_xlabel(f"{task.title} ({task.header})")
    else:
        several = len({p.setting.batch_size for p in points}) > 1
        series: dict[str, list[BenchPoint]] = {}
        for p in points:
            series.setdefault(p.model + (f" (batch {p.setting.batch_size})" if several else ""), []).append(p)
        for name, pts in series.items():
            front = sorted(pareto_front(pts), key=lambda p: p.tokens_per_second or 0.0)  # None as pareto_front reads it
            line, = ax.plot([p.tokens_per_second for p in front], [100 * p.quality for p in front], "-o",
                            markersize=5, label=name)
            ax.plot([p.tokens_per_second for p in pts], [100 * p.quality for p in pts], "o", color=line.get_color(),
                    markersize=4, alpha=0.4)
            for p in pts:
                ax.annotate(_tau(p.setting.threshold), (p.tokens_per_second, 100 * p.quality), fontsize=6,
                            xytext=(2, 2), textcoords="offset points", color=line.get_color())
        ax.set_xlabel(_rate_unit(points) + ("" if several else " (mean per example, batch 1)"))
        ax.set_ylabel(task.header)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        _plot_tpf(tpf_ax[0], points, ax.get_ylabel())
    ax.set_title(title or f"{task.name}: quality vs speed")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def _plot_tpf(ax, points: Sequence[BenchPoint], ylabel: str) -> None:
    """Quality against TPF, one line per AUP curve through its points sorted by TPF."""
    scores = {(a.model, a.window, a.block_size, a.batch_size): a for a in aup_scores(points)}
    for key, a in scores.items():
        pts = sorted((p for p in points if (p.model, p.setting.window, p.setting.block_size,
                                            p.setting.batch_size) == key), key=lambda p: p.tokens_per_step or 0.0)
        name = a.model + "".join(f" {k}={v}" for k, v in (("w", a.window), ("S", a.block_size)) if v is not None)
        name += f" (batch {a.batch_size})" if len({p.setting.batch_size for p in points}) > 1 else ""
        ax.plot([p.tokens_per_step for p in pts], [100 * p.quality for p in pts], "-o", markersize=4,
                label=f"{name}: AUP {a.aup:.1f}")
    ax.set_xlabel("tokens per forward (TPF)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("quality vs parallelism (hardware-independent)")


def read_json(path: str | Path) -> list[BenchPoint]:
    """The points of a JSON written by :func:`write_json` (e.g. to plot several benchmark runs together)."""
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    names = {f for f in Setting.__dataclass_fields__}
    derived = {"forwards_per_token"}
    return [BenchPoint(**{k: v for k, v in d.items() if k not in names | derived},
                       setting=Setting(**{k: d[k] for k in names if k in d})) for d in doc["points"]]


def write_json(points: Sequence[BenchPoint], path: str | Path, **meta) -> Path:
    """The raw numbers of every point, with ``meta`` (task settings, checkpoints) and the software versions."""
    import torch


    doc = {**meta, "versions": {"setdlm": __version__, "torch": torch.__version__, "python": platform.python_version()},
           "points": [p.to_dict() for p in points], "aup": [a.to_dict() for a in aup_scores(points)]}
    return write_text(path, json.dumps(doc, indent=2) + "\n", "out")
