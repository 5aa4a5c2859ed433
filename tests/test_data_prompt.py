"""A prompt string becomes ``[BOS] + encode(text)`` in one place (setdlm.data.prompt), and every caller agrees:
the training layout of a prompt/completion pair, ``generate`` / ``infill`` on strings and the task evaluator."""

import pytest

from setdlm import FamilyConfig, Model
from setdlm.data import Corpus, Tokenizer, build_dataset, char_tokenizer, encode_prompt, start_ids
from setdlm.data.tasks import reasoning_split
from setdlm.evaluation.passes import prompt_ids

from support import make_model

TEXT = "to be or not to be, that is the question 0123456789\n"


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer([TEXT])


@pytest.fixture(scope="module")
def model(tok):
    backbone = make_model(vocab=tok.vocab_size, hidden=32, heads=2, layers=2, seed=3)
    return Model(backbone, FamilyConfig("ar", 32, tok.mask_token_id), tok)


def test_bos_then_the_text(tok):
    assert tok.bos_token_id is not None
    assert start_ids(tok) == [tok.bos_token_id]
    assert encode_prompt(tok, "to be") == [tok.bos_token_id] + tok.encode("to be")
    assert encode_prompt(tok, "") == [tok.bos_token_id]
    with pytest.raises(TypeError, match="a prompt must be a string"):
        encode_prompt(tok, [1, 2])


def test_no_bos_no_start_token(tok):
    no_bos = Tokenizer(tok.backend, kind="char", eos=tok.tokens["eos"], pad=tok.tokens["pad"],
                       mask=tok.tokens["mask"], unk=tok.tokens["unk"])
    assert no_bos.bos_token_id is None
    assert start_ids(no_bos) == [] and encode_prompt(no_bos, "to be") == tok.encode("to be")
    assert start_ids(no_bos, eos_fallback=True) == [tok.eos_token_id]  # lm-eval's prefix token
    assert start_ids(tok, eos_fallback=True) == [tok.bos_token_id]  # BOS wins when there is one
    neither = Tokenizer(tok.backend, kind="char", mask=tok.tokens["mask"], unk=tok.tokens["unk"])
    assert start_ids(neither, eos_fallback=True) == []


def test_training_context_is_the_encoded_prompt(tok):
    """A pair is laid out ``[BOS] prompt completion [EOS]`` with exactly the encoded prompt as context, so a
    model is decoded from the same tokens it was trained on."""
    ds = build_dataset(Corpus(pairs=[("to be or", " not to be")]), tok, 32)
    n_ctx = int(ds.context_mask[0].sum())
    assert ds.input_ids[0, :n_ctx].tolist() == encode_prompt(tok, "to be or")
    assert ds.context_mask[0, :n_ctx].all()


def test_generate_and_infill_encode_strings_with_the_bos(model, tok):
    ids = encode_prompt(tok, "to be or")
    by_text = model.generate("to be or", max_new_tokens=4)
    by_ids = model.generate([ids], max_new_tokens=4)
    assert by_text.sequences == by_ids.sequences and by_text.sequences[0][:len(ids)] == ids
    filled = model.infill("to be", " be", 2)
    assert filled.sequences[0][:len(encode_prompt(tok, "to be"))] == encode_prompt(tok, "to be")


def test_task_prompts_are_encoded_prompts(model, tok):
    ex = reasoning_split("test", 1, level="easy")[0]
    assert prompt_ids(model, ex) == encode_prompt(tok, ex.prompt)


@pytest.mark.parametrize("bos,eos", [(False, False), (True, False), (True, True)])
def test_hf_tokenizers_encode_prompts_as_transformers(tmp_path, bos, eos):
    """A Hugging Face tokenizer (kind "hf") encodes a string prompt exactly as ``transformers`` does: its
    post-processor (BOS/EOS as its ``add_bos_token``/``add_eos_token`` set it) decides, through
    load_tokenizer, the transformers adapter and a copy for training alike, and a checkpoint's copy keeps
    it. setdlm's own tokenizers keep BOS first (above)."""
    transformers = pytest.importorskip("transformers")

    from setdlm.data import load_tokenizer
    from setdlm.formats.hf import HFTokenizer, setdlm_tokenizer
    from support import tiny_tokenizer

    hf = tiny_tokenizer()
    hf.add_bos_token, hf.add_eos_token = bos, eos  # transformers rebuilds the post-processor
    hf.save_pretrained(tmp_path)
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    text = "w3 w1 w4"
    expected = ref(text).input_ids
    assert expected == [1] * bos + [6, 4, 7] + [2] * eos
    ours = load_tokenizer(tmp_path)
    assert ours.kind == "hf" and encode_prompt(ours, text) == expected and ours.encode(text) == [6, 4, 7]
    assert encode_prompt(HFTokenizer(ref), text) == expected
    assert encode_prompt(setdlm_tokenizer(ref), text) == expected
    ours.save(tmp_path / "again")
    assert encode_prompt(load_tokenizer(tmp_path / "again"), text) == expected
    special = "w3 </s> w4"  # a special token's string is that token, as in transformers
    assert encode_prompt(ours, special) == ref(special).input_ids == [1] * bos + [6, 2, 7] + [2] * eos


def test_a_model_trained_by_setdlm_keeps_bos_first_whatever_its_tokenizer(tmp_path, capsys):
    """A run trained on a Hugging Face tokenizer laid its rows out as [BOS] text: its checkpoint's tokenizer
    records the "bos" convention, so string prompts start with BOS as in training (a pretrained model's
    tokenizer keeps transformers' ids); a checkpoint trained before the convention was recorded too."""
    pytest.importorskip("transformers")
    import json

    from setdlm import load
    from setdlm.cli import main as cli
    from support import tiny_tokenizer

    hf = tiny_tokenizer()
    hf.save_pretrained(tmp_path / "tok")
    words = " ".join(f"w{i % 60}" for i in range(3000))
    (tmp_path / "words.txt").write_text(words)
    assert cli(["train", "--data", str(tmp_path / "words.txt"), "--tokenizer", str(tmp_path / "tok"), "--length", "16",
                "--hidden-size", "32", "--n-layers", "1", "--n-heads", "2", "--batch-size", "4", "--steps", "1",
                "--eval-every", "0", "--eval-max", "4", "--out", str(tmp_path / "run")]) == 0
    model = load(tmp_path / "run")
    assert model.tokenizer.kind == "hf" and model.tokenizer.prompt == "bos"
    assert encode_prompt(model.tokenizer, "w3 w1") == [1, 6, 4]  # <s> first, as the training rows
    folder = next((tmp_path / "run" / "checkpoints").iterdir())
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    del cfg["setdlm_prompt"]  # as saved before the convention was recorded
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert load(tmp_path / "run").tokenizer.prompt == "bos"
    from setdlm.data import load_tokenizer

    assert load_tokenizer(tmp_path / "tok").prompt == "transformers"  # a plain Hugging Face tokenizer
