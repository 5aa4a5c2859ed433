"""A prompt string as token ids: the one place that decides how decoding starts (docs/method.md §2.1, §4.2).

Two conventions, chosen by the tokenizer:

* the training convention (``tokenizer.prompt == "bos"``: setdlm's own tokenizers, ``kind`` ``bpe`` or
  ``char``, the tokenizer of every model setdlm or the paper's authors trained, whatever its kind, and any
  duck-typed tokenizer without ``prompt``): ``setdlm train`` lays out a prompt/completion pair as ``[BOS] prompt completion [EOS]``
  (:func:`setdlm.data.dataset.pad_pairs`), and packed documents start every row with BOS, so a model is
  decoded from the same start: ``[BOS] + tokenizer.encode(text)``, with no BOS when the tokenizer has none.
* a pretrained model's own tokenization (``tokenizer.prompt == "transformers"``, the default of a Hugging
  Face tokenizer: a GGUF file's, a Hub causal LM's, :class:`setdlm.hf.HFTokenizer`): exactly the ids ``transformers``' tokenizer gives for ``text`` (``tokenizer(text).input_ids``): its
  post-processor decides, as its ``add_bos_token`` / ``add_eos_token`` say, and a special token's string in
  the text (``<|im_start|>``) is that token. A pretrained model is decoded from
  the ids it was trained on; SmolLM2-135M (``add_bos_token`` false) gets no ``<|im_start|>`` in front.

``tokenizer.encode`` never adds special tokens (:mod:`setdlm.data.tokenizers`), so special tokens are added
here and only here. Every caller that turns text into a decoding context uses these functions: ``generate`` /
``infill`` (:mod:`setdlm.decoding.api`), the server, the task evaluators (:mod:`setdlm.evaluate`), the CLI's
prompt lengths and the lm-eval adapter (:mod:`setdlm.harness`, which follows lm-eval's rule of starting with
EOS when a tokenizer has no BOS). Chat messages go through :func:`setdlm.chat.chat_prompt` instead.

``tokenizer`` is any object with ``encode(text) -> list[int]`` and ``bos_token_id`` / ``eos_token_id``
(None when absent), e.g. :class:`setdlm.data.tokenizers.Tokenizer` or the Hugging Face adapter; a
``"transformers"`` one also has ``encode_special(text, add_special_tokens=True)``.
"""

from __future__ import annotations


def start_ids(tokenizer, *, eos_fallback: bool = False) -> list[int]:
    """``[BOS]`` when ``tokenizer`` has a BOS token, else ``[]``; with ``eos_fallback``, ``[EOS]`` when there
    is no BOS (lm-eval's prefix token), ``[]`` only when there is neither."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None and eos_fallback:
        bos = getattr(tokenizer, "eos_token_id", None)
    return [] if bos is None else [int(bos)]


def follows_transformers(tokenizer) -> bool:
    """Does ``tokenizer`` encode prompts as ``transformers`` does (its ``prompt`` convention)?"""
    return getattr(tokenizer, "prompt", None) == "transformers"


def encode_prompt(tokenizer, text: str) -> list[int]:
    """The token ids a model is decoded from for the prompt ``text``: ``transformers``' ids for a Hugging Face
    tokenizer, ``[BOS] + tokenizer.encode(text)`` for setdlm's own."""
    if not isinstance(text, str):
        raise TypeError(f"a prompt must be a string, got {type(text).__name__}")
    if follows_transformers(tokenizer):  # special tokens' strings in the text are those tokens, as there
        return list(tokenizer.encode_special(text, add_special_tokens=True))
    return start_ids(tokenizer) + list(tokenizer.encode(text))
