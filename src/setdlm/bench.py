"""Speed/quality sweeps of decoding settings: a Markdown table, a Pareto plot and the raw numbers
(docs/method.md §4.10, §5.2, §5.4, §6.1).

For each model and each setting that applies to its family (confidence threshold τ for SetDLM, BD3LM and
MDLM, AR committing exactly one token per step; window ``w`` for SetDLM; block size for BD3LM and MDLM;
batch size for all), one timed pass over the task's examples (:func:`setdlm.evaluate.reasoning`,
:func:`~setdlm.evaluate.parallel` / :func:`~setdlm.evaluate.infill`; the passes of all settings run side by
side, one decoding call of each in turn) gives

* quality: exact-match accuracy (reasoning, the parallel-dependency suite) or ROUGE-L F-measure
  (infilling), over every example;
* speed: at batch 1 the mean ± std of per-example tokens/s after the ``warmup`` first examples (the
  paper's number); at batch > 1 the aggregate tokens/s of the calls after the ``warmup`` first calls;
* NFE per example and tokens per forward (TPF: tokens committed per decoding step, one forward a step;
  prefill excluded), the decoder's own counts: the hardware-independent speed;
* AUP, d3LLM's "accuracy under parallelism" (:func:`aup`), of each model's curve over the τ sweep.
* for a speculative SetDLM point, TPF is the mean accepted length (tokens committed per verifying forward),
  and the table adds forwards per token.

The likelihood task has nothing to sweep: one bound (nats/token) per model. ``setdlm bench``
(:func:`setdlm.evaluation.bench_checkpoints`, checkpoints by path) wraps :func:`sweep`,
:func:`markdown_table`, :func:`plot` and :func:`write_json` (:func:`read_json` reads the points back, e.g.
to plot several runs together); the plot needs matplotlib (extra ``plot``), imported only when a plot is
drawn.
"""

from __future__ import annotations

import json
import math
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from tqdm.auto import tqdm

from .decoding.settings import SETTING_FAMILIES, DecodeSettings
from .errors import UserError
from .family import REGISTRY
from .lm import Model

THRESHOLDS = (None, 0.99, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6)  # docs/method.md §5.2: None = off (τ = 1e6)
DECODING_TASKS = ("reasoning", "infill", "parallel")
QUALITY = {"reasoning": "accuracy", "infill": "rougeL", "likelihood": "nats_per_token", "parallel": "accuracy"}


# ---------------------------------------------------------------------------------------------------------
# settings and points
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One decoding setting; None where it does not apply (or is the default)."""

    threshold: float | None = None  # τ; None = off (one token per step)
    window: int | None = None  # SetDLM window w (the effective one: the default is D)
    batch_size: int = 1
    block_size: int | None = None  # BD3LM/MDLM decoding block (the effective one: the default is the model's)
    speculate: bool = False  # SetDLM: lossless self-speculative decoding with window w (threshold off)

    def apply(self, base: DecodeSettings) -> DecodeSettings:
        """``base`` with this setting's threshold, window, block size and speculation (the sweep owns those:
        ``base`` leaves them unset, :func:`sweep` checks)."""
        return replace(base, threshold=self.threshold, window=self.window, block_size=self.block_size,
                       speculate=self.speculate or None)


SWEPT = ("threshold", "window", "block_size")  # the DecodeSettings fields a sweep owns (and speculate)


def check_settings(thresholds: Sequence[float | None], windows: Sequence[int | None], batch_sizes: Sequence[int],
                   warmup: int = 0, block_sizes: Sequence[int | None] = (None,)) -> None:
    """The sweep's settings, checked without any model (so ``setdlm bench`` fails before loading one)."""
    for t in thresholds:  # the ranges of DecodeSettings, named as the sweep's lists
        try:
            DecodeSettings(threshold=t)
        except ValueError:
            raise UserError(f"thresholds must lie in (0, 1] (or be None for off), got {t}") from None
    for w in windows:
        try:
            DecodeSettings(window=w)
        except ValueError:
            raise UserError(f"windows must be positive integers (or None for D), got {w!r}") from None
    for s in block_sizes:
        try:
            DecodeSettings(block_size=s)
        except ValueError:
            raise UserError(f"block sizes must be positive integers (or None for the model's), got {s!r}") from None
    for b in batch_sizes:
        if not (isinstance(b, int) and b >= 1):
            raise UserError(f"batch sizes must be positive integers, got {b!r}")
    if not (isinstance(warmup, int) and warmup >= 0):
        raise UserError(f"warmup must be a non-negative integer, got {warmup!r}")


def sweep_settings(model: Model, thresholds: Sequence[float | None] = THRESHOLDS,
                   windows: Sequence[int | None] = (None,), batch_sizes: Sequence[int] = (1,),
                   block_sizes: Sequence[int | None] = (None,), speculate: bool = False) -> list[Setting]:
    """The settings that apply to ``model``'s family: τ only for SetDLM/BD3LM/MDLM, w only for SetDLM (None
    = D), block sizes only for BD3LM/MDLM (None = the model's); with ``speculate``, also the self-speculative
    decode of each window ``w > 1`` (SetDLM only; it reproduces ``w = 1``, threshold off); each distinct
    setting once, in sweep order."""
    fam = model.family
    check_settings(thresholds, windows, batch_sizes, block_sizes=block_sizes)
    taus = thresholds if fam.family in SETTING_FAMILIES["threshold"] else [None]
    ws = [fam.D if w is None else w for w in windows] if fam.family in SETTING_FAMILIES["window"] else [None]
    ss = ([fam.block_size if s is None else s for s in block_sizes] if fam.family in SETTING_FAMILIES["block_size"]
          else [None])
    out = [Setting(t, w, b, s) for b in batch_sizes for s in ss for w in ws for t in taus]
    spec = speculate and fam.family in SETTING_FAMILIES["speculate"]
    out += [Setting(None, w, b, speculate=True) for b in batch_sizes for w in ws if spec and w > 1]
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class BenchPoint:
    """One model at one setting."""

    model: str  # label
    family: str
    task: str
    setting: Setting
    quality: float  # accuracy or ROUGE-L in [0, 1], or nats/token (likelihood)
    tokens_per_second: float | None  # batch 1: mean of per-example rates; batch > 1: aggregate rate
    tokens_per_second_std: float | None  # batch 1: std of per-example rates
    nfe: float | None  # forwards per example (prefill excluded)
    tokens_per_step: float | None  # TPF: tokens committed per forward (speculative: the mean accepted length)
    result: dict  # the evaluation's to_dict()

    @property
    def forwards_per_token(self) -> float | None:
        """Forwards per committed token (1 / tokens per step)."""
        return 1.0 / self.tokens_per_step if self.tokens_per_step else None

    def to_dict(self) -> dict:
        d = asdict(self)
        return {**{k: v for k, v in d.items() if k != "setting"}, **d["setting"],
                "forwards_per_token": self.forwards_per_token}


def _point(label: str, model: Model, task: str, setting: Setting, result) -> BenchPoint:
    run, speed = result.run, result.run.speed
    batch1 = setting.batch_size == 1
    return BenchPoint(model=label, family=model.family.family, task=task, setting=setting,
                      quality=getattr(result, QUALITY[task]),
                      tokens_per_second=speed.mean if batch1 else speed.aggregate,
                      tokens_per_second_std=speed.std if batch1 else None, nfe=run.nfe_per_example,
                      tokens_per_step=run.tokens_per_step, result=result.to_dict())


# ---------------------------------------------------------------------------------------------------------
# sweeps
# ---------------------------------------------------------------------------------------------------------


def sweep(models: Sequence[tuple[str, Model]], task: str, examples: Sequence, settings: DecodeSettings | None = None,
          *, thresholds: Sequence[float | None] = THRESHOLDS, windows: Sequence[int | None] = (None,),
          batch_sizes: Sequence[int] = (1,), block_sizes: Sequence[int | None] = (None,), warmup: int = 50,
          eos: bool = False, clock: str = "wall", seed: int | None = None, progress: bool = True,
          speculate: bool = False, **knobs) -> list[BenchPoint]:
    """Evaluate every ``(label, model)`` on ``examples`` (reasoning problems, parallel-suite examples or
    infilling examples) at every applicable setting. Speed skips the first ``warmup`` examples (rounded up to whole calls at batch > 1); quality
    counts every example. The settings run side by side (:func:`setdlm.evaluate.interleave`): one decoding
    call of each in turn, so that a drift of the machine's speed does not favour the settings timed first.
    ``settings`` (a :class:`~setdlm.decoding.settings.DecodeSettings`, or its fields as keywords:
    ``max_new_tokens``, ``temperature``, ``cache_order``, ``repetition_penalty``, ...) are the same for every
    point, bar the swept ``threshold``, ``window`` and ``block_size``;
    ``speculate`` adds each SetDLM window's self-speculative decode (:func:`sweep_settings`); ``eos`` (infill), ``clock`` and ``seed``
    go to :func:`setdlm.evaluate.reasoning` / :func:`~setdlm.evaluate.parallel` / :func:`~setdlm.evaluate.infill`."""
    from . import evaluate

    if task not in DECODING_TASKS:
        raise UserError(f"sweep task must be one of {', '.join(DECODING_TASKS)}, got {task!r} "
                        "(likelihood: likelihood_point)")
    if not models:
        raise UserError("no models to benchmark")
    base = fixed_settings(settings, knobs, [m for _, m in models], task)
    check_settings(thresholds, windows, batch_sizes, warmup, block_sizes)
    steps = {"reasoning": evaluate.reasoning_steps, "parallel": evaluate.parallel_steps,
             "infill": evaluate.infill_steps}[task]
    plan = [(label, model, s) for label, model in models
            for s in sweep_settings(model, thresholds, windows, batch_sizes, block_sizes, speculate=speculate)]
    n = len(examples)
    for b in batch_sizes:  # fail before the sweep starts, not in its middle
        if -(-warmup // b) >= -(-n // b):
            raise UserError(f"warmup={warmup} examples leave none of the {n} examples to time at batch size {b}")
    task_args = {"eos": eos} if task == "infill" else {}
    passes = [steps(model, examples, s.apply(base), batch_size=s.batch_size, warmup=-(-warmup // s.batch_size),
                    clock=clock, seed=seed, progress=False, **task_args) for _, model, s in plan]
    calls = sum(-(-n // s.batch_size) for _, _, s in plan)
    with tqdm(total=calls, desc=f"bench {task} ({len(plan)} settings side by side)", unit="call",
              disable=None if progress else True) as bar:
        results = evaluate.interleave(passes, progress=lambda: bar.update(1))
    return [_point(label, model, task, s, r) for (label, model, s), r in zip(plan, results)]


def likelihood_point(label: str, model: Model, result: dict) -> BenchPoint:
    """A likelihood result (:func:`setdlm.evaluation.checkpoint_likelihood`'s dict, ``nelbo`` in nats/token) as a point."""
    return BenchPoint(model=label, family=model.family.family, task="likelihood", setting=Setting(),
                      quality=result["nelbo"], tokens_per_second=None, tokens_per_second_std=None, nfe=None,
                      tokens_per_step=None, result=result)


def pareto_front(points: Sequence[BenchPoint]) -> list[BenchPoint]:
    """The points no other point beats on both speed and quality, fastest first."""
    front, best = [], float("-inf")
    for p in sorted(points, key=lambda p: (-(p.tokens_per_second or 0.0), -p.quality)):
        if p.quality > best:
            front.append(p)
            best = p.quality
    return front


# ---------------------------------------------------------------------------------------------------------
# AUP: accuracy under parallelism (d3LLM)
# ---------------------------------------------------------------------------------------------------------

AUP_ALPHA = 3.0  # d3LLM's penalty factor α
AUP_DROP = 5.0  # points more than this many percentage points below y_1 do not count


def aup_weight(y: float, y_max: float, alpha: float = AUP_ALPHA) -> float:
    """d3LLM's quality weight ``W(y) = min(exp(-α (1 - y / y_max)), 1)`` (1 when ``y_max`` is 0: then every
    y is 0 and the weight multiplies nothing)."""
    return 1.0 if y_max <= 0 else min(math.exp(-alpha * (1 - y / y_max)), 1.0)


def aup(rho: Sequence[float], y: Sequence[float], y_max: float | None = None, *, alpha: float = AUP_ALPHA,
        drop: float = AUP_DROP) -> float:
    """Accuracy Under Parallelism of parallelism/accuracy pairs, as d3LLM defines it (Qian et al., "AUP:
    when Accuracy Meets Parallelism in Diffusion Language Models", hao-ai-lab blog 2025, and the d3LLM
    repository's ``AUP_leaderboard``)::

        AUP = ρ_1 y_1 + 1/2 Σ_{i=2..m} (ρ_i - ρ_{i-1}) (y_i W(y_i) + y_{i-1} W(y_{i-1}))

    ``rho``: tokens per forward (TPF, > 0) of each point; ``y``: its accuracy in percent. The points are
    sorted by ρ ascending (equal ρ: the higher accuracy first), so ``y_1`` is the accuracy of the least
    parallel point; only points with ``y_i >= y_1 - drop`` count (5 points), and the sum runs over those in
    that order. ``W`` is :func:`aup_weight` with ``y_max`` the highest accuracy reached on the task, by any
    method (default the highest of ``y``); the first term is not weighted. One point gives ``ρ_1 y_1``
    (an AR model: its accuracy)."""
    rho, y = [float(r) for r in rho], [float(v) for v in y]
    if len(rho) != len(y) or not rho:
        raise UserError(f"aup needs as many accuracies as TPF values, at least one: got {len(rho)} and {len(y)}")
    if not all(r > 0 for r in rho):
        raise UserError(f"tokens per forward must be positive, got {rho}")
    if not all(0 <= v <= 100 for v in y):
        raise UserError(f"accuracies must be percentages in [0, 100], got {y}")
    y_max = max(y) if y_max is None else float(y_max)
    if y_max < max(y) or y_max > 100:
        raise UserError(f"y_max must be the highest accuracy on the task (>= {max(y)}, <= 100), got {y_max}")
    kept = aup_points(rho, y, drop)
    total = kept[0][0] * kept[0][1]
    for (r0, y0), (r1, y1) in zip(kept, kept[1:]):
        total += 0.5 * (r1 - r0) * (y1 * aup_weight(y1, y_max, alpha) + y0 * aup_weight(y0, y_max, alpha))
    return total


def aup_points(rho: Sequence[float], y: Sequence[float], drop: float = AUP_DROP) -> list[tuple[float, float]]:
    """The ``(ρ, y)`` pairs that :func:`aup` counts, in its order: sorted by ρ (equal ρ: higher y first),
    those with ``y >= y_1 - drop``."""
    pts = sorted(zip(rho, y), key=lambda p: (p[0], -p[1]))
    return [p for p in pts if p[1] >= pts[0][1] - drop]


@dataclass(frozen=True)
class AupScore:
    """The AUP of one curve of a sweep: a model at one window, block size and batch size, over τ."""

    model: str
    family: str
    window: int | None
    block_size: int | None
    batch_size: int
    aup: float
    y_max: float  # the highest quality (×100) of the whole sweep: the same for every curve
    counted: int  # points within AUP_DROP of y_1
    points: int
    max_tpf: float  # the highest TPF among the counted points
    speculate: bool = False  # a self-speculative decode: a curve of its own (one point, threshold off)

    def to_dict(self) -> dict:
        return asdict(self)


def aup_scores(points: Sequence[BenchPoint]) -> list[AupScore]:
    """One :class:`AupScore` per curve of a decoding sweep (model, w, block size, batch), over its τ points;
    y is the quality ×100 (accuracy in %, or ROUGE-L ×100 for infilling), ρ the TPF, and ``y_max`` the best
    quality of every point given, so that the curves' AUPs compare. Empty for the likelihood task."""
    points = [p for p in points if p.tokens_per_step is not None]
    if not points:
        return []
    y_max = 100 * max(p.quality for p in points)
    curves: dict[tuple, list[BenchPoint]] = {}
    for p in points:
        key = (p.model, p.setting.window, p.setting.block_size, p.setting.batch_size, p.setting.speculate)
        curves.setdefault(key, []).append(p)
    out = []
    for (model, w, block, batch, spec), pts in curves.items():
        rho, y = [p.tokens_per_step for p in pts], [100 * p.quality for p in pts]
        kept = aup_points(rho, y)
        out.append(AupScore(model, pts[0].family, w, block, batch, aup(rho, y, y_max), y_max, len(kept), len(pts),
                            kept[-1][0], speculate=spec))
    return out


# ---------------------------------------------------------------------------------------------------------
# reports
# ---------------------------------------------------------------------------------------------------------


def _tau(t: float | None) -> str:
    return "off" if t is None else f"{t:g}"


def _rate_unit(points: Sequence[BenchPoint]) -> str:
    return "tokens/CPU-s" if points[0].result.get("clock") == "cpu" else "tokens/s"


def _quality_text(task: str, q: float) -> str:
    return f"{q:.4f}" if task == "likelihood" else f"{100 * q:.1f}"


def _dash(v) -> str:
    return "–" if v is None else str(v)


def _per_task(points: Sequence[BenchPoint]) -> list[str]:
    """The tasks of the parallel suite that the points report accuracies for (none for other tasks)."""
    return list(dict.fromkeys(t for p in points for t in p.result.get("per_task", {})))


def against_ar(points: Sequence[BenchPoint]) -> dict[int, tuple[float, float]]:
    """For each decoding point (by index) of a sweep that holds an autoregressive model: its quality and its
    tokens/s as multiples of the AR point's at the same batch size (the first AR point of that batch size,
    timed side by side in the same sweep); {} when the sweep has no AR point."""
    ar: dict[int, BenchPoint] = {}
    for p in points:
        if REGISTRY[p.family].left_to_right and p.tokens_per_second:  # the autoregressive model
            ar.setdefault(p.setting.batch_size, p)
    out = {}
    for i, p in enumerate(points):
        ref = ar.get(p.setting.batch_size)
        if ref is not None and p.tokens_per_second is not None and ref.quality:
            out[i] = (p.quality / ref.quality, p.tokens_per_second / ref.tokens_per_second)
    return out


def markdown_table(points: Sequence[BenchPoint]) -> str:
    """One row per point: model, family, τ, w (``4 spec``: self-speculative), block size, batch, quality (and, for the parallel suite, the
    accuracy of each task), tokens/s, NFE/example, TPF, forwards/token; then, for a decoding sweep, the AUP of each curve
    (:func:`aup_scores`)."""
    if not points:
        raise UserError("no points to tabulate")
    task = points[0].task
    head = {"reasoning": "accuracy (%)", "parallel": "accuracy (%)", "infill": "ROUGE-L (×100)",
            "likelihood": "nats/token"}[task]
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
        tau, batch = (_tau(s.threshold), s.batch_size) if task != "likelihood" else ("–", "–")
        per = "".join(f"{100 * p.result['per_task'][t]:.1f} | " if t in p.result.get("per_task", {}) else "– | "
                      for t in subtasks)
        rows.append(f"| {p.model} | {p.family} | {tau} | {_dash(s.window)}{' spec' if s.speculate else ''} | {_dash(s.block_size)} | {batch} | "
                    f"{_quality_text(task, p.quality)} | {per}{speed} | {nfe} | {tpf} | {fpt} |"
                    + ("".join(f" {r:.2f}x |" for r in vs_ar[i]) if i in vs_ar else " – | – |" if vs_ar else ""))
    scores = aup_scores(points)
    if scores:
        rows += ["", f"AUP over τ (d3LLM's accuracy under parallelism: ρ = TPF, y = {head}, only points within "
                 f"{AUP_DROP:g} of the least parallel one's y count; y_max = {scores[0].y_max:.1f}):", "",
                 "| model | family | w | block | batch | AUP | points counted | max TPF counted |",
                 "|---|---|---|---|---|---|---|---|"]
        rows += [f"| {a.model} | {a.family} | {_dash(a.window)}{' spec' if a.speculate else ''} | {_dash(a.block_size)} | {a.batch_size} | "
                 f"{a.aup:.1f} | {a.counted} of {a.points} | {a.max_tpf:.2f} |" for a in scores]
    return "\n".join(rows) + "\n"


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
    task = points[0].task
    decoding = task != "likelihood"
    fig = Figure(figsize=(12 if decoding else 7, 4.5), dpi=dpi, layout="constrained")
    ax, *tpf_ax = fig.subplots(1, 2 if decoding else 1, squeeze=False)[0]
    if not decoding:
        labels = [p.model for p in points]
        ax.barh(labels, [p.quality for p in points], color="tab:blue")
        ax.invert_yaxis()
        ax.set_xlabel("likelihood bound (nats/token, lower is better)")
    else:
        several = len({p.setting.batch_size for p in points}) > 1
        series: dict[str, list[BenchPoint]] = {}
        for p in points:
            series.setdefault(p.model + (f" (batch {p.setting.batch_size})" if several else ""), []).append(p)
        for name, pts in series.items():
            front = sorted(pareto_front(pts), key=lambda p: p.tokens_per_second)
            line, = ax.plot([p.tokens_per_second for p in front], [100 * p.quality for p in front], "-o",
                            markersize=5, label=name)
            ax.plot([p.tokens_per_second for p in pts], [100 * p.quality for p in pts], "o", color=line.get_color(),
                    markersize=4, alpha=0.4)
            for p in pts:
                ax.annotate(_tau(p.setting.threshold), (p.tokens_per_second, 100 * p.quality), fontsize=6,
                            xytext=(2, 2), textcoords="offset points", color=line.get_color())
        ax.set_xlabel(_rate_unit(points) + ("" if several else " (mean per example, batch 1)"))
        ax.set_ylabel("ROUGE-L (×100)" if task == "infill" else "accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        _plot_tpf(tpf_ax[0], points, ax.get_ylabel())
    ax.set_title(title or f"{task}: quality vs speed")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def _plot_tpf(ax, points: Sequence[BenchPoint], ylabel: str) -> None:
    """Quality against TPF, one line per AUP curve through its points sorted by TPF."""
    scores = {(a.model, a.window, a.block_size, a.batch_size): a for a in aup_scores(points)}
    for key, a in scores.items():
        pts = sorted((p for p in points if (p.model, p.setting.window, p.setting.block_size,
                                            p.setting.batch_size) == key), key=lambda p: p.tokens_per_step)
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

    from . import __version__

    from .outputs import write_text

    doc = {**meta, "versions": {"setdlm": __version__, "torch": torch.__version__, "python": platform.python_version()},
           "points": [p.to_dict() for p in points], "aup": [a.to_dict() for a in aup_scores(points)]}
    return write_text(path, json.dumps(doc, indent=2) + "\n", "out")


def fixed_settings(settings: DecodeSettings | None, knobs: dict, models: Sequence[Model], task: str,
                   what: str = "sweep") -> DecodeSettings:
    """The decoding settings fixed for every model of a reasoning/infill evaluation, checked for each model's
    family (the table of :mod:`setdlm.decoding.settings`; infilling takes fill's settings) before any
    decoding; a sweep's leave the settings it sweeps unset."""
    settings = DecodeSettings.of(settings, knobs, what)
    if what == "sweep":
        check_unswept(settings)
    for m in models:
        settings.check_for(m.family.family, "fill" if task == "infill" else "generate")
    return settings


def check_unswept(settings: DecodeSettings) -> None:
    """A sweep's fixed settings leave those it sweeps unset."""
    swept = [name for name in SWEPT if getattr(settings, name) is not None]
    if swept:
        raise UserError(f"the sweep sets {swept[0]}: give it as {swept[0]}s=[...], not in the fixed settings")
    if settings.speculate is not None:
        raise UserError("the sweep sets speculate: give speculate=True to the sweep, not in the fixed settings")
