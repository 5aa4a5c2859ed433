"""Speed/quality sweeps of decoding settings (docs/method.md §4.10, §5.2, §5.4, §6.1).

For each model and each setting that applies to its family (confidence threshold τ for SetDLM, BD3LM and
MDLM, AR committing exactly one token per step; window ``w`` for SetDLM; block size for BD3LM and MDLM;
batch size for all), one timed pass over the task's examples (the task's ``steps``, e.g.
:func:`setdlm.evaluation.reasoning.reasoning_steps`; the passes of all settings run side by side, one
decoding call of each in turn) gives a :class:`BenchPoint`:

* quality: the task's (exact-match accuracy for reasoning and the parallel-dependency suite, ROUGE-L
  F-measure for infilling), over every example;
* speed: at batch 1 the mean ± std of per-example tokens/s after the ``warmup`` first examples (the
  paper's number); at batch > 1 the aggregate tokens/s of the calls after the ``warmup`` first calls;
* NFE per example and tokens per forward (TPF: tokens committed per decoding step, one forward a step;
  prefill excluded), the decoder's own counts: the hardware-independent speed (AUP:
  :func:`setdlm.evaluation.metrics.aup_scores`);
* for a speculative SetDLM point, TPF is the mean accepted length (tokens committed per verifying forward).

A task that does not decode (likelihood) has nothing to sweep: one point per model (:func:`measured_point`).
``setdlm bench`` (:func:`setdlm.evaluation.bench_checkpoints`, checkpoints by path) wraps :func:`sweep` and
the reports of :mod:`setdlm.evaluation.reports`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Literal, cast

from tqdm.auto import tqdm

from ..decoding.settings import SETTING_FAMILIES, DecodeSettings, drafts
from ..errors import UserError
from ..family import REGISTRY as FAMILY_REGISTRY
from ..formats.drafted import DraftedBackbone
from ..lm import Model
from .passes import Clock, EvalRun, interleave
from .registry import decoding, get_task

THRESHOLDS = (None, 0.99, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6)  # docs/method.md §5.2: None = off (τ = 1e6)


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
    # SetDLM: lossless self-speculative decoding with window w (threshold off); "next_token": verified by the
    # model's next-token head (a model trained with ar_weight > 0)
    speculate: bool | Literal["next_token"] = False

    def apply(self, base: DecodeSettings) -> DecodeSettings:
        """``base`` with this setting's threshold, window, block size and speculation (the sweep owns those:
        ``base`` leaves them unset, :func:`sweep` checks); ``base``'s ``verify_layout`` for a ``speculate=True``
        point only."""
        return replace(base, threshold=self.threshold, window=self.window, block_size=self.block_size,
                       speculate=self.speculate or None,
                       verify_layout=base.verify_layout if self.speculate is True else "auto")


SWEPT = ("threshold", "window", "block_size")  # the DecodeSettings fields a sweep owns (and speculate)


def check_sweep(thresholds: Sequence[float | None], windows: Sequence[int | None], batch_sizes: Sequence[int],
                warmup: int = 0, block_sizes: Sequence[int | None] = (None,)) -> None:
    """The sweep's settings, checked without any model (so ``setdlm bench`` fails before loading one); a bad
    one is a ``UserError`` whose message names its list (``fields`` left empty: the command line prints these
    messages as they are, docs/errors.md)."""
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
        if not (isinstance(b, int) and not isinstance(b, bool) and b >= 1):
            raise UserError(f"batch sizes must be positive integers, got {b!r}")
    if not (isinstance(warmup, int) and not isinstance(warmup, bool) and warmup >= 0):
        raise UserError(f"warmup must be a non-negative integer, got {warmup!r}")


@dataclass(frozen=True)
class BenchSpec:
    """What a sweep (``setdlm bench``, :func:`sweep`, :func:`setdlm.evaluation.bench_checkpoints`) runs: the
    lists it sweeps, ``warmup`` examples timed but not counted, the ``clock`` (as
    :class:`~setdlm.evaluation.passes.EvalRun`'s), the plot's ``title``, a progress bar over its calls or not.
    Unset (None): ``thresholds`` :data:`THRESHOLDS`, ``windows`` the model's D, ``block_sizes`` the model's,
    ``batch_sizes`` 1, ``warmup`` 50 (bench_checkpoints: at most a quarter of the examples), the wall clock,
    the task as title. Checked when built: a bad value is a ``UserError`` naming it (in its message for the
    lists and ``warmup``, as :func:`check_sweep` words it)."""

    thresholds: Sequence[float | None] | None = None  # τ; None in the list: off
    windows: Sequence[int | None] | None = None  # SetDLM w; None in the list: D
    batch_sizes: Sequence[int] | None = None
    block_sizes: Sequence[int | None] | None = None  # BD3LM/MDLM; None in the list: the model's
    warmup: int | None = None
    sweep_speculate: bool = False  # also each SetDLM window's self-speculative decode (sweep_settings)
    clock: Clock | None = None
    title: str | None = None
    progress: bool = True

    def __post_init__(self):
        for name in ("thresholds", "windows", "batch_sizes", "block_sizes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, str) or not isinstance(value, Sequence)):
                raise UserError(f"{name} must be a list, got {value!r}", fields=(name,))
        check_sweep(self.grid("thresholds"), self.grid("windows"), self.grid("batch_sizes"), self.warmup or 0,
                    self.grid("block_sizes"))
        EvalRun(clock=self.clock)  # checked as an EvalRun's
        for name in ("sweep_speculate", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise UserError(f"{name} must be True or False, got {getattr(self, name)!r}", fields=(name,))

    def grid(self, name: str) -> list:
        """The list ``name`` (``thresholds``, ``windows``, ``batch_sizes``, ``block_sizes``), its default when
        unset or empty."""
        return list(getattr(self, name) or _GRID[name])

    @property
    def given(self) -> tuple[str, ...]:
        """The fields given that only a decoding task's sweep takes (all but ``clock``, ``title`` and
        ``progress``)."""
        swept = ("thresholds", "windows", "block_sizes", "batch_sizes")
        return (*(n for n in swept if getattr(self, n)), *(("warmup",) if self.warmup is not None else ()),
                *(("sweep_speculate",) if self.sweep_speculate else ()))


_GRID: dict[str, Sequence] = {"thresholds": THRESHOLDS, "windows": (None,), "batch_sizes": (1,),
                              "block_sizes": (None,)}


def sweep_settings(model: Model, thresholds: Sequence[float | None] = THRESHOLDS,
                   windows: Sequence[int | None] = (None,), batch_sizes: Sequence[int] = (1,),
                   block_sizes: Sequence[int | None] = (None,), speculate: bool = False) -> list[Setting]:
    """The settings that apply to ``model``'s family: τ only for SetDLM/BD3LM/MDLM, w only for SetDLM (None
    = D), block sizes only for BD3LM/MDLM (None = the model's); with ``speculate``, also the self-speculative
    decode of each window ``w > 1`` (SetDLM only; it reproduces ``w = 1``, threshold off), and for a SetDLM
    trained with a next-token head (``ar_weight > 0``) ``speculate="next_token"`` at every window (``w = 1``: the
    head's AR decode), and for a base with a set drafter its drafted decode at each window (None: the drafter's);
    each distinct setting once, in sweep order."""
    fam = model.family
    check_sweep(thresholds, windows, batch_sizes, block_sizes=block_sizes)
    taus = thresholds if fam.family in SETTING_FAMILIES["threshold"] else [None]
    ws = [fam.D if w is None else w for w in windows] if fam.family in SETTING_FAMILIES["window"] else [None]
    ss = ([fam.block_size if s is None else s for s in block_sizes] if fam.family in SETTING_FAMILIES["block_size"]
          else [None])
    out = [Setting(t, w, b, s) for b in batch_sizes for s in ss for w in ws for t in taus]
    spec = speculate and fam.family in SETTING_FAMILIES["speculate"]
    out += [Setting(None, w, b, speculate=True) for b in batch_sizes for w in ws if spec and w is not None and w > 1]
    if spec and fam.ar_weight:  # docs/decoding.md, "Verifying with the next-token head"
        out += [Setting(None, w, b, speculate="next_token") for b in batch_sizes for w in ws]
    if speculate and drafts(model):  # a base with a set drafter (docs/drafter.md): the drafter's windows
        drafted = cast(DraftedBackbone, model.backbone)  # drafts(model): a base with a set drafter
        out += [Setting(None, w, b, speculate="next_token") for b in batch_sizes
                for w in [drafted.window if w is None else w for w in windows]]
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class BenchPoint:
    """One model at one setting."""

    model: str  # label
    family: str
    task: str
    setting: Setting
    quality: float  # the task's quality: accuracy or ROUGE-L in [0, 1], or nats/token (likelihood)
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
                      quality=getattr(result, get_task(task).quality),
                      tokens_per_second=speed.mean if batch1 else speed.aggregate,
                      tokens_per_second_std=speed.std if batch1 else None, nfe=run.nfe_per_example,
                      tokens_per_step=run.tokens_per_step, result=result.to_dict())


# ---------------------------------------------------------------------------------------------------------
# sweeps
# ---------------------------------------------------------------------------------------------------------


def sweep(models: Sequence[tuple[str, Model]], task: str, examples: Sequence, settings: DecodeSettings | None = None,
          bench: BenchSpec | None = None, *, task_args: dict | None = None, seed: int | None = None,
          **knobs) -> list[BenchPoint]:
    """Evaluate every ``(label, model)`` on ``examples`` of a decoding ``task`` (reasoning problems,
    parallel-suite examples, infilling examples, or a registered task's) at every applicable setting of
    ``bench`` (a :class:`BenchSpec`: the thresholds, windows, block and batch sizes, ``sweep_speculate``). Speed
    skips the first ``bench.warmup`` examples (default 50; rounded up to whole calls at batch > 1); quality counts
    every example. The settings run side by side (:func:`setdlm.evaluation.passes.interleave`): one decoding call
    of each in turn, so that a drift of the machine's speed does not favour the settings timed first.
    ``settings`` (a :class:`~setdlm.decoding.settings.DecodeSettings`, or its fields as keywords:
    ``max_new_tokens``, ``temperature``, ``cache_order``, ``repetition_penalty``, ...) are the same for every
    point, bar the swept ``threshold``, ``window`` and ``block_size``; ``sweep_speculate`` adds each SetDLM
    window's self-speculative decode (:func:`sweep_settings`); ``task_args`` (the task's own arguments, e.g.
    infill's ``{"eos": True}``), ``bench.clock`` and ``seed`` go to the task's ``steps``."""
    steps = get_task(task).steps  # None exactly for the tasks that do not decode (registry.register)
    if steps is None:
        raise UserError(f"sweep task must be one of {', '.join(decoding())}, got {task!r} "
                        "(a task that does not decode: measured_point)")
    if not models:
        raise UserError("no models to benchmark")
    bench = BenchSpec() if bench is None else bench
    base = fixed_settings(settings, knobs, [m for _, m in models], task)
    batch_sizes, warmup = bench.grid("batch_sizes"), 50 if bench.warmup is None else bench.warmup
    plan = [(label, model, s) for label, model in models
            for s in sweep_settings(model, bench.grid("thresholds"), bench.grid("windows"), batch_sizes,
                                    bench.grid("block_sizes"), speculate=bench.sweep_speculate)]
    n = len(examples)
    for b in batch_sizes:  # fail before the sweep starts, not in its middle
        if -(-warmup // b) >= -(-n // b):
            raise UserError(f"warmup={warmup} examples leave none of the {n} examples to time at batch size {b}")
    passes = [steps(model, examples, s.apply(base), EvalRun(batch_size=s.batch_size, warmup=-(-warmup // s.batch_size),
                                                             clock=bench.clock, seed=seed, progress=False),
                    **(task_args or {})) for _, model, s in plan]
    calls = sum(-(-n // s.batch_size) for _, _, s in plan)
    with tqdm(total=calls, desc=f"bench {task} ({len(plan)} settings side by side)", unit="call",
              disable=None if bench.progress else True) as bar:
        results = interleave(passes, progress=lambda: bar.update(1))
    return [_point(label, model, task, s, r) for (label, model, s), r in zip(plan, results)]


def measured_point(label: str, model: Model, task: str, result: dict) -> BenchPoint:
    """The result of a task that does not decode (its ``measure``'s dict, the quality under the task's
    ``quality`` key) as a point."""
    return BenchPoint(model=label, family=model.family.family, task=task, setting=Setting(),
                      quality=result[get_task(task).quality], tokens_per_second=None, tokens_per_second_std=None,
                      nfe=None, tokens_per_step=None, result=result)


def likelihood_point(label: str, model: Model, result: dict) -> BenchPoint:
    """A likelihood result (:func:`setdlm.evaluation.checkpoint_likelihood`'s dict, ``nelbo`` in nats/token) as a
    point."""
    return measured_point(label, model, "likelihood", result)


def pareto_front(points: Sequence[BenchPoint]) -> list[BenchPoint]:
    """The points no other point beats on both speed and quality, fastest first."""
    front, best = [], float("-inf")
    for p in sorted(points, key=lambda p: (-(p.tokens_per_second or 0.0), -p.quality)):
        if p.quality > best:
            front.append(p)
            best = p.quality
    return front


def against_ar(points: Sequence[BenchPoint]) -> dict[int, tuple[float, float]]:
    """For each decoding point (by index) of a sweep that holds an autoregressive model: its quality and its
    tokens/s as multiples of AR at its own best at the same batch size, on each axis: the highest quality and
    the highest tokens/s of the AR points of that batch size (several AR models, or one in several precisions,
    timed side by side in the same sweep); {} when the sweep has no AR point."""
    ar: dict[int, tuple[float, float]] = {}  # batch size -> (best quality, best tokens/s)
    for p in points:
        if FAMILY_REGISTRY[p.family].left_to_right and p.tokens_per_second:  # an autoregressive model
            q, v = ar.get(p.setting.batch_size, (p.quality, p.tokens_per_second))
            ar[p.setting.batch_size] = (max(q, p.quality), max(v, p.tokens_per_second))
    out = {}
    for i, p in enumerate(points):
        q, v = ar.get(p.setting.batch_size, (0.0, 0.0))
        if q and p.tokens_per_second is not None:
            out[i] = (p.quality / q, p.tokens_per_second / v)
    return out


def fixed_settings(settings: DecodeSettings | None, knobs: dict, models: Sequence[Model], task: str,
                   what: str = "sweep") -> DecodeSettings:
    """The decoding settings fixed for every model of a decoding task's evaluation, checked for each model's
    family (the table of :mod:`setdlm.decoding.settings`, in the task's mode: infilling takes fill's) before any
    decoding; a sweep's leave the settings it sweeps unset."""
    settings = DecodeSettings.of(settings, knobs, what)
    if what == "sweep":
        check_unswept(settings)
    mode = get_task(task).mode
    if mode is None:
        raise UserError(f"task {task} does not decode: no decoding settings apply", fields=("task",))
    for m in models:
        settings.check_for(m.family.family, mode, drafts=drafts(m))
    return settings


def check_unswept(settings: DecodeSettings) -> None:
    """A sweep's fixed settings leave those it sweeps unset."""
    swept = [name for name in SWEPT if getattr(settings, name) is not None]
    if swept:
        raise UserError(f"the sweep sets {swept[0]}: give it as {swept[0]}s=[...], not in the fixed settings")
    if settings.speculate is not None:
        raise UserError("the sweep sets speculate: give speculate=True to the sweep, not in the fixed settings")
