"""One likelihood estimator (issue 13 item 4): the trainer's held-out bound (its rows in batches, as a row),
``setdlm eval`` and the lm-eval adapter's scorer all go through ``setdlm.evaluation.likelihood.likelihood`` and give the
same number for one checkpoint, one seed and one batch size."""

import json

import pytest
import torch

from setdlm import FamilyConfig, Model
from setdlm import load as load_checkpoint
from setdlm.cli import main as cli
from setdlm.data import build_dataset, char_tokenizer, read_source
from setdlm.evaluation.likelihood import likelihood

from support import make_model

TEXT = "the cat sat on the mat. a dog ran to the cat.\n" * 6
L, BATCH, SEED = 32, 3, 11


@pytest.mark.parametrize("family, kw", [("setdlm", dict(D=2, keep_clean_bos=True)), ("bd3lm", dict(block_size=4))])
def test_three_routes_give_one_number(tmp_path, capsys, family, kw):
    tok = char_tokenizer([TEXT])
    backbone = make_model(vocab=tok.vocab_size, hidden=32, heads=2, layers=2, seed=3, dtype=torch.float64)
    Model(backbone, FamilyConfig(family, length=L, mask_token_id=tok.mask_token_id, **kw), tok).save(tmp_path / "ck")
    (tmp_path / "text.txt").write_text(TEXT)
    model = load_checkpoint(tmp_path / "ck")
    data = build_dataset(read_source(str(tmp_path / "text.txt")), model.tokenizer, L)
    assert len(data) > 2 * BATCH and not data.attention_mask[-1].all()  # several batches, the last row padded

    trainer = likelihood(model, data.batches(BATCH), seed=SEED, progress=False).bound_row()  # as the trainer logs it
    assert cli(["eval", str(tmp_path / "ck"), "--data", str(tmp_path / "text.txt"), "--seed", str(SEED),
                "--batch-size", str(BATCH)]) == 0
    eval_cli = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert eval_cli["nelbo"] == trainer["nelbo"] and eval_cli["tokens"] == trainer["tokens"]
    batches = [data.batch(torch.arange(i, min(i + BATCH, len(data)))) for i in range(0, len(data), BATCH)]
    direct = likelihood(model, batches, seed=SEED, progress=False)
    assert direct.nats_per_token == pytest.approx(trainer["nelbo"], rel=1e-12) and direct.tokens == trainer["tokens"]

    lm_eval = pytest.importorskip("lm_eval")  # noqa: F841  the adapter needs it
    from setdlm.evaluation.harness import SetDLMLM

    harness = SetDLMLM(str(tmp_path / "ck"), seed=SEED, batch_size=BATCH, device="cpu")
    pairs = []  # each row as (context, continuation): its BOS, then its other tokens
    for ids, valid, ctx in zip(data.input_ids, data.attention_mask, data.context_mask):
        row = ids[valid].tolist()
        n = int(ctx.sum())
        pairs.append((row[:n], row[n:]))
    scores = harness._score(pairs, disable_tqdm=True)
    tokens = sum(len(c) for _, c in pairs)
    assert tokens == trainer["tokens"]
    assert -sum(ll for ll, _ in scores) / tokens == pytest.approx(trainer["nelbo"], rel=1e-12)
    other = likelihood(model, data.batches(BATCH), seed=SEED + 1, progress=False).bound_row()
    assert other["nelbo"] != trainer["nelbo"]  # the seed matters: the agreement is not a coincidence
