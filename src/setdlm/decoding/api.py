"""One entry point for every family: ``generate``, ``infill`` and ``fill`` (docs/method.md §4, §9.4).

The family of ``model.family`` picks the decoder: ``ar`` (KV-cached next token), ``mdlm`` (no cache,
semi-AR sub-blocks), ``bd3lm`` (block by block, fused cache write), ``setdlm`` (sliding window, cache
updated every step). All share the logits processors, the commit rule and the stopping rules; all decode
batches of ragged rows, and a batch gives the same tokens as decoding each row alone (with per-row seeds
when sampling). Only the backbone contract (``backbone(ids, pos, mask, cache, keep=, logits_start=)``)
and ``backbone.new_cache(batch, capacity)`` are used, so any backbone honouring it works.

The settings are one :class:`~setdlm.decoding.settings.DecodeSettings` (``settings=``, or its fields as
keyword arguments); which family uses which setting is the table in ``decoding/settings.py`` and
docs/decoding.md; a setting set for a family that does not use it is a ``ValueError``, as in the CLI
(docs/errors.md). :func:`~setdlm.decoding.settings.applicable` keeps those that apply, to sweep one setting over
every family.

Every input is checked before any decoding: prompts must be strings or token-id lists (bytes and None are a
``TypeError``), token ids must lie in the model's vocabulary, lengths must be positive integers.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ..data.prompt import check_prompt_fits, encode_prompts, is_token_id, vocab_size
from ..errors import InputWarning, UserError
from ..resources import check_fits
from ..seeds import check_seed
from . import ar, bd3lm, mdlm, setdlm, speculative, speculative_drafter, speculative_next_token
from .output import GenerationOutput, StepTrace
from .settings import DecodeSettings, default_max_new_tokens, drafts, warn_unused_layout, warn_wide_window
from .state import DecodeConfig, Decoder, DecodeState, Mode, RowResult, stop_index
from .structured.cfg import left_to_right
from .structured.enforce import row_constraints

DECODERS: dict[str, Decoder] = {"ar": ar, "mdlm": mdlm, "bd3lm": bd3lm, "setdlm": setdlm}  # by Family.decoder


def generate(model, prompts, settings: DecodeSettings | None = None, *, seed: int | Sequence[int] | None = None,
             batch_size: int | None = None, reveal_times=None, progress: bool = False, trace: bool = False,
             **knobs) -> GenerationOutput:
    """Continue each prompt by up to ``max_new_tokens`` tokens (default: min(256, what the prompt leaves of the
    context L), per row).

    ``prompts``: token-id lists or strings (strings need ``model.tokenizer``); one prompt alone is accepted
    too. A string prompt is encoded by :func:`setdlm.data.prompt.encode_prompt`: ``[BOS] + encode(text)``
    for setdlm's own tokenizers (the way the trainer lays out every row), exactly ``transformers``' ids for a
    Hugging Face tokenizer; token-id prompts (lists, tensors, numpy arrays) are used exactly as given. An
    empty prompt becomes ``[BOS]`` when the tokenizer has one.
    ``window``: SetDLM positional window ``w`` (default ``D``, as the paper's evals). ``threshold``: τ in
    (0, 1], commit every masked token at least this confident in addition to the top-1; None = off
    (exactly one token per step). ``block_size``: BD3LM/MDLM block (default ``family.block_size``).
    ``temperature`` 0 = greedy; ``top_p``, ``top_k``, ``repetition_penalty`` (on the generated tokens),
    ``length_penalty=(start, factor)`` (EOS boost, docs/method.md §5.3).
    Stopping: a row ends at its first EOS (``eos_token_id``, default the model's end-of-turn ids,
    :func:`end_of_turn_ids`; ``ignore_eos`` turns it off) once every position before it is decoded, at a
    stop string (needs a tokenizer; the text ends before it), or after ``max_new_tokens``. ``seed``: one
    int for every row or one per row.
    ``cache_order``: SetDLM order of newly cached tokens, ``"position"`` (the default) or ``"reveal"``
    (decreasing reveal time, docs/method.md §4.5; the times sampled from each row's seed). ``reveal_times``: the
    reveal times themselves, per row one number per generated position (a (B, max_new_tokens) tensor or
    nested lists), in place of sampled ones: the cache order is then ``"reveal"`` and does not depend on
    the seed, so a decode of the reference can be replayed with its times. ``trace=True`` records every
    step of every row (:class:`StepTrace`).
    The settings come either as ``settings=DecodeSettings(...)`` or as the keyword arguments above (which
    build one; giving both is a ``ValueError``); ``seed``, ``batch_size``, ``reveal_times``, ``progress`` and
    ``trace`` belong to the call.
    """
    settings = DecodeSettings.of(settings, knobs, "generate")
    ids = encode_prompts(model, prompts, "prompt", add_bos=True)
    budgets = _budgets(model, ids, settings.max_new_tokens)
    # a lower bound of the canvas's memory (the token lists, the canvas and its masks: >= 34 bytes a position)
    check_fits(f"decoding {len(ids)} row{'s' if len(ids) != 1 else ''} of up to {max(budgets, default=0):,} new "
               "tokens", 34 * sum(len(p) + n for p, n in zip(ids, budgets)), device_of(model.backbone),
               "lower max_new_tokens", fields=("max_new_tokens",))
    if settings.max_new_tokens is not None and not settings.speculate:  # speculation refuses it instead
        _warn_past_context(model, ids, settings.max_new_tokens)
    mask_id = model.family.mask_token_id
    for i, p in enumerate(ids):
        if mask_id in p:
            raise UserError(f"prompt {i} contains the MASK id {mask_id}; use fill() for masked inputs")
    sequences = [p + [mask_id] * n for p, n in zip(ids, budgets)]
    targets = [[False] * len(p) + [True] * n for p, n in zip(ids, budgets)]
    return _run(model, sequences, targets, settings, mode="generate", seed=seed, batch_size=batch_size,
                reveal_times=reveal_times, progress=progress, trace=trace)


def _budgets(model, ids: list[list[int]], max_new_tokens: int | None) -> list[int]:
    """Each row's budget: ``max_new_tokens``, or unset, the one rule (min(256, the row's room),
    :func:`~setdlm.decoding.settings.default_max_new_tokens`: a row's default never depends on its batch)."""
    if max_new_tokens is not None:
        return [max_new_tokens] * len(ids)
    return [default_max_new_tokens("generate", room=model.family.length - len(p)) for p in ids]


def _warn_past_context(model, ids: list[list[int]], max_new_tokens: int) -> None:
    """A budget given past a row's room is decoded (the sliding decoders evict the earliest tokens) with a
    warning, where the server refuses it."""
    L = model.family.length
    over = [i for i, p in enumerate(ids) if 0 < L - len(p) < max_new_tokens]
    if over:
        i = over[0]
        warnings.warn(InputWarning(
            f"max_new_tokens={max_new_tokens} runs past the context length L={L}: prompt {i} leaves room for "
            f"{L - len(ids[i])} tokens, and past that the decoder slides (the earliest tokens leave the context; "
            "docs/decoding.md, \"Prompt length\")", fields=("max_new_tokens",)), stacklevel=3)


def infill(model, prefixes, suffixes, lengths: int | Sequence[int], **kwargs) -> GenerationOutput:
    """Fill ``lengths`` tokens between each prefix and suffix (docs/method.md §4.6): the row is
    ``prefix + [MASK] × length + suffix`` and is decoded by :func:`fill`. ``out.tokens`` are the filled
    middles, ``out.sequences`` the whole rows, ``out.texts`` the decoded middles. Add BOS/EOS to the
    prefix/suffix yourself if your model was trained with them; a string prefix gets the tokenizer's BOS
    as :func:`generate` does. Keyword arguments: as :func:`fill`."""
    pre = encode_prompts(model, prefixes, "prefix", add_bos=True)
    suf = encode_prompts(model, suffixes, "suffix", allow_empty=True)
    if len(pre) != len(suf):
        raise UserError(f"got {len(pre)} prefixes but {len(suf)} suffixes")
    if model.family.spec.left_to_right and any(suf):  # AR: each gap sees what lies before it only
        warnings.warn(InputWarning(f"this {model.family.family!r} model decodes left to right: it infills from the "
                                   "prefix alone and never sees the suffix (docs/method.md §4.6); a diffusion "
                                   "model (setdlm, bd3lm, mdlm) conditions on both sides", fields=("suffix",)),
                      stacklevel=2)
    if isinstance(lengths, int) and not isinstance(lengths, bool):
        lens = [lengths] * len(pre)
    elif isinstance(lengths, (list, tuple)):
        lens = list(lengths)
    else:
        raise TypeError(f"lengths must be an int or a list of ints (one per row), got {type(lengths).__name__}")
    if len(lens) != len(pre):
        raise UserError(f"got {len(lens)} lengths for {len(pre)} rows")
    for i, m in enumerate(lens):
        if not isinstance(m, int) or isinstance(m, bool):
            raise TypeError(f"lengths[{i}] must be an int, got {type(m).__name__} {m!r}")
        if m < 1:
            raise UserError(f"lengths[{i}] must be a positive integer (tokens to fill), got {m}")
    L = model.family.length
    for i, (p, m, s) in enumerate(zip(pre, lens, suf)):
        if len(p) + m + len(s) > L:
            raise UserError(f"row {i}: prefix + {m} infilled tokens + suffix = {len(p) + m + len(s)} tokens, more "
                            f"than the context length L={L}")
    mask_id = model.family.mask_token_id
    return fill(model, [p + [mask_id] * m + s for p, m, s in zip(pre, lens, suf)], **kwargs)


def fill(model, sequences, settings: DecodeSettings | None = None, *, seed: int | Sequence[int] | None = None,
         batch_size: int | None = None, reveal_times=None, progress: bool = False, trace: bool = False,
         **knobs) -> GenerationOutput:
    """Decode every MASK token of each sequence (token-id lists; strings only if the tokenizer can map
    text to the MASK id), at arbitrary positions: several gaps work for every family. Every non-MASK token is context:
    SetDLM caches it all up front and slides its window over the masks; MDLM sees it all every step;
    BD3LM sees the blocks before the current one; AR sees what lies before each gap. A row ends when no
    MASK is left (``finish_reason`` "done"); no EOS or stop strings apply. The repetition penalty counts
    the visible context too (docs/method.md §4.3). ``eos_token_id`` only serves the length penalty.
    SetDLM caches newly committed tokens in ascending position, or, given ``reveal_times`` (per row one
    number per MASK, left to right), by decreasing reveal time as :func:`generate` does.
    ``out.tokens`` lists the filled tokens left to right. Settings: as :func:`generate` (``settings=`` or
    keywords); ``max_new_tokens``, ``stop``, ``ignore_eos`` and ``cache_order`` are a ``ValueError`` here."""
    settings = DecodeSettings.of(settings, knobs, "fill")
    ids = encode_prompts(model, sequences, "sequence")
    mask_id = model.family.mask_token_id
    L = model.family.length
    for i, s in enumerate(ids):
        if len(s) > L:
            raise UserError(f"sequence {i} has {len(s)} tokens, more than the context length L={L}")
    return _run(model, ids, [[t == mask_id for t in s] for s in ids], settings, mode="fill", seed=seed,
                batch_size=batch_size, reveal_times=reveal_times, progress=progress, trace=trace)


# ---------------------------------------------------------------------------------------------------------


def _run(model, sequences, targets, settings: DecodeSettings, *, mode, seed, batch_size, reveal_times, progress,
         trace) -> GenerationOutput:
    fam, backbone = model.family, model.backbone
    settings.check_for(fam.family, mode, drafts=drafts(model))
    n_targets = [sum(t) for t in targets]  # positions to decode per row
    times = _reveal_times(reveal_times, n_targets)
    if settings.speculate and times is not None:
        raise UserError("speculate caches tokens in position order, as the left-to-right decode it reproduces; "
                        "reveal_times do not apply")
    cfg = decode_config(model, settings, mode=mode, cache_order=_cache_order(settings.cache_order, times),
                        trace=trace, room=max(n_targets, default=1))
    warn_wide_window(settings, fam)  # after decode_config's memory check: an error comes alone
    warn_unused_layout(settings)
    stops = cfg.stop
    B = len(sequences)
    if batch_size is not None and not (isinstance(batch_size, int) and batch_size >= 1):
        raise UserError(f"batch_size must be a positive integer, got {batch_size!r}")
    for i, (s, n) in enumerate(zip(sequences, n_targets)):  # fill checked its rows' lengths already
        if mode == "generate":
            check_prompt_fits(len(s) - n, fam.length, f"prompt {i}")
            if cfg.speculate and len(s) > fam.length:
                raise UserError(f"speculate needs prompt + max_new_tokens <= the context length L={fam.length} (the "
                                f"left-to-right decode it reproduces evicts cache entries past L): prompt {i} has "
                                f"{len(s) - n} tokens, so max_new_tokens can be at most {fam.length - len(s) + n}",
                                fields=("speculate", "max_new_tokens"))
    seeds = row_seeds(seed, B, needs_seed(fam, cfg, times))
    # every row's constraint compiled and checked satisfiable before any decoding
    constraints = row_constraints(settings.constraints(B), sequences, targets, mode, model.tokenizer,
                                  cfg.sampling.eos_token_ids if cfg.stop_on_eos else (),
                                  left_to_right=left_to_right(fam.spec, cfg))
    device = device_of(backbone)
    bs = batch_size or B
    results, forwards, st = {}, 0, None
    bar = tqdm(total=sum(n_targets), disable=None if progress else True, desc=f"{fam.family} decoding",
               unit="tok")  # shown on a terminal only
    was_training = backbone.training
    backbone.eval()
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            for lo in range(0, B, bs):
                chunk = list(range(lo, min(lo + bs, B)))
                gens = None if seeds is None else [torch.Generator(device=device).manual_seed(seeds[i]) for i in chunk]
                st = DecodeState([sequences[i] for i in chunk], [targets[i] for i in chunk], cfg, index=chunk,
                                 generators=gens, device=device,
                                 constraints=None if constraints is None else [constraints[i] for i in chunk])
                _decode_chunk(backbone, st, fam, times, None if bar.disable else bar, n_targets)
                results.update(st.results)
                forwards += st.forwards
    except KeyboardInterrupt:  # Ctrl-C: keep the rows that had finished
        done = {**results, **(st.results if st is not None else {})}
        done_texts = {i: row_text(model.tokenizer, r, stops) for i, r in done.items()} if model.tokenizer else None
        raise DecodingInterrupted({i: r.tokens for i, r in done.items()}, done_texts, B) from None
    finally:
        backbone.train(was_training)
        bar.close()
    seconds = time.perf_counter() - t0
    rows = [results[i] for i in range(B)]
    texts = None
    if model.tokenizer is not None:
        texts = [row_text(model.tokenizer, r, stops) for r in rows]
    return GenerationOutput(tokens=[r.tokens for r in rows], sequences=[r.sequence for r in rows], texts=texts,
                            finish_reason=[r.finish_reason for r in rows], nfe=forwards,
                            row_nfe=[r.nfe for r in rows], row_committed=[r.committed for r in rows],
                            seconds=seconds,
                            trace=_traces(rows) if trace else None)


def _traces(rows: list[RowResult]) -> list[list[StepTrace]]:
    """Each row's steps, of a call decoded with ``trace`` (every row then has them)."""
    out = []
    for r in rows:
        if r.trace is None:
            raise RuntimeError("a row decoded with trace=True has no trace")
        out.append(r.trace)
    return out


class DecodingInterrupted(KeyboardInterrupt):
    """Ctrl-C during decoding. ``tokens`` (and ``texts``, with a tokenizer) of the rows that had finished,
    by row index, out of ``total`` rows: what was produced so far."""

    def __init__(self, tokens: dict[int, list[int]], texts: dict[int, str] | None, total: int):
        super().__init__(f"{len(tokens)} of {total} rows had finished")
        self.tokens, self.texts, self.total = tokens, texts, total


def _decode_chunk(backbone, st: DecodeState, fam, times, bar, n_targets: list[int]) -> None:
    """Decode every row of ``st`` to the end: prefill, then one step per forward until all rows finished.
    ``times``: explicit reveal times of every row of the call (or None: sampled, for the reveal cache order)."""
    decoder = decoder_of(fam, st.cfg)
    base = bar.n if bar is not None else 0
    if st.finish():  # rows with nothing to decode leave before any forward
        start(backbone, st, fam, None if times is None else [times[i] for i in st.index.tolist()])
    while st.batch:
        decoder.step(backbone, st)
        st.finish()
        if bar is not None:  # a finished row counts as complete, whatever EOS or a stop string cut off
            done = sum(n_targets[i] for i in st.results) + int((st.target & ~st.masked).sum())
            bar.update(base + done - bar.n)


def row_text(tokenizer, r, stops) -> str:
    """The text of a finished row ``r``: its tokens decoded, without the EOS that ended it, cut before the
    stop string that ended it."""
    toks = r.tokens
    if r.finish_reason == "eos":
        toks = toks[:-1]
    text = tokenizer.decode(toks)
    if r.finish_reason == "stop":
        text = text[: stop_index(text, stops)]
    return text


def decode_config(model, settings: DecodeSettings, *, mode: Mode, cache_order: str, trace: bool,
                  room: int | None = None) -> DecodeConfig:
    """The decoders' per-state configuration: ``settings`` checked against the model (stop strings need its
    tokenizer, EOS ids its vocabulary) with the family's defaults filled in (``window`` = ``D`` for SetDLM,
    ``block_size`` = ``family.block_size`` for BD3LM/MDLM, 1 where unused). A speculative decode's window is
    at most ``room``, the most positions a row decodes (default: what the shortest prompt, BOS, leaves of the
    context): its drafts never reach further, so a wider window only builds horizons past the rows (the
    output is that of ``window=1`` either way)."""
    fam = model.family
    if device_of(model.backbone).type == "meta":
        raise UserError("the model's weights are on the meta device (an empty model, built under "
                         "torch.device('meta') or init_empty_weights): load real weights first, e.g. setdlm.load(...)")
    stops = _stops(model, settings.stop)
    sampling = settings.sampling(fam.mask_token_id, eos_ids(model, settings.eos_token_id))
    window, block_size = fam.spec.decode_sizes(fam, settings.window, settings.block_size)
    drafting = drafts(model)
    if drafting:  # docs/drafter.md: the drafter drafts, the base verifies
        window = settings.window or model.backbone.window
        if settings.speculate is True or (settings.window is not None and settings.speculate != "next_token"):
            raise UserError("a model with a set drafter decodes as its base, or with drafts verified by the base "
                            "under speculate='next_token' (window: the drafter's window)", fields=("speculate",))
    if settings.speculate == "next_token" and not fam.ar_weight and not drafting:
        raise UserError("speculate='next_token' verifies with the model's next-token head, which this model was not "
                        "trained "
                        "for (its family's ar_weight is 0; train with ar_weight > 0, docs/method.md §2.10): use "
                        "speculate=True", fields=("speculate",))
    if settings.speculate:
        window = max(1, min(window, fam.length - 1 if room is None else room))
    sizes = {"window": window, "block_size": block_size}
    for name, v in sizes.items():
        if v >= 2**62:  # torch indexes with int64: a larger size overflows before any memory check could
            raise UserError(f"{name} must be below 2**62, got {v}")
    if fam.spec.cache_holds is not None:  # SetDLM/BD3LM: the cache holds room for 2 windows / blocks beyond L
        _check_cache_fits(model, fam.spec.cache_holds, sizes[fam.spec.cache_holds])
    return DecodeConfig(sampling, fam.length, mode=mode, stop_on_eos=mode == "generate" and not settings.ignore_eos,
                        window=window, block_size=block_size, cache_order=cache_order, stop=stops,
                        tokenizer=model.tokenizer, trace=trace,
                        speculate="drafter" if drafting and settings.speculate else settings.speculate or False,
                        verify_layout=settings.verify_layout)


def decoder_of(fam, cfg: DecodeConfig) -> Decoder:
    """The decoder module (``init`` and ``step``) of a state: the family's, or the self-speculative SetDLM
    decoder when ``cfg.speculate`` (``decoding/speculative.py``; ``"next_token"``:
    ``decoding/speculative_next_token.py``)."""
    if cfg.speculate == "drafter":  # speculate="next_token" on a model with a set drafter
        return speculative_drafter
    if cfg.speculate == "next_token":
        return speculative_next_token
    return speculative if cfg.speculate else DECODERS[fam.spec.decoder]


def _check_cache_fits(model, name: str, n: int) -> None:
    """Refuse a window / block so large (``window=10**9``) that one row's KV cache, which holds ``2 n``
    entries beyond the context, cannot fit the device: a lower bound from the bytes of one cache entry."""
    probe = model.backbone.new_cache(1, capacity=1)
    entry = sum(t.numel() * t.element_size() for t in [*probe.k, *probe.v, probe.pos])  # bytes of one position
    check_fits(f"decoding with {name}={n:,}", 2 * n * entry, device_of(model.backbone), f"lower {name}", fields=(name,))


def _reveal_order(fam, cfg: DecodeConfig) -> bool:
    """Does this SetDLM state cache new tokens in reveal order (the other families ignore the cache order)?"""
    return fam.spec.reveal_cache_order and cfg.cache_order == "reveal"


def needs_seed(fam, cfg: DecodeConfig, times=None) -> bool:
    """Rows need a seed when they sample, or when their reveal order is sampled (no explicit ``times``)."""
    return not cfg.sampling.greedy or (_reveal_order(fam, cfg) and times is None)


def start(backbone, st: DecodeState, fam, times=None) -> None:
    """Prefill the rows of ``st`` and, for the reveal cache order, rank their positions by reveal time
    (``times``: explicit per-row reveal times, else sampled from each row's generator)."""
    decoder_of(fam, st.cfg).init(backbone, st)
    if _reveal_order(fam, st.cfg):
        setdlm.reveal_rank(st, fam.schedule(), times)


def _cache_order(cache_order, times) -> str:
    """The SetDLM cache order: ``"position"`` by default, ``"reveal"`` with explicit reveal times."""
    if times is not None and cache_order == "position":
        raise UserError("reveal_times order the cache by reveal time; they contradict cache_order='position'")
    return "reveal" if times is not None else cache_order or "position"


def _reveal_times(reveal_times, n_targets: list[int]) -> list[torch.Tensor] | None:
    """Explicit reveal times (docs/method.md §1.3): one row per sequence, one finite number per generated position
    (left to right) → float64 tensors (n_b,), or None."""
    if reveal_times is None:
        return None
    if isinstance(reveal_times, torch.Tensor):
        if reveal_times.dim() != 2:
            raise UserError(f"reveal_times must be (rows, positions), got a tensor of shape "
                            f"{tuple(reveal_times.shape)}")
        reveal_times = list(reveal_times)
    if isinstance(reveal_times, (str, bytes)) or not isinstance(reveal_times, Sequence):
        raise TypeError(f"reveal_times must be one sequence of times per row, got {type(reveal_times).__name__}")
    if len(reveal_times) != len(n_targets):
        raise UserError(f"reveal_times has {len(reveal_times)} rows, but {len(n_targets)} rows are decoded")
    out = []
    for i, (row, n) in enumerate(zip(reveal_times, n_targets)):
        try:
            t = torch.as_tensor(row, dtype=torch.float64)
        except (TypeError, ValueError):
            raise TypeError(f"reveal_times row {i} must hold numbers, got {str(row)[:40]!r}") from None
        if t.dim() != 1 or t.numel() != n:
            raise UserError(f"reveal_times row {i} has shape {tuple(t.shape)}, but the row generates {n} "
                            f"positions: give one time per position")
        if not bool(torch.isfinite(t).all()):
            raise UserError(f"reveal_times row {i} holds a value that is not finite")
        out.append(t)
    return out


def _stops(model, stops: tuple[str, ...]) -> tuple[str, ...]:
    """The checked stop strings of the settings, which need the model's tokenizer."""
    if stops and model.tokenizer is None:
        raise UserError("stop strings need a tokenizer to decode the text; the model has none")
    return stops


def end_of_turn_ids(model) -> tuple[int, ...]:
    """The ids that end a model's turn: the tokenizer's EOS and, for a wrapped ``transformers`` model, its
    generation config's EOS ids (``<|im_end|>`` for SmolLM2; Qwen lists two). They stop every decoding
    path (``generate``, sessions, the server) unless ``ignore_eos`` or an explicit ``eos_token_id``."""
    e = getattr(model.tokenizer, "eos_token_id", None) if model.tokenizer is not None else None
    ids = [] if e is None else [int(e)]
    gen = getattr(getattr(getattr(model.backbone, "hf", None), "generation_config", None), "eos_token_id", None)
    for g in ([gen] if isinstance(gen, int) else gen or []):
        if isinstance(g, int) and int(g) not in ids:
            ids.append(int(g))
    return tuple(ids)


def eos_ids(model, eos_token_id) -> tuple[int, ...]:
    """The EOS ids a decode stops at: ``eos_token_id`` (an id or a list of them, checked against the model's
    vocabulary), or the model's :func:`end_of_turn_ids` when None."""
    if eos_token_id is None:
        return end_of_turn_ids(model)
    ids = (eos_token_id,) if isinstance(eos_token_id, int) else tuple(eos_token_id)
    vocab = vocab_size(model) or float("inf")
    if not all(isinstance(e, int) and 0 <= e < vocab for e in ids):
        raise UserError(f"eos_token_id must be a token id (or a list of them) in the model's vocabulary, got "
                        f"{eos_token_id!r}")
    return ids


def row_seeds(seed, B: int, needed: bool = True) -> list[int] | None:
    """One seed per row: ``seed`` checked (an int or numpy integer, or one per row; never a bool; within
    torch's seed range, :func:`setdlm.seeds.check_seed`) or, when none is given, drawn from torch's global RNG
    (``torch.manual_seed`` applies); None when the rows do not sample (a given seed is still checked)."""
    if seed is None:
        return torch.randint(0, 2**62, (B,)).tolist() if needed else None
    if is_token_id(seed):  # an int, or a numpy integer
        seeds = [check_seed(int(seed))] * B
    else:
        if isinstance(seed, (str, bytes)) or not isinstance(seed, (Sequence, torch.Tensor, np.ndarray)):
            raise TypeError(f"seed must be an int or one int per row ({B}), got {type(seed).__name__} {seed!r}")
        seeds = [int(s) if is_token_id(s) else s for s in seed]
        if len(seeds) != B:
            raise UserError(f"seed must be an int or one int per row ({B}), got {seed!r}")
        seeds = [check_seed(s, f"seed[{i}]") for i, s in enumerate(seeds)]
    return seeds if needed else None


def device_of(backbone) -> torch.device:
    """The device of ``backbone``'s weights (CPU for a backbone without parameters)."""
    p = next(iter(backbone.parameters()), None)
    return p.device if p is not None else torch.device("cpu")
