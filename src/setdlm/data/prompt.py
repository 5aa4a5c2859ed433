"""A prompt string as token ids: the one place that decides how decoding starts (docs/method.md §2.1, §4.2).

``setdlm train`` lays out a prompt/completion pair as ``[BOS] prompt completion [EOS]``
(:func:`setdlm.data.dataset.pad_pairs`), and packed documents start every row with BOS, so a model is decoded
from the same start: ``[BOS] + tokenizer.encode(text)``, with no BOS when the tokenizer has none.
``tokenizer.encode`` never adds special tokens (:mod:`setdlm.data.tokenizers`), so BOS is added here and
only here. Every caller that turns text into a decoding context uses these functions: ``generate`` /
``infill`` (:mod:`setdlm.decoding.api`), the task evaluators (:mod:`setdlm.evaluate`), the CLI's prompt
lengths and the lm-eval adapter (:mod:`setdlm.harness`, which follows lm-eval's rule of starting with EOS
when a tokenizer has no BOS).

``tokenizer`` is any object with ``encode(text) -> list[int]`` and ``bos_token_id`` / ``eos_token_id``
(None when absent), e.g. :class:`setdlm.data.tokenizers.Tokenizer` or the Hugging Face adapter.
"""

from __future__ import annotations


def start_ids(tokenizer, *, eos_fallback: bool = False) -> list[int]:
    """``[BOS]`` when ``tokenizer`` has a BOS token, else ``[]``; with ``eos_fallback``, ``[EOS]`` when there
    is no BOS (lm-eval's prefix token), ``[]`` only when there is neither."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None and eos_fallback:
        bos = getattr(tokenizer, "eos_token_id", None)
    return [] if bos is None else [int(bos)]


def encode_prompt(tokenizer, text: str) -> list[int]:
    """The token ids a model is decoded from for the prompt ``text``: ``[BOS] + tokenizer.encode(text)``."""
    if not isinstance(text, str):
        raise TypeError(f"a prompt must be a string, got {type(text).__name__}")
    return start_ids(tokenizer) + list(tokenizer.encode(text))
