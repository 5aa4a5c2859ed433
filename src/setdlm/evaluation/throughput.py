"""Decoding speed the paper's way (docs/method.md §4.10, §7.20): one example per call at batch 1, the first
``warmup`` calls excluded, mean ± std of per-call generated tokens / second (prompt tokens never count; the
latency includes the prefill), plus the aggregate rate, the number to compare at batch > 1.

The items are a task's examples, decoded as that task decodes them: the task registry says whose examples
they are (``Task.example``) and how its task decodes (``Task.mode``: a prompt continued, or a middle filled);
anything else is a prompt, a string or a list of token ids (docs/evaluation.md, "From Python").
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

import torch

from ..data.prompt import encode_prompt
from ..decoding.settings import DecodeSettings
from ..errors import UserError
from ..lm import Model
from .metrics import ThroughputStats
from .passes import EvalRun, check_examples, drain, fill_steps, generate_steps, prompt_ids, tokenizer
from .registry import task_of


def throughput(model: Model, items: Sequence, settings: DecodeSettings | None = None, run: EvalRun | None = None,
               *, eos: bool = False, **knobs) -> ThroughputStats:
    """Decoding speed the paper's way: ``run.batch_size`` items per call (default 1, the paper's), the first
    ``run.warmup`` calls excluded (default 50); ``mean ± std`` of per-call tokens/s and the ``aggregate`` rate
    (compare that one at batch > 1). Only generated tokens count (an EOS that ends a row included, the prompt
    never); the latency of a call includes its prefill. NFE and tokens/step are the decoder's counts.

    ``items``: the examples of a registered task (reasoning problems, parallel-suite examples, infilling
    examples, each decoded as its task decodes it; ``eos`` as :func:`setdlm.evaluation.infill.infill`'s), or
    prompts: strings (encoded as ``[BOS] + text``) or token-id lists (as given). ``settings`` (or its fields as
    keywords) go to the decoder (``ignore_eos=True`` makes every row generate ``max_new_tokens``; default
    min(256, what the longest prompt leaves of the context)). ``run``: an :class:`EvalRun` (``clock="cpu"``
    times by CPU time instead of wall time).
    """
    return drain(throughput_steps(model, items, settings, run, eos=eos, **knobs))


def throughput_steps(model: Model, items: Sequence, settings: DecodeSettings | None = None,
                     run: EvalRun | None = None, *, eos: bool = False,
                     **knobs) -> Generator[None, None, ThroughputStats]:
    """:func:`throughput` as a generator that yields after every decoding call and returns the statistics
    (:func:`setdlm.evaluation.passes.interleave`)."""
    run = EvalRun.of(run, knobs, "throughput")
    settings = DecodeSettings.of(settings, knobs, "throughput")
    items = list(items)
    if not items:
        raise UserError("no prompts or examples to time")
    opts: dict[str, Any] = dict(seed=run.seed, desc=f"{model.family.family} throughput",
                                **run.options(batch_size=1, warmup=50))
    task = task_of(items[0])  # the registered task whose examples these are; None: prompts
    if task is not None and task.mode == "fill":
        if settings.max_new_tokens is not None:
            raise UserError("max_new_tokens does not apply to infilling: the oracle length of each middle is used")
        examples = check_examples(items, type(items[0]))
        return (yield from fill_steps(model, examples, settings, eos=eos, **opts))[1].speed
    if task is not None:
        prompts = [prompt_ids(model, e) for e in check_examples(items, type(items[0]))]
    else:
        prompts = [_prompt(model, p, i) for i, p in enumerate(items)]
    return (yield from generate_steps(model, prompts, settings, **opts))[1].speed


def _prompt(model: Model, p, i: int) -> list[int]:
    if isinstance(p, str):
        tok = tokenizer(model)
        return encode_prompt(tok, p)
    if isinstance(p, torch.Tensor):
        p = p.tolist()
    if not (isinstance(p, (list, tuple)) and all(isinstance(t, int) and t >= 0 for t in p)):
        raise UserError(f"item {i} is neither an example, a string nor a list of token ids: {str(p)[:40]!r}")
    return list(p)
