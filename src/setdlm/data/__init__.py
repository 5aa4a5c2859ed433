"""Data: tokenizers, text sources, packing and prompt/completion datasets, built-in corpora (DESIGN.md §5).

Typical use::

    from setdlm.data import read_source, build_tokenizer, build_dataset, heldout_split
    corpus = read_source("shakespeare")                       # or a file, folder, .jsonl, hf:NAME
    tok = build_tokenizer("bpe", corpus.texts, vocab_size=4096)
    ds = build_dataset(corpus, tok, length=128)               # TokenDataset (N, L)
    train_idx, eval_idx = heldout_split(len(ds), 0.05)
"""

from .builtin import BUILTIN, load_builtin, register_builtin, shakespeare_works
from .dataset import TokenDataset, build_dataset, heldout_split, pack_documents, pad_pairs
from .sources import Corpus, read_source
from .tokenizers import Tokenizer, build_tokenizer, char_tokenizer, from_hub, load_tokenizer, train_bpe

__all__ = ["BUILTIN", "load_builtin", "register_builtin", "shakespeare_works", "TokenDataset", "build_dataset",
           "heldout_split", "pack_documents", "pad_pairs", "Corpus", "read_source", "Tokenizer",
           "build_tokenizer", "char_tokenizer", "from_hub", "load_tokenizer", "train_bpe"]
