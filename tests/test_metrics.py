"""Metrics: GSM8K exact match, ROUGE against rouge-score and hand-checked values, likelihood summaries,
throughput statistics (docs/method.md §4.10, §5.1, §5.2, §5.4)."""

import math

import numpy as np
import pytest

from setdlm.evaluation.metrics import (LikelihoodSummary, answer_matches, exact_match, extract_answer, rouge, rouge_scores,
                            throughput_stats)


@pytest.mark.parametrize("text, value", [
    ("#### 42", 42),
    ("####42", 42),
    ("7+5=12\n12-3=9\n#### 9", 9),
    ("   ####    17   \n", 17),
    ("#### -7", -7),
    ("####-7", -7),
    ("#### - 7", -7),
    ("#### −7", -7),  # Unicode minus
    ("#### 1,234", 1234),
    ("#### -1,234,567", -1234567),
    ("#### $1,250", 1250),
    ("#### 15.0", 15),
    ("#### 12.00 dollars", 12),
    ("#### 5.", 5),  # a full stop after the number
    ("#### 3\n#### 4", 3),  # the first answer line counts (the model may ramble on)
    ("#### 0", 0),
])
def test_extract_answer_parses_robustly(text, value):
    assert extract_answer(text) == value


@pytest.mark.parametrize("text", ["", "the answer is 12", "####", "#### \n12", "#### twelve", "#### 2.5",
                                  "### 12", "12"])
def test_extract_answer_missing_or_not_an_integer_is_none(text):
    assert extract_answer(text) is None


def test_exact_match_scores_pairs():
    preds = ["2+3=5\n#### 5", "#### 1,000", "####-4", "no answer line", "#### 7"]
    refs = [5, "1000+0=1000\n#### 1000", "#### -4", 3, "#### 8"]
    assert [answer_matches(p, r) for p, r in zip(preds, refs)] == [True, True, True, False, False]
    assert exact_match(preds, refs) == pytest.approx(3 / 5)


def test_exact_match_rejects_bad_input():
    with pytest.raises(ValueError, match="2 predictions but 1 references"):
        exact_match(["#### 1", "#### 2"], [1])
    with pytest.raises(ValueError, match="no predictions"):
        exact_match([], [])
    with pytest.raises(ValueError, match="reference has no"):
        exact_match(["#### 1"], ["one"])


# ---------------------------------------------------------------------------------------------------------
# ROUGE: hand-checked values (unigram/bigram overlap, LCS), and equality with rouge-score itself
# ---------------------------------------------------------------------------------------------------------

HAND = [
    # pred [the cat sat on the mat], ref [the cat is on the mat]: 5 of 6 unigrams shared
    # (the×2, cat, on, mat); bigrams shared: "the cat", "on the", "the mat" = 3 of 5; LCS "the cat on the mat" = 5
    ("the cat sat on the mat", "the cat is on the mat", {"rouge1": 5 / 6, "rouge2": 3 / 5, "rougeL": 5 / 6}),
    # pred [the gunman kill police] vs ref [police killed the gunman]: 3/4 unigrams; 1 of 3 bigrams in each
    # ("the gunman"); LCS "the gunman" = 2 of 4
    ("the gunman kill police", "police killed the gunman", {"rouge1": 3 / 4, "rouge2": 1 / 3, "rougeL": 1 / 2}),
    # case and punctuation are ignored by the tokenizer
    ("The Cat, sat!", "the cat sat", {"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0}),
    # nothing shared; an empty prediction scores 0
    ("dogs bark", "the cat sat", {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}),
    ("", "the cat sat", {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}),
    # unequal lengths: pred [a b] in ref [a b c d]: P=1, R=1/2 -> F=2/3; bigram "a b": P=1, R=1/3 -> F=1/2
    ("a b", "a b c d", {"rouge1": 2 / 3, "rouge2": 1 / 2, "rougeL": 2 / 3}),
]


@pytest.mark.parametrize("pred, ref, expected", HAND)
def test_rouge_hand_checked(pred, ref, expected):
    pytest.importorskip("rouge_score")
    got = rouge_scores([pred], [ref])[0]
    for k, v in expected.items():
        assert got[k] == pytest.approx(v, abs=1e-12), k


def test_rouge_matches_rouge_score_and_averages_exactly():
    rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")
    preds, refs = [p for p, _, _ in HAND], [r for _, r, _ in HAND]
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"])
    direct = [scorer.score(r, p) for p, r in zip(preds, refs)]
    agg = rouge(preds, refs)
    for k in ("rouge1", "rouge2", "rougeL"):
        assert agg[k] == pytest.approx(np.mean([d[k].fmeasure for d in direct]), abs=1e-12)
        assert agg[k] == pytest.approx(np.mean([e[k] for _, _, e in HAND]), abs=1e-12)


def test_rouge_stemmer_option():
    pytest.importorskip("rouge_score")
    # with Porter stemming "kill" and "killed" match: 4/4 unigrams; bigrams and LCS are unchanged
    got = rouge_scores(["the gunman kill police"], ["police killed the gunman"], use_stemmer=True)[0]
    assert got == pytest.approx({"rouge1": 1.0, "rouge2": 1 / 3, "rougeL": 1 / 2})


def test_rouge_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="1 predictions but 2 references"):
        rouge(["a"], ["a", "b"])


# ---------------------------------------------------------------------------------------------------------
# likelihood summaries and throughput
# ---------------------------------------------------------------------------------------------------------


def test_likelihood_summary_units():
    s = LikelihoodSummary(nats=10 * math.log(4), tokens=10)
    assert s.nats_per_token == pytest.approx(math.log(4))
    assert s.ppl == pytest.approx(4.0)
    assert s.bits_per_token == pytest.approx(2.0)
    d = s.to_dict()
    assert d["tokens"] == 10 and d["ppl"] == pytest.approx(4.0) and d["samples"] == 1
    with pytest.raises(ValueError, match="at least one scored token"):
        LikelihoodSummary(nats=0.0, tokens=0)
    with pytest.raises(ValueError, match="not finite"):
        LikelihoodSummary(nats=float("nan"), tokens=3)


def test_throughput_excludes_warmup_and_uses_per_call_rates():
    # two absurd warm-up calls (first-call compilation, cold caches) must not change anything
    tokens = [1, 1, 100, 50, 30, 20]
    seconds = [100.0, 50.0, 1.0, 1.0, 0.5, 0.25]
    nfe = [1, 1, 100, 25, 10, 5]
    s = throughput_stats(tokens, seconds, warmup=2, nfe=nfe)
    rates = np.array([100 / 1.0, 50 / 1.0, 30 / 0.5, 20 / 0.25])
    assert s.calls == 4 and s.warmup == 2
    assert s.mean == pytest.approx(rates.mean())  # mean of per-call rates (the paper's number) ...
    assert s.std == pytest.approx(rates.std())  # ... its population std ...
    assert s.aggregate == pytest.approx(200 / 2.75)  # ... and the rate of the whole run, which differs
    assert s.aggregate != pytest.approx(s.mean)
    assert s.tokens == 200 and s.seconds == pytest.approx(2.75) and s.nfe == 140
    assert s.tokens_per_step == pytest.approx(200 / 140)
    assert throughput_stats(tokens, seconds, warmup=2).tokens_per_step is None
    unwarmed = throughput_stats(tokens[2:], seconds[2:], warmup=0)
    assert (unwarmed.mean, unwarmed.std, unwarmed.aggregate) == (s.mean, s.std, s.aggregate)


def test_throughput_tokens_per_step_from_the_decoders_counts():
    """With committed tokens and row forwards given, tokens/step is theirs (per row, so batch-size free): two
    calls of 4 rows, 10 batched forwards each; rows committed 3 tokens past their EOS in total."""
    s = throughput_stats([40, 40], [1.0, 1.0], warmup=0, nfe=[10, 10], committed=[43, 40], row_nfe=[40, 40])
    assert s.tokens_per_step == pytest.approx(83 / 80) and (s.committed, s.row_nfe, s.nfe) == (83, 80, 20)
    assert throughput_stats([40, 40], [1.0, 1.0], warmup=1, nfe=[10, 10], committed=[43, 40],
                            row_nfe=[40, 40]).tokens_per_step == 1.0
    with pytest.raises(ValueError, match="give committed and row_nfe together"):
        throughput_stats([1], [1.0], warmup=0, committed=[1])


@pytest.mark.parametrize("kwargs, message", [
    (dict(generated_tokens=[1, 2], seconds=[1.0, 1.0], warmup=0, committed=[1, 2], row_nfe=[1]), "differ in length"),
    (dict(generated_tokens=[1, 2], seconds=[1.0, 1.0], warmup=2), "more calls than the 2 warm-up"),
    (dict(generated_tokens=[1, 2], seconds=[1.0], warmup=0), "differ in length"),
    (dict(generated_tokens=[1, 2], seconds=[1.0, 1.0], warmup=0, nfe=[1]), "differ in length"),
    (dict(generated_tokens=[1, -2], seconds=[1.0, 1.0], warmup=0), "must be >= 0"),
    (dict(generated_tokens=[1, 2], seconds=[1.0, 0.0], warmup=0), "positive time"),
    (dict(generated_tokens=[1, 2], seconds=[1.0, 1.0], warmup=-1), "warmup must be >= 0"),
])
def test_throughput_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        throughput_stats(**kwargs)
