"""Tokenizers: byte-level BPE trained on your corpus, characters, or any Hugging Face tokenizer (docs/method.md §9.5).

All three are one class, :class:`Tokenizer`, a thin wrapper over a ``tokenizers.Tokenizer`` that records the
special tokens explicitly:

* ``train_bpe(texts, vocab_size)`` — byte-level BPE (GPT-2 style: every byte is in the alphabet, so nothing
  is ever unknown), trained in seconds on a few MB.
* ``char_tokenizer(texts)`` — one token per character seen in ``texts`` (unseen characters map to
  ``<|unk|>``); for tiny tasks.
* ``load_tokenizer(folder)`` — a folder holding ``tokenizer.json`` (+ ``tokenizer_config.json`` naming the
  special tokens, as Hugging Face writes it); a folder with only slow-tokenizer files is converted through
  ``transformers`` (optional extra ``hf``). ``from_hub(name)`` downloads one, only when asked.

A MASK token (``<|mask|>``) is added when the tokenizer has none. ``encode`` never adds BOS/EOS and never
turns text into special tokens (a literal ``<|mask|>`` in a document stays text); the datasets add
BOS/EOS explicitly. ``save(folder)`` writes ``tokenizer.json`` and ``tokenizer_config.json``, which both
``load_tokenizer`` and ``transformers.AutoTokenizer`` read back.

A tokenizer that starts a string prompt with BOS (``prompt == "bos"``: setdlm's own) and has no
post-processor gets one that puts BOS in front (``<|bos|> $A``), so that a Hugging Face tokenizer read from
the same files (``AutoTokenizer.from_pretrained(folder)(text).input_ids``, lm-eval's ``huggingface`` backend
with ``add_bos_token=True``) gives the ids setdlm decodes a string prompt from: ``[BOS] + encode(text)``
(:func:`setdlm.data.prompt.encode_prompt`; its ``prompt_end`` newline is setdlm's alone). ``encode`` never
applies it.
"""

from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Iterable

import numpy as np

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as _HFTokenizer

from ..errors import UserError

PAD, BOS, EOS, MASK, UNK = "<|pad|>", "<|bos|>", "<|eos|>", "<|mask|>", "<|unk|>"
ROLES = ("bos", "eos", "pad", "mask", "unk")
PROMPT_CONVENTIONS = ("bos", "transformers")
TOKENIZER_FILE, CONFIG_FILE = "tokenizer.json", "tokenizer_config.json"


class Tokenizer:
    """A ``tokenizers.Tokenizer`` plus its special tokens (by string) and a ``kind`` (bpe, char or hf)."""

    def __init__(self, backend: _HFTokenizer, *, kind: str, bos: str | None = None, eos: str | None = None,
                 pad: str | None = None, mask: str | None = None, unk: str | None = None,
                 chat_template: str | None = None, prompt: str | None = None, prompt_end: str | None = None):
        self.backend = backend
        self.kind = kind
        # how a string prompt starts (setdlm.data.prompt): "bos", the training convention, or
        # "transformers", a pretrained model's own tokenization; by default "transformers" for kind "hf"
        self.prompt = prompt or ("transformers" if kind == "hf" else "bos")
        if self.prompt not in PROMPT_CONVENTIONS:
            raise UserError(f"prompt convention must be one of {PROMPT_CONVENTIONS}, got {prompt!r}")
        self.chat_template = chat_template  # a Hugging Face chat template (Jinja), kept for tools that use one
        # the text every training prompt ended with (the word-problem models': "\n"): a generation prompt that
        # does not end with it gets it (setdlm.data.prompt.encode_prompt)
        self.prompt_end = prompt_end or None
        self.tokens = {"bos": bos, "eos": eos, "pad": pad, "mask": mask, "unk": unk}
        for role, tok in self.tokens.items():
            if tok is not None:
                _token_id(backend, tok, role)
        if mask is None:  # diffusion needs a MASK token: add one
            name = MASK
            while backend.token_to_id(name) is not None:
                name = name[:-2] + "_|>"
            backend.add_special_tokens([AddedToken(name, special=True, normalized=False)])
            self.tokens["mask"] = name
        backend.encode_special_tokens = True  # text never becomes a special token
        if self.prompt == "bos" and bos is not None and backend.post_processor is None:
            backend.post_processor = bos_processor(bos, _token_id(backend, bos, "bos"))
        self._chars = _char_table(backend, self.special_ids) if kind == "char" else None
        self._with_specials: _HFTokenizer | None = None

    # -- the duck type every module uses ------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def _id(self, role: str) -> int | None:
        tok = self.tokens[role]
        return None if tok is None else self.backend.token_to_id(tok)

    @property
    def mask_token_id(self) -> int:
        mask = self.tokens["mask"]
        if mask is None:  # __init__ adds one; only a caller that cleared ``tokens["mask"]`` gets here
            raise UserError("the tokenizer has no MASK token")
        return _token_id(self.backend, mask, "mask")

    @property
    def bos_token_id(self) -> int | None:
        return self._id("bos")

    @property
    def eos_token_id(self) -> int | None:
        return self._id("eos")

    @property
    def pad_token_id(self) -> int | None:
        return self._id("pad")

    @property
    def special_ids(self) -> set[int]:
        return {i for i in (self._id(r) for r in ROLES) if i is not None}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens``: apply the tokenizer's post-processor (a Hugging Face
        tokenizer's BOS/EOS as its ``add_bos_token``/``add_eos_token`` say; setdlm's own have none)."""
        if self._chars is not None:
            return self._encode_chars(text, self._chars).tolist()
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_special(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text`` in which the special tokens' strings are the special tokens, as
        ``transformers`` encodes text (a rendered chat template, :func:`setdlm.chat.chat_prompt`; a Hugging
        Face tokenizer's string prompt); ``add_special_tokens``: apply the post-processor. ``encode`` keeps
        them as text."""
        if self._with_specials is None:  # a copy of the backend that matches special tokens
            self._with_specials = _HFTokenizer.from_str(self.backend.to_str())
            self._with_specials.encode_special_tokens = False
        return self._with_specials.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if self._chars is not None:
            return [self._encode_chars(t, self._chars).tolist() for t in texts]
        return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=False)]

    def _encode_chars(self, text: str, chars: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """Character tokenizer, vectorised over ``chars`` (:func:`_char_table`): the same ids as the backend
        (tested), ~100x faster. A character outside the table is the UNK token; without one (a loaded folder
        naming none), the backend encodes the text (its model's own unknown token, or its error)."""
        cps, ids = chars
        cp = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")  # (n,) code points
        pos = np.searchsorted(cps, cp).clip(max=len(cps) - 1)
        known = cps[pos] == cp
        unk = self._id("unk")
        if unk is not None:
            return np.where(known, ids[pos], unk)
        if known.all():
            return ids[pos]
        return np.array(self.backend.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        ids = [int(i) for i in ids]
        if skip_special_tokens:  # drop our specials only (HF's flag would also drop added user tokens)
            special = self.special_ids
            ids = [i for i in ids if i not in special]
        return self.backend.decode(ids, skip_special_tokens=False)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, vocab_size={self.vocab_size}, mask={self.tokens['mask']!r})"

    # -- persistence -------------------------------------------------------------------------------------

    def info(self) -> dict:
        """What ``config.json`` records about the tokenizer."""
        return {"kind": self.kind, "vocab_size": self.vocab_size, "mask_token_id": self.mask_token_id,
                "bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_id,
                "pad_token_id": self.pad_token_id}

    def save(self, folder: str | Path) -> None:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` (Hugging Face layout) into ``folder``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(folder / TOKENIZER_FILE))
        cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "setdlm_kind": self.kind, "setdlm_prompt": self.prompt}
        if self.prompt_end:
            cfg["setdlm_prompt_end"] = self.prompt_end
        cfg.update({f"{role}_token": tok for role, tok in self.tokens.items() if tok is not None})
        if self.chat_template is not None:
            cfg["chat_template"] = self.chat_template
        (folder / CONFIG_FILE).write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")

    def to_json(self) -> str:
        """The tokenizer (vocabulary and special tokens) as one string, e.g. to send to other processes."""
        return json.dumps({"backend": self.backend.to_str(), "kind": self.kind, "tokens": self.tokens,
                           "chat_template": self.chat_template, "prompt": self.prompt, "prompt_end": self.prompt_end})

    @classmethod
    def from_json(cls, s: str) -> Tokenizer:
        d = json.loads(s)
        return cls(_HFTokenizer.from_str(d["backend"]), kind=d["kind"], chat_template=d.get("chat_template"),
                   prompt=d.get("prompt"), prompt_end=d.get("prompt_end"), **d["tokens"])


def bos_processor(bos: str, bos_id: int) -> processors.TemplateProcessing:
    """The post-processor of a tokenizer whose prompts start with BOS: ``[BOS] + ids`` (a pair: ``[BOS] + a +
    b``), what ``transformers`` applies with ``add_special_tokens=True`` (setdlm's string path, docs/pretrained.md)."""
    return processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B:1", special_tokens=[(bos, bos_id)])


def _token_id(backend: _HFTokenizer, tok: str, role: str) -> int:
    """The id of special token ``tok`` (its ``role``), or a :class:`UserError` where it is not in the vocabulary."""
    i = backend.token_to_id(tok)
    if i is None:
        raise UserError(f"{role} token {tok!r} is not in the tokenizer's vocabulary")
    return i


def _char_table(backend: _HFTokenizer, special: set[int]) -> tuple[np.ndarray, np.ndarray]:
    """Sorted code points of the single-character tokens and their ids."""
    pairs = sorted((ord(t), i) for t, i in backend.get_vocab(with_added_tokens=False).items()
                   if len(t) == 1 and i not in special)
    return np.array([c for c, _ in pairs], dtype=np.uint32), np.array([i for _, i in pairs], dtype=np.int64)


# ---------------------------------------------------------------------------------------------------------
# construction
# ---------------------------------------------------------------------------------------------------------


def _specials(with_unk: bool = False) -> list[AddedToken]:
    names = [PAD, BOS, EOS, MASK] + ([UNK] if with_unk else [])
    return [AddedToken(n, special=True, normalized=False) for n in names]


def train_bpe(texts: Iterable[str], vocab_size: int, *, min_frequency: int = 2) -> Tokenizer:
    """Byte-level BPE with ``vocab_size`` entries (special tokens included) learnt from ``texts``."""
    if not isinstance(vocab_size, int) or vocab_size < 256 + 4:
        raise UserError(f"BPE vocab_size must be an integer >= 260 (256 bytes + 4 special tokens), got {vocab_size!r}")
    tok = _HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                                  special_tokens=_specials(), initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return Tokenizer(tok, kind="bpe", bos=BOS, eos=EOS, pad=PAD, mask=MASK)


def char_tokenizer(texts: Iterable[str]) -> Tokenizer:
    """One token per distinct character of ``texts`` (sorted), after the five special tokens."""
    chars = sorted(set().union(*(set(t) for t in texts)))
    vocab = {t.content: i for i, t in enumerate(_specials(with_unk=True))}
    for c in chars:
        vocab.setdefault(c, len(vocab))
    tok = _HFTokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(_specials(with_unk=True))
    return Tokenizer(tok, kind="char", bos=BOS, eos=EOS, pad=PAD, mask=MASK, unk=UNK)


def _token_name(v) -> str | None:
    """``tokenizer_config.json`` stores a special token as a string or as ``{"content": ...}``."""
    if isinstance(v, dict):
        return v.get("content")
    return v if isinstance(v, str) else None


def load_tokenizer(folder: str | Path, *, mask_id: int | None = None) -> Tokenizer:
    """Read a tokenizer folder: ``tokenizer.json`` plus, when present, ``tokenizer_config.json`` and
    ``special_tokens_map.json`` naming bos/eos/pad/mask/unk. Errors name the file and the problem.
    ``mask_id``: the MASK id a model expects (e.g. a converted checkpoint's): the token with that id becomes
    the MASK token, or, one past the vocabulary, a new ``<|mask|>`` is added there."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"tokenizer folder {str(folder)!r} does not exist")
    path = folder / TOKENIZER_FILE
    if not path.is_file():
        if any(any(folder.glob(p)) for p in ("vocab.*", "*.model", "merges.txt")):
            return _convert_slow(folder)
        raise UserError(f"{path}: missing (no tokenizer in {str(folder)!r})")
    try:
        backend = _HFTokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on bad JSON
        raise UserError(f"{path}: not a valid tokenizer file ({str(e).splitlines()[0]})") from None
    names: dict[str, str | None] = {}
    kind, template, prompt, prompt_end = "hf", None, None, None
    for fname in ("special_tokens_map.json", CONFIG_FILE):  # the config wins
        p = folder / fname
        if p.is_file():
            try:
                cfg = json.loads(p.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise UserError(f"{p}: not valid JSON ({e})") from None
            names.update({r: _token_name(cfg[f"{r}_token"]) for r in ROLES + ("cls", "sep") if f"{r}_token" in cfg})
            kind = cfg.get("setdlm_kind", kind)
            prompt = cfg.get("setdlm_prompt", prompt)
            prompt_end = cfg.get("setdlm_prompt_end", prompt_end) if isinstance(cfg.get("setdlm_prompt_end"), str) \
                else prompt_end
            template = cfg.get("chat_template", template) if isinstance(cfg.get("chat_template"), str) else template
    jinja = folder / "chat_template.jinja"  # where transformers >= 4.50 writes it
    if template is None and jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    names = {r: (n if n is not None and backend.token_to_id(n) is not None else None) for r, n in names.items()}
    # BERT-style tokenizers: [CLS] ... [SEP] play BOS ... EOS (as in the BD3LM/SetDLM LM1B data)
    cls, sep = names.pop("cls", None), names.pop("sep", None)
    names["bos"] = names.get("bos") or cls
    names["eos"] = names.get("eos") or sep
    if mask_id is not None:
        names["mask"] = _mask_name(backend, names.get("mask"), mask_id, folder)
    return Tokenizer(backend, kind=kind, chat_template=template, prompt=prompt, prompt_end=prompt_end, **names)


def _mask_name(backend: _HFTokenizer, current: str | None, mask_id: int, where: Path) -> str | None:
    """The token to use as MASK so that it gets id ``mask_id`` (None: let :class:`Tokenizer` add one)."""
    if current is not None and backend.token_to_id(current) == mask_id:
        return current
    n = backend.get_vocab_size(with_added_tokens=True)
    if 0 <= mask_id < n:
        return backend.id_to_token(mask_id)
    if mask_id == n:
        return None
    raise UserError(f"{where}: the tokenizer has {n} tokens, so MASK id {mask_id} is neither one of them nor the "
                    "next one")


def _convert_slow(folder: Path) -> Tokenizer:
    """A folder with only slow-tokenizer files (e.g. SentencePiece): convert through ``transformers``."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise UserError(f"{folder}: has no tokenizer.json; converting a slow tokenizer needs transformers "
                        "(pip install 'setdlm[hf]')") from None
    try:
        hf = AutoTokenizer.from_pretrained(str(folder), use_fast=True)
    except Exception as e:
        raise UserError(f"{folder}: could not convert the slow tokenizer ({str(e).splitlines()[0]})") from None
    names = {r: getattr(hf, f"{r}_token", None) for r in ROLES}
    return Tokenizer(hf.backend_tokenizer, kind="hf", **names)


def from_hub(name: str) -> Tokenizer:
    """Download a tokenizer from the Hugging Face Hub (needs network and ``huggingface_hub``)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UserError(f"loading tokenizer {name!r} from the Hub needs huggingface_hub "
                        "(pip install 'setdlm[hf]')") from None
    try:
        folder = snapshot_download(name, allow_patterns=["tokenizer*", "special_tokens_map.json", "vocab*",
                                                         "merges.txt", "*.model"])
    except Exception as e:
        raise UserError(f"could not download tokenizer {name!r} from the Hub: {str(e).splitlines()[0]}") from None
    return load_tokenizer(folder)


def build_tokenizer(spec: str, texts: list[str] | None = None, *, vocab_size: int = 4096) -> Tokenizer:
    """``spec``: ``bpe`` (trained on ``texts``), ``char`` (from ``texts``), a folder, or ``hf:NAME`` (Hub)."""
    if spec == "bpe":
        return train_bpe(texts or [], vocab_size)
    if spec == "char":
        return char_tokenizer(texts or [])
    if spec.startswith("hf:"):
        return from_hub(spec[3:])
    if Path(spec).is_dir():
        return load_tokenizer(spec)
    raise UserError(f"unknown tokenizer {spec!r}: use bpe, char, a tokenizer folder or hf:NAME")
