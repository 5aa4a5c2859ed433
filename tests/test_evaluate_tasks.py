"""Reasoning accuracy, infilling ROUGE and throughput through the real decoders (docs/method.md §4.10, §5.2, §5.4):
scores equal a direct decode scored by hand, batching changes nothing, completions are cut at EOS, AR
infills from the prefix only, throughput excludes the warm-up and counts only generated tokens, and NFE and
tokens/step are the decoders' own counts."""

import math

import pytest
import torch

from setdlm import Model
from setdlm.data.tasks import InfillExample, ReasoningExample, reasoning_split
from setdlm.decoding import applicable, generate
from setdlm.decoding import infill as decode_infill
from setdlm.evaluation.infill import infill, infill_steps
from setdlm.evaluation.metrics import exact_match, rouge
from setdlm.evaluation.passes import fits, infill_row, interleave, prompt_ids
from setdlm.evaluation.throughput import throughput
from setdlm.evaluation.reasoning import reasoning, reasoning_steps
from setdlm.evaluation.passes import EvalRun

from support import Counting, SlowStart, scripted, task_tokenizer, tiny

FAMILIES = ["ar", "setdlm", "bd3lm", "mdlm"]
TOK = task_tokenizer()
# equal-length questions (so that a position-scripted model writes the same solution after each)
PROBLEMS = [ReasoningExample(f"Ann has {a} pens. She buys {b} more. How many pens does Ann have now?",
                             f"{a}+{b}={a + b}\n#### {a + b}", a + b)
            for a, b in ((3, 4), (2, 5), (1, 4), (6, 3), (5, 2))]
STORY = InfillExample("Tom woke up early.", " He made some tea and read.", " Then he went to work.")


def _script(prompt_len: int, completion: str, eos: bool = True) -> list[int]:
    """Filler up to the prompt's end, then the completion (and EOS)."""
    return [0] * prompt_len + TOK.encode(completion) + ([TOK.eos_token_id] if eos else [])


# ---------------------------------------------------------------------------------------------------------
# reasoning
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_reasoning_scores_a_scripted_model(family):
    """A model that always writes '3+4=7 / #### 7' then EOS is right on exactly the problems whose answer is 7,
    through every family's decoder, with any threshold and batch size."""
    P = len(prompt_ids(tiny(family, TOK), PROBLEMS[0]))
    assert all(len(prompt_ids(tiny(family, TOK), e)) == P for e in PROBLEMS)
    model = scripted(tiny(family, TOK), _script(P, "3+4=7\n#### 7"), filler=TOK.encode("x")[0])
    for kw, batch in (({}, None), (applicable(family, threshold=0.5), 2)):
        res = reasoning(model, PROBLEMS, run=EvalRun(batch_size=batch, progress=False), **kw)
        assert res.predictions == ("3+4=7\n#### 7",) * 5
        assert res.correct == 3 and res.accuracy == pytest.approx(0.6) and res.run.n == 5
        assert res.run.generated_tokens == 5 * (len("3+4=7\n#### 7") + 1)  # EOS included, prompt excluded
    fast = reasoning(model, PROBLEMS, run=EvalRun(progress=False), **applicable(family, threshold=0.5, window=4))
    if family != "ar":  # a confident model commits several tokens per step under a threshold
        assert fast.run.tokens_per_step > 1.5 and fast.run.nfe_per_example < len("3+4=7\n#### 7") + 1


def test_reasoning_cuts_the_completion_at_eos():
    """With ignore_eos the decoder runs past EOS; the scored text still ends at the first EOS."""
    model = scripted(tiny("setdlm", TOK), _script(len(prompt_ids(tiny("setdlm", TOK), PROBLEMS[0])), "x\n")
                     + [TOK.eos_token_id] + TOK.encode("#### 7"), filler=TOK.encode("x")[0])
    raw = generate(model, [prompt_ids(model, e) for e in PROBLEMS], max_new_tokens=12, ignore_eos=True)
    assert all("#### 7" in t for t in raw.texts)  # would score 3/5 without the cut
    res = reasoning(model, PROBLEMS, max_new_tokens=12, ignore_eos=True, run=EvalRun(progress=False))
    assert res.predictions == ("x\n",) * 5 and res.correct == 0
    assert res.run.generated_tokens == 5 * 12  # ignore_eos: every row used its whole budget


@pytest.mark.parametrize("family", FAMILIES)
def test_reasoning_equals_a_direct_decode_at_any_batch_size(family):
    """Accuracy = exact match of the texts of one generate() call on [BOS] + prompt; batch 1 and batch 3 give
    the same predictions and the same per-example NFE; run counts are the decoder's own."""
    model = tiny(family, TOK)
    problems = reasoning_split("test", 7, level="easy", seed=2)
    prompts = [[TOK.bos_token_id] + TOK.encode(e.question + "\n") for e in problems]
    budget = 128 - max(map(len, prompts))  # default: what the longest prompt leaves of L
    ref = generate(model, prompts, max_new_tokens=budget)
    res = reasoning(model, problems, run=EvalRun(batch_size=len(problems), progress=False))
    assert res.max_new_tokens == budget and list(res.predictions) == ref.texts
    assert res.accuracy == exact_match(ref.texts, [e.answer for e in problems])
    assert (res.run.nfe, res.run.generated_tokens) == (ref.nfe, ref.num_tokens)
    assert res.run.tokens_per_step == ref.tokens_per_step
    assert res.run.nfe_per_example == sum(ref.row_nfe) / len(problems)
    one = reasoning(model, problems, run=EvalRun(batch_size=1, progress=False))
    three = reasoning(model, problems, run=EvalRun(batch_size=3, progress=False))
    assert one.predictions == three.predictions == res.predictions
    assert one.run.nfe_per_example == three.run.nfe_per_example == res.run.nfe_per_example
    assert one.run.nfe == sum(ref.row_nfe)  # at batch 1 the run's NFE is the sum of the rows'
    assert one.run.speed.calls == len(problems) and three.run.speed.calls == 3


def test_interleave_alternates_passes_call_by_call():
    """One step of each live pass per round, the order rotated by one each round; a finished pass drops out;
    results come back in the order the passes were given."""
    log = []

    def job(name, calls):
        for j in range(calls):
            log.append(f"{name}{j}")
            yield
        return name.upper()

    ticks = []
    assert interleave([job("a", 2), job("b", 3), job("c", 1)], progress=lambda: ticks.append(1)) == ["A", "B", "C"]
    assert log == ["a0", "b0", "c0", "b1", "a1", "b2"] and len(ticks) == 6


def test_interleaved_passes_equal_the_same_evaluations_alone():
    """Running reasoning and infilling passes side by side changes none of their results or counts."""
    problems = reasoning_split("test", 5, level="easy", seed=3)
    plan = [(tiny("ar", TOK), {}, 1), (tiny("setdlm", TOK), {"threshold": 0.5}, 2), (tiny("bd3lm", TOK), {}, 3)]
    together = interleave([reasoning_steps(m, problems, run=EvalRun(batch_size=b, progress=False), **kw)
                           for m, kw, b in plan])
    for (m, kw, b), got in zip(plan, together):
        alone = reasoning(m, problems, run=EvalRun(batch_size=b, progress=False), **kw)
        assert got.predictions == alone.predictions and got.correct == alone.correct
        assert (got.run.nfe, got.run.generated_tokens, got.run.n) == (alone.run.nfe, alone.run.generated_tokens, 5)
    stories = [STORY, InfillExample("Ann sat down.", " She was tired.", " Then she slept.")]
    models = [tiny("setdlm", TOK), tiny("mdlm", TOK)]
    together = interleave([infill_steps(m, stories, run=EvalRun(batch_size=1, progress=False)) for m in models])
    for m, got in zip(models, together):
        alone = infill(m, stories, run=EvalRun(batch_size=1, progress=False))
        assert got.predictions == alone.predictions and got.rougeL == alone.rougeL and got.run.nfe == alone.run.nfe


def test_reasoning_rejects_bad_input():
    model = tiny("setdlm", TOK, L=64)
    with pytest.raises(ValueError, match="no examples"):
        reasoning(model, [], run=EvalRun(progress=False))
    with pytest.raises(ValueError, match="expected ReasoningExample examples, got InfillExample"):
        reasoning(model, [STORY], run=EvalRun(progress=False))
    long = ReasoningExample("x" * 70, "#### 1", 1)
    with pytest.raises(ValueError, match="prompt 0 is 72 tokens long.*L=64"):
        reasoning(model, [long], run=EvalRun(progress=False))
    model = tiny("setdlm", TOK)
    with pytest.raises(ValueError, match="warmup=2 leaves none of the 2 decoding calls"):
        reasoning(model, PROBLEMS[:2], run=EvalRun(batch_size=1, warmup=2, progress=False))
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        reasoning(model, PROBLEMS[:2], run=EvalRun(batch_size=0, progress=False))
    nobody = Model(model.backbone, model.family, None)
    with pytest.raises(ValueError, match="needs the model's tokenizer"):
        reasoning(nobody, PROBLEMS, run=EvalRun(progress=False))


# ---------------------------------------------------------------------------------------------------------
# infilling
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_infill_of_the_true_middle_scores_rouge_one(family):
    """A model scripted with the whole true row fills the middle exactly: ROUGE 1 for every family."""
    model = tiny(family, TOK)
    pre, m, suf = infill_row(model, STORY)
    truth = pre + TOK.encode(STORY.middle) + TOK.encode(STORY.suffix)
    assert m == len(STORY.middle) and pre[0] == TOK.bos_token_id
    res = infill(scripted(model, truth, filler=0), [STORY] * 3, run=EvalRun(batch_size=2, progress=False),
                 **applicable(family, threshold=0.5))
    assert res.predictions == (STORY.middle,) * 3
    assert (res.rouge1, res.rouge2, res.rougeL) == (1.0, 1.0, 1.0)
    assert res.run.generated_tokens == 3 * m


@pytest.mark.parametrize("family", FAMILIES)
def test_infill_equals_a_direct_decode(family):
    """Rows are [BOS] prefix, oracle length, suffix (AR: the prefix only, so that even the repetition penalty
    never sees the suffix); ROUGE is rouge-score's on the decoded middles."""
    model = tiny(family, TOK)
    stories = [STORY, InfillExample("It rained.", " We stayed in and read books.", " The sun came out at noon.")]
    kw = dict(repetition_penalty=1.5)
    res = infill(model, stories, run=EvalRun(progress=False), **kw)
    pres = [[TOK.bos_token_id] + TOK.encode(s.prefix) for s in stories]
    sufs = [[] if family == "ar" else TOK.encode(s.suffix) for s in stories]
    ref = decode_infill(model, pres, sufs, [len(s.middle) for s in stories], **kw)
    assert list(res.predictions) == ref.texts
    assert res.rougeL == pytest.approx(rouge(ref.texts, [s.middle for s in stories])["rougeL"])
    assert (res.run.nfe, res.run.tokens_per_step) == (ref.nfe, ref.tokens_per_step)
    if family == "ar":  # with the suffix visible, the penalty would have changed the AR infill
        sufs = [TOK.encode(s.suffix) for s in stories]
        seen = decode_infill(model, pres, sufs, [len(s.middle) for s in stories], **kw)
        assert seen.texts != ref.texts
    else:  # eos=True appends EOS after the suffix
        with_eos = infill_row(model, STORY, eos=True)
        assert with_eos[2] == TOK.encode(STORY.suffix) + [TOK.eos_token_id]


def test_fits_counts_the_whole_example():
    model = tiny("setdlm", TOK, L=64)
    n = 1 + len(STORY.text)  # BOS + characters
    assert fits(tiny("setdlm", TOK, L=n), STORY) and not fits(tiny("setdlm", TOK, L=n - 1), STORY)
    assert not fits(tiny("setdlm", TOK, L=n), STORY, eos=True)
    e = PROBLEMS[0]
    need = 1 + len(e.prompt) + len(e.completion) + 1  # BOS, prompt, solution, EOS
    assert fits(tiny("ar", TOK, L=need), e) and not fits(tiny("ar", TOK, L=need - 1), e)
    with pytest.raises(ValueError, match="expected a ReasoningExample, ParallelExample or InfillExample"):
        fits(model, "text")


# ---------------------------------------------------------------------------------------------------------
# throughput
# ---------------------------------------------------------------------------------------------------------


def test_throughput_excludes_the_warmup_calls():
    """The first examples' forwards sleep (a cold start): with them as warm-up the measured time holds none of
    that sleep; without warm-up it does."""
    base = tiny("setdlm", TOK)
    prompts = ["Ann has", "Bo", "Cara has four", "Dan", "Eve has a dog"]
    counter = Counting(base.backbone)
    for p in prompts[:2]:  # forwards (prefill included) of the two warm-up examples, decoded alone
        generate(Model(counter, base.family, TOK), [[TOK.bos_token_id] + TOK.encode(p)], max_new_tokens=6)
    slow, delay = counter.calls, 0.2  # ~3 s of sleep against ~30 ms of work: a margin a busy machine keeps

    def timed(warmup):
        model = Model(SlowStart(base.backbone, slow, delay), base.family, TOK)
        return throughput(model, prompts, run=EvalRun(warmup=warmup, progress=False), max_new_tokens=6)

    warm = timed(2)
    assert warm.calls == 3 and warm.warmup == 2
    assert warm.seconds < 0.5 * slow * delay  # the sleep happened in the warm-up calls only
    cold = timed(0)
    assert cold.seconds >= slow * delay and cold.calls == 5
    model = Model(SlowStart(base.backbone, slow, delay), base.family, TOK)
    cpu = throughput(model, prompts, run=EvalRun(warmup=0, clock='cpu', progress=False), max_new_tokens=6)
    assert cpu.seconds < 0.5 * slow * delay and cpu.tokens == cold.tokens  # CPU time: sleeping is not work
    with pytest.raises(ValueError, match="clock must be one of wall, cpu, got 'gpu'"):
        throughput(base, prompts, run=EvalRun(warmup=0, clock='gpu', progress=False), max_new_tokens=2)


@pytest.mark.parametrize("family", FAMILIES)
def test_throughput_counts_generated_tokens_and_the_decoders_nfe(family):
    """Tokens = generated tokens of the measured calls (prompts of any length never count); NFE and
    tokens/step equal the decoder's counts for the same calls, also when several tokens commit per step."""
    P = len(prompt_ids(tiny(family, TOK), PROBLEMS[0]))
    model = scripted(tiny(family, TOK), _script(P, "3+4=7\n#### 7"), filler=TOK.encode("x")[0])
    kw = dict(threshold=0.5) if family != "ar" else {}
    stats = throughput(model, PROBLEMS, run=EvalRun(warmup=2, progress=False), **kw)
    direct = [generate(model, [prompt_ids(model, e)], max_new_tokens=128 - P, **kw) for e in PROBLEMS[2:]]
    assert stats.tokens == sum(o.num_tokens for o in direct) == 3 * (len("3+4=7\n#### 7") + 1)
    assert stats.nfe == sum(o.nfe for o in direct)
    assert stats.tokens_per_step == pytest.approx(sum(sum(o.row_committed) for o in direct)
                                                  / sum(sum(o.row_nfe) for o in direct), rel=1e-12)
    assert stats.tokens_per_step == pytest.approx(direct[0].tokens_per_step, rel=1e-12)
    assert (stats.tokens_per_step > 1.5) == (family != "ar")
    rates = [o.num_tokens / o.seconds for o in direct]  # same kind of number as the per-call mean
    assert math.isfinite(stats.mean) and stats.mean > 0 and len(rates) == stats.calls


def test_throughput_prompts_and_batches():
    """Strings are [BOS] + text, token lists go as given; at batch > 1 the aggregate rate covers every row and
    tokens/step stays per row (the decoder's pooled figure), not per batched forward."""
    model = tiny("setdlm", TOK)
    prompts = ["Ann has", "Bo", "Cara has four", "Dan"]
    ids = [[TOK.bos_token_id] + TOK.encode(p) for p in prompts]
    a = throughput(model, prompts, run=EvalRun(warmup=0, batch_size=2, progress=False), max_new_tokens=5)
    b = throughput(model, ids, run=EvalRun(warmup=0, batch_size=2, progress=False), max_new_tokens=5)
    assert (a.tokens, a.nfe, a.calls) == (b.tokens, b.nfe, b.calls) == (20, 10, 2)
    assert a.tokens_per_step == 1.0  # 20 tokens, 20 row-forwards (10 batched forwards of 2 rows)
    assert a.aggregate == pytest.approx(a.tokens / a.seconds)
    stories = throughput(model, [STORY] * 3, run=EvalRun(warmup=1, progress=False))
    assert stories.tokens == 2 * len(STORY.middle) and stories.calls == 2
    with pytest.raises(ValueError, match="max_new_tokens does not apply to infilling"):
        throughput(model, [STORY] * 3, run=EvalRun(warmup=1, progress=False), max_new_tokens=4)
    with pytest.raises(ValueError, match="item 1 is neither an example, a string nor a list of token ids"):
        throughput(model, ["ok", 3.5], run=EvalRun(warmup=0, progress=False))
    with pytest.raises(ValueError, match="no prompts or examples"):
        throughput(model, [], run=EvalRun(progress=False))


def test_results_serialise_to_json():
    import json

    model = tiny("setdlm", TOK)
    r = reasoning(model, PROBLEMS[:2], max_new_tokens=4, run=EvalRun(progress=False))
    d = json.loads(json.dumps(r.to_dict()))
    assert d["accuracy"] == r.accuracy and d["nfe"] == r.run.nfe and d["speed"]["tokens"] == r.run.generated_tokens
    assert "predictions" not in d
    i = infill(model, [STORY], run=EvalRun(progress=False)).to_dict()
    assert set(i) >= {"rouge1", "rouge2", "rougeL", "tokens_per_step", "nfe_per_example", "speed"}
    assert torch.isfinite(torch.tensor(json.loads(json.dumps(i))["speed"]["mean"]))
