"""Tokenizers, sources, packing, prompt/completion padding, the held-out split and the built-in corpus."""

import gzip
import json

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, normalizers, pre_tokenizers, processors

from setdlm.data import (Tokenizer, build_dataset, build_tokenizer, char_tokenizer, heldout_split, load_tokenizer,
                         pack_documents, pad_pairs, read_source, shakespeare_works, train_bpe)
from setdlm.data.corpus import Corpus

TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 20


# -- tokenizers -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bpe", "char"])
def test_roundtrip_specials_and_save_load(kind, tmp_path):
    tok = build_tokenizer(kind, [TEXT], vocab_size=300)
    ids = tok.encode("To be, or not to be")
    assert tok.decode(ids) == "To be, or not to be"
    specials = [tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.mask_token_id]
    assert len(set(specials)) == 4 and all(0 <= i < tok.vocab_size for i in specials)
    assert not set(ids) & set(specials)
    assert tok.decode([tok.bos_token_id] + ids + [tok.eos_token_id]) == "To be, or not to be"
    tok.save(tmp_path)
    again = load_tokenizer(tmp_path)
    assert again.kind == kind and again.vocab_size == tok.vocab_size
    assert [again.bos_token_id, again.eos_token_id, again.pad_token_id, again.mask_token_id] == specials
    assert again.encode(TEXT[:200]) == tok.encode(TEXT[:200])


def test_bpe_vocab_size_and_bytes():
    tok = train_bpe([TEXT], 300)
    assert tok.vocab_size == 300
    s = "naïve 日本 \x00 emoji 🎭"  # bytes never seen in training still round-trip
    assert tok.decode(tok.encode(s)) == s
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe([TEXT], 100)


def test_special_token_strings_in_text_stay_text():
    tok = train_bpe([TEXT + "<|mask|> <|eos|>"], 300)
    ids = tok.encode("a <|mask|> b <|eos|>")
    assert tok.mask_token_id not in ids and tok.eos_token_id not in ids
    assert tok.decode(ids) == "a <|mask|> b <|eos|>"


def test_char_tokenizer_fast_path_matches_backend():
    tok = char_tokenizer(["abc de\nf"])
    s = "abc zz\n<|mask|>é𝄞 fed"
    assert tok.encode(s) == tok.backend.encode(s, add_special_tokens=False).ids
    assert tok.encode_batch([s, "ab"]) == [tok.encode(s), tok.encode("ab")]
    unk = tok.backend.token_to_id("<|unk|>")
    assert tok.encode("z") == [unk]


def _bert_like_folder(path):
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "."])}
    t = HFTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.normalizer = normalizers.Lowercase()
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    path.mkdir()
    t.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"mask_token": "[MASK]", "pad_token": "[PAD]",
                                                            "cls_token": "[CLS]", "sep_token": "[SEP]",
                                                            "unk_token": {"content": "[UNK]"}}))


def test_hf_folder_with_mask(tmp_path):
    _bert_like_folder(tmp_path / "bert")
    tok = load_tokenizer(tmp_path / "bert")
    assert tok.kind == "hf" and tok.vocab_size == 9
    assert tok.mask_token_id == 4 and tok.pad_token_id == 0
    assert tok.bos_token_id == 2 and tok.eos_token_id == 3  # [CLS]/[SEP] stand in for BOS/EOS
    assert tok.encode("The cat SAT.") == [5, 6, 7, 8]  # no [CLS]/[SEP]: BOS/EOS are the datasets' business


def test_hf_folder_without_mask_gets_one(tmp_path):
    inner = HFTokenizer(models.BPE())
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    from tokenizers import decoders, trainers
    inner.decoder = decoders.ByteLevel()
    inner.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=280, special_tokens=["<|endoftext|>"],
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                          show_progress=False))
    folder = tmp_path / "gpt2ish"
    folder.mkdir()
    inner.save(str(folder / "tokenizer.json"))
    (folder / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|endoftext|>",
                                                                "bos_token": "<|endoftext|>"}))
    tok = load_tokenizer(folder)
    assert tok.vocab_size == 281 and tok.mask_token_id == 280
    assert tok.eos_token_id == tok.bos_token_id == inner.token_to_id("<|endoftext|>")
    tok.save(tmp_path / "saved")  # the added MASK survives a save/load
    assert load_tokenizer(tmp_path / "saved").mask_token_id == 280


def test_tokenizer_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="tokenizer.json: missing"):
        load_tokenizer(tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a valid tokenizer file"):
        load_tokenizer(tmp_path / "bad")
    with pytest.raises(ValueError, match="unknown tokenizer 'wordpiece'"):
        build_tokenizer("wordpiece", [TEXT])


def test_json_roundtrip_for_broadcast():
    tok = train_bpe([TEXT], 300)
    again = Tokenizer.from_json(tok.to_json())
    assert again.encode(TEXT) == tok.encode(TEXT) and again.mask_token_id == tok.mask_token_id


# -- sources -----------------------------------------------------------------------------------------------


def test_sources_files_folders_jsonl(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("first doc")
    (tmp_path / "d" / "sub").mkdir()
    (tmp_path / "d" / "sub" / "b.md").write_text("second\r\ndoc")
    (tmp_path / "d" / "c.jsonl").write_text('{"text": "third"}\n\n{"text": "fourth"}\n')
    (tmp_path / "d" / "skip.bin").write_bytes(b"\xff\xfe")
    c = read_source(str(tmp_path / "d"))
    assert c.texts == ["first doc", "third", "fourth", "second\ndoc"]  # sorted paths, CRLF normalised
    (tmp_path / "pc.jsonl").write_text('{"prompt": "2+2=", "completion": "4"}\n{"prompt": "", "completion": "x"}\n')
    pc = read_source(str(tmp_path / "pc.jsonl"))
    assert pc.is_pairs and pc.pairs == [("2+2=", "4"), ("", "x")]


@pytest.mark.parametrize("content, match", [
    (b"\xff\xfe bad", r"not UTF-8 text \(byte 0xff at offset 0, line 1\)"),
    (b'{"text": "ok"}\n{"text": 5}\n', r"x.jsonl:2: 'text' must be a string"),
    (b'{"text": "ok"}\n{oops\n', r"x.jsonl:2: not valid JSON"),
    (b'{"body": "ok"}\n', r"x.jsonl:1: record has neither"),
    (b'{"text": "a"}\n{"prompt": "p", "completion": "c"}\n', r"x.jsonl:2: mixes"),
    (b"\n  \n", r"empty corpus"),
])
def test_source_errors_name_file_and_line(tmp_path, content, match):
    p = tmp_path / "x.jsonl"
    p.write_bytes(content)
    with pytest.raises(ValueError, match=match):
        read_source(str(p))


def test_missing_source_and_empty_folder(tmp_path):
    with pytest.raises(ValueError, match="neither an existing file"):
        read_source(str(tmp_path / "missing.txt"))
    (tmp_path / "e").mkdir()
    with pytest.raises(ValueError, match="empty corpus"):
        read_source(str(tmp_path / "e"))


def test_builtin_shakespeare():
    works = shakespeare_works()
    assert len(works) == 42
    titles = {w["title"] for w in works}
    assert {"Hamlet", "Sonnets", "The Tempest", "King Lear", "The Rape of Lucrece"} <= titles
    text = "".join(w["text"] for w in works)
    assert 5_000_000 < len(text) < 5_200_000
    assert "gutenberg" not in text.lower() and "*** start of" not in text.lower()
    assert "To be, or not to be" in text
    c = read_source("shakespeare")
    assert len(c.texts) == 42 and c.texts[0] == works[0]["text"]


# -- packing, padding, split ---------------------------------------------------------------------------------


def test_pack_documents_reconstructs_the_stream():
    docs = [[10, 11, 12], [], [13, 14, 15, 16, 17], [18]]
    ds = pack_documents(docs, 4, bos_id=1, eos_id=2, pad_id=0)
    assert ds.input_ids.tolist() == [[1, 10, 11, 12], [1, 2, 13, 14], [1, 15, 16, 17], [1, 2, 18, 2]]
    assert ds.context_mask[:, 0].all() and not ds.context_mask[:, 1:].any()
    assert ds.attention_mask.all()
    ds = pack_documents([[5, 6, 7, 8, 9]], 4, bos_id=1, eos_id=2, pad_id=0)
    assert ds.input_ids.tolist() == [[1, 5, 6, 7], [1, 8, 9, 2]]
    ds = pack_documents([[5, 6, 7, 8, 9, 3]], 4, bos_id=1, eos_id=2, pad_id=0)
    assert ds.input_ids.tolist()[-1] == [1, 2, 0, 0] and ds.attention_mask.tolist()[-1] == [True, True, False, False]
    ds = pack_documents([[5, 6, 7]], 2, bos_id=None, eos_id=None, pad_id=0)  # no BOS: L tokens per row
    assert ds.input_ids.tolist() == [[5, 6], [7, 0]] and not ds.context_mask.any()
    with pytest.raises(ValueError, match="empty corpus"):
        pack_documents([[], []], 4, bos_id=1, eos_id=2, pad_id=0)


def test_pad_pairs_context_and_truncation():
    ds = pad_pairs([([7, 8], [9]), ([7], [9, 9, 9, 9, 9])], 6, bos_id=1, eos_id=2, pad_id=0)
    assert ds.input_ids.tolist() == [[1, 7, 8, 9, 2, 0], [1, 7, 9, 9, 9, 2]]  # truncated, last token EOS
    assert ds.context_mask.tolist() == [[True, True, True, False, False, False], [True, True, False, False, False, False]]
    assert ds.attention_mask.tolist() == [[True] * 5 + [False], [True] * 6]
    b = ds.batch([1, 0])
    assert b.targets.tolist()[0] == [False, False, True, True, True, True]
    with pytest.raises(ValueError, match="example 0: prompt is 6 tokens long, which leaves no room"):
        pad_pairs([([7] * 5, [9])], 6, bos_id=1, eos_id=2, pad_id=0)


def test_build_dataset_end_to_end():
    tok = char_tokenizer([TEXT])
    ds = build_dataset(Corpus(texts=[TEXT, "abc"]), tok, 16)
    flat = ds.input_ids[:, 1:][ds.attention_mask[:, 1:]].tolist()
    eos = tok.eos_token_id
    assert flat == tok.encode(TEXT) + [eos] + tok.encode("abc") + [eos]
    pairs = build_dataset(Corpus(pairs=[("To be", " or not")]), tok, 16)
    assert tok.decode(pairs.input_ids[0][pairs.context_mask[0]].tolist()) == "To be"
    assert pairs.n_targets == len(" or not") + 1


def test_heldout_split_fixed_and_disjoint():
    tr, ev = heldout_split(100, 0.1, seed=0)
    tr2, ev2 = heldout_split(100, 0.1, seed=0)
    assert torch.equal(ev, ev2) and len(ev) == 10 and len(tr) == 90
    assert sorted(tr.tolist() + ev.tolist()) == list(range(100))
    assert not torch.equal(heldout_split(100, 0.1, seed=1)[1], ev)
    assert len(heldout_split(100, 0.5, max_eval=3)[1]) == 3
    assert len(heldout_split(3, 0.01)[1]) == 1
    with pytest.raises(ValueError, match="corpus too small"):
        heldout_split(1, 0.05)


def test_shipped_corpus_is_reproducible_gzip():
    from importlib import resources
    raw = resources.files("setdlm.data").joinpath("corpora/shakespeare.jsonl.gz").read_bytes()
    assert raw[4:8] == b"\x00\x00\x00\x00"  # gzip mtime 0 (scripts/make_shakespeare.py)
    assert len(gzip.decompress(raw).splitlines()) == 42


def test_hf_datasets_source_from_a_local_folder(tmp_path):
    """The ``hf:`` path through the real `datasets` library (optional extra), offline on a local folder."""
    pytest.importorskip("datasets")
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "train.jsonl").write_text('{"prompt": "2+2=", "completion": "4"}\n{"prompt": "1+1=", "completion": "2"}\n')
    c = read_source(f"hf:{tmp_path / 'ds'}@train")
    assert c.pairs == [("2+2=", "4"), ("1+1=", "2")]
    with pytest.raises(ValueError, match=r"could not load dataset .*Unknown split"):
        read_source(f"hf:{tmp_path / 'ds'}@test")
