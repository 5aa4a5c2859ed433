"""The configuration of a training run (docs/training.md, "The training package"): seven groups, each a
dataclass checked on its own (model, family, optimisation, data, evaluation, checkpointing, system),
composed into :class:`TrainConfig`.

The flat names of the fields (``steps``, ``hidden_size``, ...) are the outside contract: one command-line
flag each (``--hidden-size``), and the keys of the ``"training"`` section that every checkpoint's
``config.json`` records. So ``TrainConfig(out=..., steps=...)`` takes the flat names, ``cfg.steps`` reads
one, and :meth:`TrainConfig.to_dict` writes them; a checkpoint written before a field existed resumes with
that field's default. Inside the package the groups are read: ``cfg.optim.steps``.

Which knobs apply to which family and how many streams a family trains on come from the family registry
(:mod:`setdlm.family`), read through :func:`family_knobs` and :func:`streams`.
"""

from __future__ import annotations

import math
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from ..errors import UserError
from ..family import FAMILIES, FamilyConfig, family_from_flags, get_family, using
from ..model import TransformerConfig
from ..presets import preset as preset_values

STRATEGIES = ("ddp", "fsdp")


def family_knobs(name: str) -> tuple[str, ...]:
    """The families a training flag applies to (empty: every family); the others refuse it on the command line."""
    return using("train_flags", name)


def knobs_for(family: str, **knobs) -> dict:
    """The ``knobs`` (training options) that apply to ``family``: to build every family's configuration from
    one set of knobs (``TrainConfig`` refuses a knob of another family that is given)."""
    get_family(family)
    return {k: v for k, v in knobs.items() if not family_knobs(k) or family in family_knobs(k)}


def streams(family: str) -> int:
    """Positions a training row feeds per token: 2 for the two-stream families (clean + noisy copies)."""
    return get_family(family).streams


def _f(help: str, **kw):
    return field(metadata={"help": help}, **kw)


def _check(group) -> None:
    """Types first (so that range checks compare numbers), then ``group.positive`` / ``group.non_negative``."""
    hints = typing.get_type_hints(type(group))
    for f in fields(group):
        v, kind = getattr(group, f.name), hints[f.name]
        if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise TypeError(f"{f.name} must be a number, got {type(v).__name__} {v!r}")
        if kind is bool and not isinstance(v, bool):
            raise TypeError(f"{f.name} must be True or False, got {type(v).__name__} {v!r}")
    for names, lo, what in ((getattr(group, "positive", ()), 1, "a positive"),
                            (getattr(group, "non_negative", ()), 0, "a non-negative")):
        for name in names:
            v = getattr(group, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < lo):
                raise UserError(f"{name} must be {what} integer, got {v!r}", fields=(name,))


def _in_range(group, checks: dict[str, bool]) -> None:
    for name, ok in checks.items():
        if not ok:
            raise UserError(f"{name} out of range: {getattr(group, name)}", fields=(name,))


@dataclass
class ModelArgs:
    """The backbone: a fresh DiT of this size, or the weights ``init_from`` names (docs/method.md §2.9)."""

    init_from: str | None = _f("start from these weights (architecture and tokenizer included): a setdlm checkpoint "
                               "or run folder, a Hugging Face causal LM folder, or a Hub id", default=None)
    hidden_size: int = _f("model width d", default=64)
    n_layers: int = _f("transformer layers", default=2)
    n_heads: int = _f("attention heads", default=2)
    dropout: float = _f("residual dropout", default=0.0)
    positive = ("hidden_size", "n_layers", "n_heads")

    def __post_init__(self):
        _check(self)
        _in_range(self, {"dropout": 0 <= self.dropout < 1})
        if self.hidden_size % self.n_heads:
            raise UserError(f"hidden_size {self.hidden_size} is not divisible by n_heads {self.n_heads}",
                            fields=("hidden_size", "n_heads"))

    def transformer_config(self, vocab_size: int) -> TransformerConfig:
        return TransformerConfig(vocab_size=vocab_size, hidden_size=self.hidden_size, n_heads=self.n_heads,
                                 n_layers=self.n_layers, dropout=self.dropout)


@dataclass
class ObjectiveArgs:
    """The family and its knobs: which objective is trained (docs/method.md §2.1, §2.9)."""

    family: str = _f("ar, mdlm, bd3lm or setdlm", default="setdlm")
    D: int = _f("setdlm: target parallelism D", default=4)
    M: int | None = _f("setdlm: max set size M (default 2D, capped at L)", default=None)
    k: float | None = _f("setdlm: explicit schedule shape k (default from D, M)", default=None)
    block_size: int | None = _f("bd3lm: block size S (default D); mdlm: decoding sub-block", default=None)
    keep_clean_bos: bool = _f("setdlm: BOS first in the reveal order and scored in training, not in the bound "
                              "(the paper's LM1B/OWT setting; on in those presets)", default=False)
    ar_weight: float = _f("setdlm: weight of a next-token (AR) loss on the clean stream, for the "
                          "speculate='next_token' "
                          "decode (docs/method.md §2.10; default 0: the paper's objective)", default=0.0)
    positive = ("D", "M", "block_size")

    def __post_init__(self):
        _check(self)
        _in_range(self, {"ar_weight": 0 <= self.ar_weight < math.inf})
        if self.family not in FAMILIES:
            raise UserError(f"unknown family {self.family!r}; choose one of {', '.join(FAMILIES)}", fields=("family",))

    def family_config(self, length: int, mask_token_id: int) -> FamilyConfig:
        """The :class:`FamilyConfig` these knobs give at context length ``length`` (checks them against it)."""
        return family_from_flags(self.family, length, mask_token_id, asdict(self))


@dataclass
class OptimArgs:
    """AdamW, the learning-rate schedule, clipping, EMA, and the seed of everything random in training."""

    steps: int = _f("optimizer steps in total", default=200)
    batch_size: int = _f("global batch (rows per optimizer step, all processes together)", default=16)
    grad_accum: int = _f("micro-batches per optimizer step", default=1)
    lr: float = _f("peak learning rate", default=1e-3)
    warmup: int = _f("linear warm-up steps", default=20)
    lr_schedule: str = _f("after warm-up: constant or cosine", default="constant")
    min_lr_ratio: float = _f("cosine: final learning rate / peak", default=0.1)
    weight_decay: float = _f("AdamW weight decay", default=0.0)
    beta1: float = _f("AdamW beta1", default=0.9)
    beta2: float = _f("AdamW beta2", default=0.999)
    clip: float = _f("gradient clipping norm (0 = off)", default=1.0)
    ema: float = _f("EMA decay per step (0 = no EMA)", default=0.0)
    seed: int = _f("seed of initialisation, data order and training randomness", default=0)
    positive = ("steps", "batch_size", "grad_accum")
    non_negative = ("warmup", "seed")

    def __post_init__(self):
        _check(self)
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise UserError(f"lr must be positive, got {self.lr}", fields=("lr",))
        if self.lr_schedule not in ("constant", "cosine"):
            raise UserError(f"lr_schedule must be constant or cosine, got {self.lr_schedule!r}",
                            fields=("lr_schedule",))
        _in_range(self, {"min_lr_ratio": 0 <= self.min_lr_ratio <= 1, "weight_decay": self.weight_decay >= 0,
                         "beta1": 0 <= self.beta1 < 1, "beta2": 0 <= self.beta2 < 1, "clip": self.clip >= 0,
                         "ema": 0 <= self.ema < 1})
        if self.batch_size % self.grad_accum:
            raise UserError(f"batch_size {self.batch_size} is not divisible by grad_accum {self.grad_accum}",
                            fields=("batch_size", "grad_accum"))


@dataclass
class CorpusArgs:
    """The training text, its tokenizer, the context length and the fixed held-out split."""

    data: str = _f("training text: a file, folder, .jsonl, built-in corpus or hf:NAME", default="shakespeare")
    tokenizer: str = _f("bpe, char, a tokenizer folder, or hf:NAME (Hub)", default="char")
    vocab_size: int = _f("BPE vocabulary size (special tokens included)", default=4096)
    length: int = _f("context length L", default=64)
    eval_fraction: float = _f("share of rows held out", default=0.05)
    eval_max: int = _f("at most this many held-out rows", default=256)
    split_seed: int = _f("seed of the fixed held-out split", default=0)
    positive = ("vocab_size", "length")
    non_negative = ("eval_max", "split_seed")

    def __post_init__(self):
        _check(self)
        if not isinstance(self.data, str) or not self.data.strip():
            raise UserError(f"data must name a text source (a file, folder, built-in corpus or hf:NAME), got "
                            f"{self.data!r}", fields=("data",))
        if self.length < 2:
            raise UserError(f"length must be at least 2 (L: a BOS and one token to learn), got {self.length}",
                            fields=("length",))
        _in_range(self, {"eval_fraction": 0 < self.eval_fraction < 1})
        if Path(self.data).exists():  # recorded absolute, so that `setdlm eval` finds it from anywhere
            self.data = str(Path(self.data).resolve())


@dataclass
class EvalArgs:
    """What the run reports: the held-out bound (docs/method.md §5.1) and the training metrics."""

    eval_ema: bool = _f("evaluate the EMA weights instead of the raw ones", default=False)
    eval_every: int = _f("evaluate the held-out bound every N steps (0 = only at the end)", default=100)
    eval_batch_size: int = _f("rows per evaluation batch", default=16)
    eval_seed: int = _f("seed of the evaluation's random orders/masks (docs/method.md §5.1 uses 1)", default=1)
    log_every: int = _f("log training metrics every N steps", default=10)
    positive = ("eval_batch_size", "log_every")
    non_negative = ("eval_every", "eval_seed")

    def __post_init__(self):
        _check(self)


@dataclass
class CheckpointArgs:
    """The run folder: where checkpoints go, how often, how many are kept, and resuming."""

    out: str = _f("run folder: checkpoints, metrics.jsonl")
    save_every: int = _f("checkpoint every N steps (0 = only at the end)", default=100)
    keep: int = _f("checkpoints kept", default=2)
    resume: bool = _f("continue from the run folder's latest checkpoint", default=False)
    allow_data_change: bool = _f("with --resume: continue although the training data changed since the "
                                 "checkpoint (its tokenized rows' sha256 is recorded)", default=False)
    positive = ("keep",)
    non_negative = ("save_every",)

    def __post_init__(self):
        _check(self)
        if not self.out:
            raise UserError("out (the run folder) is required", fields=("out",))


@dataclass
class SystemArgs:
    """Where and how the arithmetic runs: device, precision, compilation, memory, parallel strategy."""

    bf16: bool = _f("bf16 autocast (under fsdp also bf16 parameters in forward/backward, fp32 gradients "
                    "reduced)", default=False)
    grad_checkpointing: bool = _f("recompute each layer's activations in the backward pass (less memory, "
                                  "about one more forward of compute)", default=False)
    compile: bool = _f("torch.compile the backbone", default=False)
    device: str = _f("auto, cpu, cuda or cuda:N", default="auto")
    strategy: str = _f("with several processes (torchrun): ddp (replicas) or fsdp (FSDP2: parameters, "
                       "gradients and optimizer state sharded)", default="ddp")

    def __post_init__(self):
        _check(self)
        if self.strategy not in STRATEGIES:
            raise UserError(f"strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}",
                            fields=("strategy",))


GROUPS = {"model": ModelArgs, "objective": ObjectiveArgs, "optim": OptimArgs, "corpus": CorpusArgs,
          "evaluation": EvalArgs, "checkpointing": CheckpointArgs, "system": SystemArgs}
_OWNER = {f.name: group for group, cls in GROUPS.items() for f in fields(cls)}  # flat name -> group


@dataclass(init=False)
class TrainConfig:
    """Every training argument, in groups (:data:`GROUPS`). Built from the flat names
    (``TrainConfig(out="runs/x", steps=100)``), or from group objects (``TrainConfig(optim=OptimArgs(...),
    checkpointing=CheckpointArgs(out=...))``); defaults are the ``tiny`` preset (:mod:`setdlm.presets`)."""

    preset: str
    model: ModelArgs
    objective: ObjectiveArgs
    optim: OptimArgs
    corpus: CorpusArgs
    evaluation: EvalArgs
    checkpointing: CheckpointArgs
    system: SystemArgs

    # flat names that may change when resuming a run
    RESUMABLE: typing.ClassVar = ("steps", "eval_every", "save_every", "keep", "log_every", "resume", "device",
                                  "compile", "out", "grad_checkpointing", "allow_data_change")

    def __init__(self, preset: str = "tiny", **given):
        self._fill(preset, given)
        self._refuse_other_family(given)

    def _fill(self, preset: str, given: dict) -> None:
        unknown = [k for k in given if k not in GROUPS and k not in _OWNER]
        if unknown:
            raise TypeError(f"unknown training argument(s) {', '.join(map(repr, unknown))}")
        object.__setattr__(self, "preset", preset)
        for group, cls in GROUPS.items():
            flat = {k: v for k, v in given.items() if _OWNER.get(k) == group}
            if group in given and flat:
                raise TypeError(f"give {', '.join(flat)} inside {group}=, not beside it")
            value = given[group] if group in given else cls(**flat)
            if not isinstance(value, cls):
                raise TypeError(f"{group} must be a {cls.__name__}, got {type(value).__name__}")
            object.__setattr__(self, group, value)
        if self.evaluation.eval_ema and not self.optim.ema:
            raise UserError("eval_ema needs EMA weights: set ema > 0 (e.g. 0.999)", fields=("eval_ema", "ema"))
        self.family_config(mask_token_id=0)  # checks D, M, k, block size against L

    def _refuse_other_family(self, given: dict) -> None:
        """A knob ``given`` explicitly that the family does not use (``D`` for AR) is a mistake, not a no-op;
        in a group object given, the knobs off their default count as given. Values a preset or a checkpoint
        brings are not checked: presets set ``D`` and ``block_size`` for every family, and runs written before
        this check may have recorded such a value."""
        family = self.objective.family
        explicit = [k for k in given if k in _OWNER]
        explicit += [f.name for g in GROUPS if g in given for f in fields(given[g])
                     if getattr(given[g], f.name) != f.default]
        for name in explicit:
            families = family_knobs(name)
            if families and family not in families:
                raise UserError(f"{name} applies to {' and '.join(families)}, not to family {family!r}",
                                fields=(name,))

    @classmethod
    def _given_on_top(cls, preset: str, values: dict, given: dict) -> TrainConfig:
        """``values`` with ``given`` on top, of which only ``given`` is checked against the family."""
        cfg = cls.__new__(cls)
        cfg._fill(preset, {**values, **given})
        cfg._refuse_other_family(given)
        return cfg

    def __getattr__(self, name: str):  # a flat name: read from its group
        group = _OWNER.get(name)
        if group is None or group not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r}")
        return getattr(self.__dict__[group], name)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"a TrainConfig is not changed in place; use cfg.replace({name}=...)")

    @classmethod
    def from_preset(cls, name: str = "tiny", **overrides) -> TrainConfig:
        """Preset ``name``'s values with ``overrides`` on top (an override of another family's knob is refused)."""
        overrides.pop("preset", None)
        return cls._given_on_top(name, preset_values(name), overrides)

    @classmethod
    def from_record(cls, record: dict, **given) -> TrainConfig:
        """The configuration a checkpoint recorded (its ``"training"`` section, flat names; fields added
        since take their defaults) with ``given`` on top; only ``given`` is checked against the family."""
        given = dict(given)
        preset = given.pop("preset", record.get("preset", "tiny"))
        return cls._given_on_top(preset, {k: v for k, v in record.items() if k in _OWNER}, given)

    def replace(self, **flat) -> TrainConfig:
        """A copy with the flat fields ``flat`` changed (checked again)."""
        return TrainConfig.from_record(self.to_dict(), **flat)

    def to_dict(self) -> dict:
        """The flat names and values (what a checkpoint records as ``"training"``)."""
        out = {"preset": self.preset}
        for group in GROUPS:
            out.update(asdict(getattr(self, group)))
        return out

    def family_config(self, mask_token_id: int) -> FamilyConfig:
        return self.objective.family_config(self.corpus.length, mask_token_id)

    def model_config(self, vocab_size: int) -> TransformerConfig:
        return self.model.transformer_config(vocab_size)


def config_fields() -> tuple:
    """The flat fields, in flag order: ``preset``, then each group's (a field's ``metadata["help"]`` is its
    flag's help)."""
    return (fields(TrainConfig)[0], *(f for cls in GROUPS.values() for f in fields(cls)))


def field_type(name: str) -> type:
    """The declared type of flat field ``name`` (``int | None`` is ``int``)."""
    cls = GROUPS[_OWNER[name]] if name in _OWNER else TrainConfig
    kind = typing.get_type_hints(cls)[name]
    return next((a for a in typing.get_args(kind) if a is not type(None)), kind)
