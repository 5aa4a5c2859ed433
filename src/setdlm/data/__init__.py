"""Data: tokenizers, text sources, packing and prompt/completion datasets, built-in corpora (docs/method.md §9.5).

Typical use::

    from setdlm.data import read_source, build_tokenizer, build_dataset, heldout_split
    corpus = read_source("shakespeare")                       # or a file, folder, .jsonl, hf:NAME
    tok = build_tokenizer("bpe", corpus.texts, vocab_size=4096)
    ds = build_dataset(corpus, tok, length=128)               # TokenDataset (N, L)
    train_idx, eval_idx = heldout_split(len(ds), 0.05)

Modules, each importing only those above it: ``corpus`` (:class:`Corpus`), ``tokenizers``, ``prompt`` (a prompt
string as ids, BOS included), ``tasks`` (reasoning and infilling examples), ``parallel`` (the
parallel-dependency suite: copy, reverse, sort, Latin square), ``builtin`` (the shipped corpora),
``sources`` (a source spec to a :class:`Corpus`; infilling examples from a source), ``dataset`` (token rows
and :class:`setdlm.batch.Batch`es).
"""

from .builtin import BUILTIN, load_builtin, register_builtin, shakespeare_works
from .corpus import Corpus
from .dataset import TokenDataset, build_dataset, heldout_split, pack_documents, pad_pairs
from .prompt import encode_prompt, start_ids
from .sources import infill_from_source, read_source
from .tokenizers import Tokenizer, build_tokenizer, char_tokenizer, from_hub, load_tokenizer, train_bpe

__all__ = ["BUILTIN", "load_builtin", "register_builtin", "shakespeare_works", "TokenDataset", "build_dataset",
           "heldout_split", "pack_documents", "pad_pairs", "encode_prompt", "start_ids", "Corpus", "read_source",
           "infill_from_source", "Tokenizer", "build_tokenizer", "char_tokenizer", "from_hub", "load_tokenizer",
           "train_bpe"]
