"""Response bodies and streamed chunks in OpenAI's shapes, with setdlm's own fields (docs/serve.md).

Streaming sends one chunk per decoding step of the row. Its ``choices[0]`` carries the text that became
final at that step, left to right (``text`` for completions, ``delta.content`` for chat), so any OpenAI
client reads it; its ``setdlm`` field carries the set committed at that step (positions, token ids,
tokens, confidences: :func:`setdlm.decoding.output.step_record`), which may lie anywhere to the right.
"""

from __future__ import annotations

import time
import uuid

from ..decoding.session import Row, RowDone
from ..decoding.state import stop_index

# done: an infilled middle
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "done": "stop"}


def finish_reason(done: RowDone, constrained: bool) -> str:
    """OpenAI's ``finish_reason`` of a finished row. A constrained row that used its whole budget ended on a
    whole match (the constraint keeps the output completable within the budget, so its end is accepting):
    "stop", as when the model closes the JSON itself, not "length" (which clients read as a cut answer); this
    holds for both engines (docs/decoding.md "Two engines")."""
    return "stop" if constrained and done.finish_reason == "length" else FINISH[done.finish_reason]


class TextStream:
    """The text of one row that is final so far: the decoded prefix of contiguous committed positions from
    the first generated one, cut before an EOS or a stop string, and holding back what a stop string or an
    incomplete UTF-8 character could still change. What it emits is always a prefix of the final text."""

    def __init__(self, tokenizer, row: Row):
        self.tokenizer, self.start = tokenizer, row.prompt_length
        cfg = row.config
        self.eos = set(cfg.sampling.eos_token_ids) if cfg.stop_on_eos else set()
        self.stops = cfg.stop
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.tokens: dict[int, int] = {}  # position → committed token
        self.ids: list[int] = []  # the resolved prefix
        self.sent = ""
        self.closed = False  # an EOS or a stop string ended the resolved text

    def update(self, trace) -> str:
        """Take one step's commits; return the newly final text (possibly empty)."""
        self.tokens.update(zip(trace.committed_positions, trace.committed_tokens))
        if self.tokenizer is None or self.closed:
            return ""
        grew = False
        while (p := self.start + len(self.ids)) in self.tokens:
            t = self.tokens[p]
            if t in self.eos:
                self.closed = True
                break
            self.ids.append(t)
            grew = True
        if not grew:
            return ""
        text = self.tokenizer.decode(self.ids)
        cut = stop_index(text, self.stops) if self.stops else None
        if cut is not None:
            text, self.closed = text[:cut], True
        else:
            text = text.rstrip("\ufffd")  # an incomplete multi-byte character
            text = text[: max(len(text) - self.hold, 0)]
        return self._emit(text)

    def finish(self, final: str | None) -> str:
        """The rest of the final text (the row's text as ``generate`` returns it)."""
        return self._emit(final or "")

    def _emit(self, text: str) -> str:
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def summary(done: RowDone | None, seconds: float, seed: int | None) -> dict:
    """setdlm's figures of a finished choice: forwards, tokens per step, decode seconds, the seed (``done``
    None: a choice that decoded nothing, the prompt echoed alone)."""
    if done is None:
        return {"nfe": 0, "tokens_per_step": 0.0, "decode_seconds": round(seconds, 4), "seed": seed}
    return {"nfe": done.nfe, "tokens_per_step": round(done.committed / max(done.nfe, 1), 4),
            "decode_seconds": round(seconds, 4), "seed": seed}


def extension(summaries: list[dict]) -> dict:
    """The answer's ``setdlm`` field: the first choice's figures, and with several choices each one's
    (``choices``, in index order)."""
    return summaries[0] | ({"choices": summaries} if len(summaries) > 1 else {})


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def choice(chat: bool, index: int, text: str | None, finish: str | None, logprobs: dict | None = None,
           tool_calls: list[dict] | None = None) -> dict:
    """One choice of a non-streamed answer (chat: ``tool_calls``, the answer's calls; its content is then None)."""
    if chat:
        message = {"role": "assistant", "content": text} | ({"tool_calls": tool_calls} if tool_calls else {})
        return {"index": index, "message": message, "finish_reason": finish, "logprobs": logprobs}
    return {"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs}


def completion(chat: bool, rid: str, model: str, choices: list[dict], counts: dict, setdlm: dict) -> dict:
    """The non-streaming body: the ``choices`` (:func:`choice`), ``usage`` ``counts`` and setdlm's figures."""
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": choices, "usage": counts, "setdlm": setdlm}


def chunk(chat: bool, rid: str, model: str, text: str | None, *, finish: str | None = None, step: dict | None = None,
          role: bool = False, index: int = 0, logprobs: dict | None = None,
          tool_calls: list[dict] | None = None) -> dict:
    """One streamed chunk of choice ``index``: the newly final ``text`` (and its tokens' ``logprobs``) and the
    step's committed set; chat's ``tool_calls``: the answer's calls, whole (their content None)."""
    if chat:
        delta: dict[str, object] = {"role": "assistant", "content": text} if role else {"content": text}
        if tool_calls:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(tool_calls)]
        choice: dict[str, object] = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
    else:
        choice = {"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs}
    body: dict[str, object] = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice]}
    if step is not None:
        body["setdlm"] = step
    return body
