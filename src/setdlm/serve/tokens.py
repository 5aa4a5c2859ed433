"""vLLM's tokenizer endpoints (docs/serve.md): ``POST /tokenize`` (``{"prompt"}`` or ``{"messages"}``) and
``POST /detokenize`` (``{"tokens"}``), spelled as vLLM spells them.

``/tokenize`` with ``add_special_tokens`` (the default) gives the ids the server decodes that prompt from
(:func:`setdlm.data.prompt.encode_prompt`: ``[BOS] + encode(text)`` and a word-problem model's newline for
setdlm's tokenizers, ``transformers``' ids for a Hugging Face one); without, the text's tokens alone. With
``messages`` it gives the chat path's ids (:func:`setdlm.chat.chat_prompt`).
"""

from __future__ import annotations

from ..data.prompt import follows_transformers
from ..decoding.request import is_int
from .logprobs import token_text
from .schemas import APIError, _get, _messages_ids, _prompt_ids, read_body


def _tokenizer(model):
    if model.tokenizer is None:
        raise APIError(400, "this model has no tokenizer", "prompt")
    return model.tokenizer


def tokenize(model, name: str, raw: bytes, width: int) -> dict:
    """``{"count", "max_model_len", "tokens", "token_strs"}`` of the body's ``prompt`` or ``messages``."""
    body = read_body(raw, name)
    tok = _tokenizer(model)
    if ("prompt" in body) == ("messages" in body):
        raise APIError(400, "give one of prompt (a string) or messages (a chat)", "prompt")
    if "messages" in body:
        ids = _messages_ids(body, model)
    else:
        if not isinstance(body["prompt"], str):
            raise APIError(400, f"prompt must be a string, got {type(body['prompt']).__name__}", "prompt")
        if _get(body, "add_special_tokens", bool, True):
            ids = _prompt_ids(body["prompt"], model, "prompt")
        elif follows_transformers(tok):
            ids = list(tok.encode_special(body["prompt"], add_special_tokens=False))
        else:
            ids = list(tok.encode(body["prompt"]))
    strs = [token_text(tok, t) for t in ids] if _get(body, "return_token_strs", bool, False) else None
    return {"count": len(ids), "max_model_len": width, "tokens": ids, "token_strs": strs}


def detokenize(model, name: str, raw: bytes, width: int) -> dict:
    """``{"prompt"}``: the text of the body's ``tokens`` (special tokens left out, as the answers' text)."""
    body = read_body(raw, name)
    tok = _tokenizer(model)
    ids = body.get("tokens")
    vocab = tok.vocab_size
    if not (isinstance(ids, list) and all(is_int(t) and 0 <= t < vocab for t in ids)):
        raise APIError(400, f"tokens must be a list of token ids below the vocabulary size {vocab}", "tokens")
    return {"prompt": tok.decode(ids)}
