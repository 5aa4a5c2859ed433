"""A prompt string as token ids: the one place that decides how decoding starts (docs/method.md §2.1, §4.2).

Two conventions, chosen by the tokenizer:

* the training convention (``tokenizer.prompt == "bos"``: setdlm's own tokenizers, ``kind`` ``bpe`` or
  ``char``, the tokenizer of every model setdlm or the paper's authors trained, whatever its kind, and any
  duck-typed tokenizer without ``prompt``): ``setdlm train`` lays out a prompt/completion pair as ``[BOS] prompt
  completion [EOS]``
  (:func:`setdlm.data.dataset.pad_pairs`), and packed documents start every row with BOS, so a model is
  decoded from the same start: ``[BOS] + tokenizer.encode(text)``, with no BOS when the tokenizer has none.
* a pretrained model's own tokenization (``tokenizer.prompt == "transformers"``, the default of a Hugging
  Face tokenizer: a GGUF file's, a Hub causal LM's, :class:`setdlm.formats.hf.HFTokenizer`): exactly the ids
  ``transformers``' tokenizer gives for ``text`` (``tokenizer(text).input_ids``): its
  post-processor decides, as its ``add_bos_token`` / ``add_eos_token`` say, and a special token's string in
  the text (``<|im_start|>``) is that token. A pretrained model is decoded from
  the ids it was trained on; SmolLM2-135M (``add_bos_token`` false) gets no ``<|im_start|>`` in front.

``tokenizer.encode`` never adds special tokens (:mod:`setdlm.data.tokenizers`), so special tokens are added
here and only here. Every caller that turns text into a decoding context uses these functions: ``generate`` /
``infill`` (:mod:`setdlm.decoding.api`), the server, the task evaluators (:mod:`setdlm.evaluation.passes`), the CLI's
prompt lengths and the lm-eval adapter (:mod:`setdlm.evaluation.harness`, which follows lm-eval's rule of starting with
EOS when a tokenizer has no BOS). Chat messages go through :func:`setdlm.chat.chat_prompt` instead.

``tokenizer`` is any object with ``encode(text) -> list[int]`` and ``bos_token_id`` / ``eos_token_id``
(None when absent), e.g. :class:`setdlm.data.tokenizers.Tokenizer` or the Hugging Face adapter; a
``"transformers"`` one also has ``encode_special(text, add_special_tokens=True)``.

:func:`encode_prompts` turns what a caller gives (strings, token-id lists, tensors, numpy arrays; one or a
batch) into checked token-id lists for a model: ``generate`` / ``infill`` / ``fill``, decoding sessions and
the server. :func:`check_prompt_fits` is the one prompt-length rule: a prompt must leave room for at least
one new token in the context, ``n <= L - 1`` (docs/decoding.md, "Prompt length").
"""

from __future__ import annotations

import numbers

import numpy as np
import torch

from ..errors import UserError


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


def encode_prompt(tokenizer, text: str, *, end: bool | str = True) -> list[int]:
    """The token ids a model is decoded from for the prompt ``text``: ``transformers``' ids for a Hugging Face
    tokenizer, ``[BOS] + tokenizer.encode(text)`` for setdlm's own. ``end``: a non-empty ``text`` that does not
    end with the tokenizer's ``prompt_end`` (what every training prompt ended with: the shipped word-problem
    models' ``"\n"``) gets it, the training format; ``end="unended"`` (a prefix to infill): only a text that
    holds no ``prompt_end`` yet gets it (a question alone, as the server's infilling prompt; a prefix that
    reaches into the answer is kept as given)."""
    if not isinstance(text, str):
        raise TypeError(f"a prompt must be a string, got {type(text).__name__}")
    suffix = getattr(tokenizer, "prompt_end", None) if end else None
    if (isinstance(suffix, str) and suffix and text and not text.endswith(suffix)
            and not (end == "unended" and suffix in text)):
        text += suffix
    if follows_transformers(tokenizer):  # special tokens' strings in the text are those tokens, as there
        return list(tokenizer.encode_special(text, add_special_tokens=True))
    return start_ids(tokenizer) + list(tokenizer.encode(text))


def check_text(text: str, what: str) -> None:
    """A ``UserError`` naming ``what`` unless ``text`` is text (encodable as UTF-8): a lone surrogate is half
    of a UTF-16 pair, and U+DC80..U+DCFF is how Python keeps a byte that was not UTF-8 (a command-line
    argument in another encoding)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        c = ord(text[e.start])
        if 0xDC80 <= c <= 0xDCFF:
            raise UserError(f"{what} holds the byte 0x{c - 0xDC00:02x} (at character {e.start}), which is not "
                            "UTF-8: give the text in UTF-8") from None
        raise UserError(f"{what} holds a lone surrogate (\\u{c:04x} at character {e.start}), which is not text: "
                        "half of a UTF-16 pair without its other half") from None


def max_prompt_tokens(length: int) -> int:
    """The longest prompt a context of ``length`` (L) tokens takes: ``L - 1``, room for one new token."""
    return length - 1


def check_prompt_fits(n_prompt: int, length: int, what: str = "prompt") -> None:
    """The prompt-length rule of every entry point (``generate``, sessions, the CLI, the server, the
    evaluators): a ``ValueError`` naming ``what`` when ``n_prompt`` tokens leave no room for a new token in a
    context of ``length`` (L) tokens, i.e. unless ``n_prompt <= L - 1``. A prompt of L tokens would be
    decodable only by evicting its first tokens before the first new one is predicted (docs/method.md §4.5),
    so it is refused rather than silently truncated."""
    if n_prompt > max_prompt_tokens(length):
        raise UserError(f"{what} is {n_prompt} tokens long, which leaves no room for a new token in the context "
                         f"length L={length} (at most {max_prompt_tokens(length)} fit)")


def is_token_id(t) -> bool:
    """A token id: a Python or numpy integer, never a bool."""
    return isinstance(t, numbers.Integral) and not isinstance(t, (bool, np.bool_))


def vocab_size(model) -> int | None:
    """The vocabulary of ``model``'s backbone (its output size), for checking token ids; None when it does
    not say."""
    bb = model.backbone
    v = getattr(bb, "vocab_size", None) or getattr(getattr(bb, "config", None), "vocab_size", None)
    return v if isinstance(v, int) else None


_END: dict[str, bool | str] = {"prompt": True, "prefix": "unended"}  # encode_prompt's end, by what is encoded


def encode_prompts(model, items, what: str = "prompt", *, add_bos: bool = False,
                   allow_empty: bool = False) -> list[list[int]]:
    """Strings or token-id lists (tensors, numpy arrays) -> token-id lists for ``model`` (an object with
    ``tokenizer`` and ``backbone``); one item alone is wrapped into a batch. A string is encoded by
    :func:`encode_prompt` with ``add_bos`` (its BOS convention), else by ``tokenizer.encode`` alone. Every id
    must lie in the backbone's vocabulary; an empty item becomes ``[BOS]`` unless ``allow_empty``. Bad input
    is a ``TypeError`` / ``ValueError`` naming ``what`` and the item's index."""
    if isinstance(items, np.ndarray):  # numpy token ids: as a tensor of them
        items = torch.from_numpy(items) if items.dtype.kind in "iu" else items.tolist()
    if not isinstance(items, (str, list, tuple, torch.Tensor)):
        raise TypeError(f"{what}{'es' if what.endswith('x') else 's'} must be strings or token-id lists, got "
                        f"{type(items).__name__}"
                        + ("; decode the bytes first (b.decode('utf-8'))" if isinstance(items, (bytes, bytearray))
                           else ""))
    if isinstance(items, str) or (isinstance(items, (list, tuple)) and items and is_token_id(items[0])):
        items = [items]
    if isinstance(items, torch.Tensor):
        items = items.tolist() if items.dim() == 2 else [items.tolist()]
    items = list(items)
    if not items:
        raise UserError(f"empty batch: no {what}s given")
    tok = model.tokenizer
    vocab = vocab_size(model)
    out = []
    for i, x in enumerate(items):
        if isinstance(x, np.ndarray):
            x = x.tolist()
        if not isinstance(x, (str, list, tuple, torch.Tensor)):
            raise TypeError(f"{what} {i} must be a string or a list of token ids, got {type(x).__name__}"
                            + ("; decode the bytes first" if isinstance(x, (bytes, bytearray)) else ""))
        if isinstance(x, str):
            check_text(x, f"{what} {i}")
            if tok is None:
                raise UserError(f"{what} {i} is a string but the model has no tokenizer; pass token ids")
            x = encode_prompt(tok, x, end=_END.get(what, False)) if add_bos \
                else tok.encode(x)
        if isinstance(x, torch.Tensor):
            x = x.tolist()
        x = list(x)
        if not all(is_token_id(t) and t >= 0 for t in x):
            raise UserError(f"{what} {i} must hold non-negative integer token ids, got {x[:8]!r}")
        x = [int(t) for t in x]  # numpy integers become ints
        if vocab is not None and x and max(x) >= vocab:
            raise UserError(f"{what} {i} holds token id {max(x)}, outside the model's vocabulary of {vocab}")
        if not x and not allow_empty:
            x = start_ids(tok) if tok is not None else []
            if not x:
                raise UserError(f"{what} {i} is empty and no BOS token is known to start it")
        out.append(x)
    return out
