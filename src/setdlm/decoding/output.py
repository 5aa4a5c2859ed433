"""What a decoding call returns: tokens, texts and the figures people benchmark (docs/method.md §4.10).

NFE counts backbone forwards; the prefill forward that caches the prompt (or the infilling context) is
not counted, as in the paper. ``tokens_per_step`` is the parallelism factor: tokens committed per forward
a row took part in, pooled over rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UserError


@dataclass
class StepTrace:
    """One row's view of one decoding step (recorded with ``trace=True``)."""

    input_positions: list[int]  # backbone position ids of the row's input tokens, in input order
    query_positions: list[int]  # masked positions predicted this step (ascending)
    candidates: list[int]  # the candidate token of each query
    confidences: list[float]  # its probability under the processed distribution
    committed_positions: list[int]  # positions committed this step (ascending)
    committed_tokens: list[int]
    cache_length: int  # entries in the row's KV cache after the forward (0 without a cache)
    # speculative decoding (decoding/speculative.py): the draft this step verified (ascending positions and
    # their tokens) and how many of them, a prefix, were accepted; the rest were rejected
    draft_positions: list[int] = field(default_factory=list)
    draft_tokens: list[int] = field(default_factory=list)
    accepted: int = 0
    # committed positions whose token a constraint chose because the model's first choice was not allowed
    # (docs/decoding.md "Constrained decoding"); ascending
    constrained_positions: list[int] = field(default_factory=list)
    # with DecodeConfig.top_logprobs = k: per query (as query_positions), its k most probable tokens as (token,
    # log-probability) under the distribution its candidate was drawn from, most probable first
    top: list[list[tuple[int, float]]] | None = None


@dataclass
class GenerationOutput:
    """Result of :func:`setdlm.decoding.generate` / :func:`~setdlm.decoding.infill` (one entry per row).

    ``tokens`` are the generated tokens only (for infilling: the filled positions, left to right); an EOS
    that ended a row is included, a stop string's tokens too (the text excludes both). ``sequences`` are
    the whole rows: prompt + tokens, or prefix + middle + suffix.
    """

    tokens: list[list[int]]
    sequences: list[list[int]]
    texts: list[str] | None
    # "eos" | "stop" | "length" (max_new_tokens reached; a constrained output is then a whole match,
    # docs/decoding.md "Two engines") | "done" (all masks filled)
    finish_reason: list[str]
    nfe: int  # backbone forwards, prefill excluded (a batched forward counts once)
    row_nfe: list[int]  # forwards each row took part in
    row_committed: list[int]  # tokens each row committed (including any past its EOS or stop string)
    seconds: float  # wall-clock time of decoding, prefill included (tokenization excluded)
    trace: list[list[StepTrace]] | None = field(default=None, repr=False)

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_step(self) -> float:
        """Committed tokens per forward, pooled over rows (1.0 for AR and for threshold off)."""
        return sum(self.row_committed) / max(sum(self.row_nfe), 1)

    @property
    def tokens_per_second(self) -> float:
        """Output tokens per wall-clock second over the whole call."""
        return self.num_tokens / self.seconds if self.seconds > 0 else float("inf")


def step_record(trace: StepTrace, step: int, start: int, tokenizer=None) -> dict:
    """One step's committed set as plain JSON, the per-step record of ``setdlm generate --trace`` and of the
    server's stream (docs/serve.md): ``step`` index, ``positions`` (offsets from the first generated
    position ``start``), ``token_ids``, ``tokens`` (each id decoded alone; with a tokenizer) and
    ``confidences`` (each token's probability under the processed distribution, paper §4 commit rule); for
    a self-speculative step that verified a draft (docs/decoding.md), ``draft``: its ``positions``,
    ``token_ids`` (and ``tokens``) and how many of them, a prefix, were ``accepted`` (the rest rejected);
    with a constraint that overrode the model's first choice, ``constrained`` (those positions' offsets)."""
    conf = dict(zip(trace.query_positions, trace.confidences))
    rec = {"step": step, "positions": [p - start for p in trace.committed_positions],
           "token_ids": list(trace.committed_tokens)}
    if tokenizer is not None:
        rec["tokens"] = [tokenizer.decode([t]) for t in trace.committed_tokens]
    rec["confidences"] = [round(conf[p], 6) for p in trace.committed_positions]
    if trace.draft_positions:
        draft = {"positions": [p - start for p in trace.draft_positions], "token_ids": list(trace.draft_tokens)}
        if tokenizer is not None:
            draft["tokens"] = [tokenizer.decode([t]) for t in trace.draft_tokens]
        rec["draft"] = {**draft, "accepted": trace.accepted}
    if trace.constrained_positions:
        rec["constrained"] = [p - start for p in trace.constrained_positions]
    return rec


def trace_rows(out: GenerationOutput, tokenizer=None) -> list[list[dict]]:
    """Every row's per-step committed sets (:func:`step_record`), positions counted from the row's first
    generated token: what ``setdlm generate --trace`` writes (needs ``trace=True``)."""
    if out.trace is None:
        raise UserError("the output has no trace: decode with trace=True")
    return [[step_record(t, k, len(out.sequences[i]) - len(out.tokens[i]), tokenizer) for k, t in enumerate(steps)]
            for i, steps in enumerate(out.trace)]


# ANSI 256-colour backgrounds from blue (first step) to red (last step)
STEP_COLOURS = (21, 27, 33, 39, 45, 51, 50, 48, 46, 82, 118, 154, 190, 226, 220, 214, 208, 202, 196)


def order_text(tokens: list[int], steps: list[dict], tokenizer, colour: bool) -> str:
    """The decode-order view of one row (``setdlm generate --show-order``): its generated ``tokens`` left to
    right, each coloured by the step that decided it (an ANSI background from :data:`STEP_COLOURS`) or, with
    ``colour`` False, preceded by a plain marker ``[step]``. ``steps``: the row's :func:`step_record`\\ s. An
    ending EOS is left out."""
    step_of = {p: s["step"] for s in steps for p in s["positions"]}
    n_steps = max(len(steps), 1)
    eos = getattr(tokenizer, "eos_token_id", None)
    parts = []
    for j, t in enumerate(tokens):
        if t == eos and j == len(tokens) - 1:
            break
        text, k = tokenizer.decode([t]), step_of.get(j, 0)
        if colour:
            c = STEP_COLOURS[round(k * (len(STEP_COLOURS) - 1) / max(n_steps - 1, 1))]
            parts.append(f"\x1b[30;48;5;{c}m{text}\x1b[0m")
        else:
            parts.append(f"[{k}]{text}")
    return "".join(parts)
