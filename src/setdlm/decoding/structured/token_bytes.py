"""A tokenizer's tokens as the bytes they add to the text (docs/decoding.md "Constrained decoding"): what the
token automaton and the CFG engine read, and a digest of it that keys their caches."""

from __future__ import annotations

import hashlib
import json

from ...errors import UserError


def token_bytes(tokenizer) -> list[bytes | None]:
    """The bytes each token id contributes to the decoded text (None: special tokens, never allowed), for a
    tokenizer of this library (``setdlm.data.tokenizers.Tokenizer``): byte-level BPE decodes a token's
    string through GPT-2's byte alphabet; a character (or other fused) tokenizer's token is its text."""
    backend = getattr(tokenizer, "backend", None)
    if backend is None or not hasattr(backend, "get_vocab"):
        raise UserError("constrained decoding needs a setdlm tokenizer (setdlm.data.tokenizers); got "
                        f"{type(tokenizer).__name__}")
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    kind = decoder.get("type")
    if kind not in ("ByteLevel", "Fuse", None):
        raise UserError(f"constrained decoding supports byte-level BPE and character tokenizers; this tokenizer's "
                        f"decoder is {kind!r}")
    special = set(getattr(tokenizer, "special_ids", ()) or ())
    added = {i: t for i, t in backend.get_added_tokens_decoder().items()}
    vocab = backend.get_vocab(with_added_tokens=True)
    out: list[bytes | None] = [None] * (max(vocab.values()) + 1)
    table = _byte_decoder() if kind == "ByteLevel" else None
    for text, i in vocab.items():
        if i in special or (i in added and added[i].special):
            continue
        if i in added or table is None:
            out[i] = text.encode("utf-8")
        else:
            try:
                out[i] = bytes(table[c] for c in text)
            except KeyError:  # not a byte-level string: leave the token out (it is never allowed)
                continue
    return out


def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in character of every byte, inverted (the ByteLevel alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def vocabulary(tokenizer) -> tuple[list[bytes | None], str, int]:
    """:func:`token_bytes`, a digest of them and the longest token's length in bytes."""
    pieces = token_bytes(tokenizer)
    digest = hashlib.sha256(b"\0".join(b"\1" if p is None else b"\2" + p for p in pieces)).hexdigest()
    return pieces, digest, max((len(p) for p in pieces if p), default=1)
