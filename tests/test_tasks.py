"""Task data: deterministic generators, disjoint fixed splits, arithmetically correct reasoning problems,
infill examples that reassemble to their source text, GSM8K JSONL loading (docs/method.md §5.2, §5.4)."""

import json
import random
import re

import pytest

from setdlm.data.tasks import (LEVELS, SPLITS, InfillExample, ReasoningConfig, encode_infill,
                               gsm_symbolic, infill_examples, infill_from_file, load_gsm8k_jsonl, make_infill,
                               reasoning_split, split_of, split_sentences, write_jsonl)
from setdlm.data.tokenizers import char_tokenizer
from setdlm.evaluation.metrics import extract_answer

# ---------------------------------------------------------------------------------------------------------
# reasoning
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", list(LEVELS))
def test_reasoning_is_deterministic_per_seed_and_prefix_stable(level):
    a = reasoning_split("train", 200, level=level, seed=3)
    assert a == reasoning_split("train", 200, level=level, seed=3)
    assert a[:50] == reasoning_split("train", 50, level=level, seed=3)  # a smaller draw is a prefix
    b = reasoning_split("train", 200, level=level, seed=4)
    assert len({e.question for e in a} & {e.question for e in b}) < 100  # another seed, another draw
    assert len({e.question for e in a}) == 200  # distinct within a split


def test_reasoning_splits_never_overlap():
    qs = {s: {e.question for e in reasoning_split(s, n, level="easy", seed=0)}
          for s, n in (("train", 3000), ("validation", 300), ("test", 300))}
    assert not qs["train"] & qs["test"] and not qs["train"] & qs["validation"] and not qs["validation"] & qs["test"]
    # the split is a property of the text alone: other seeds cannot leak test questions into train either
    other_train = {e.question for e in reasoning_split("train", 3000, level="easy", seed=1)}
    assert not other_train & qs["test"]
    assert all(split_of(q) == s for s in SPLITS for q in qs[s])


def _recompute(start, steps):
    """Independent evaluation of a chain (integer arithmetic, exact division)."""
    value = start
    for op, x in steps:
        if op == "/":
            assert value % x == 0, f"{value}/{x} is not exact"
        value = {"+": value + x, "-": value - x, "*": value * x, "/": value // x}[op]
    return value


LINE = re.compile(r"^(\d+)([-+*/])(\d+)=(\d+)$")


@pytest.mark.parametrize("level", list(LEVELS))
def test_reasoning_answers_are_arithmetically_correct(level):
    cfg = LEVELS[level]
    for ex in reasoning_split("test", 300, level=level, seed=0):
        # 1. from the structured data
        assert ex.answer == _recompute(ex.start, ex.steps)
        assert cfg.steps[0] <= len(ex.steps) <= cfg.steps[1]
        assert {op for op, _ in ex.steps} <= set(cfg.operations)
        # 2. the question states exactly the start and the operands, in order ("keeps 1/4 of them" states 4)
        numbers = re.findall(r"\d+", re.sub(r"\b1/(?=\d)", "", ex.question))
        assert [int(x) for x in numbers] == [ex.start] + [x for _, x in ex.steps]
        # 3. by re-evaluating each solution line, chained from the start
        *lines, last = ex.solution.split("\n")
        assert len(lines) == len(ex.steps)
        value = ex.start
        for line, (op, x) in zip(lines, ex.steps):
            a, o, b, c = LINE.match(line).groups()
            assert (int(a), o, int(b)) == (value, op, x)
            value = int(c)
            assert value == _recompute(int(a), [(o, int(b))])
            assert 1 <= value <= cfg.max_result
        assert last == f"#### {ex.answer}" and value == ex.answer
        assert extract_answer(ex.completion) == ex.answer
        assert ex.prompt == ex.question + "\n"


def test_reasoning_difficulty_knobs_and_validation():
    cfg = ReasoningConfig(steps=(3, 3), values=(20, 30), operations=("*", "/"), max_factor=3, max_result=10_000)
    for ex in reasoning_split("train", 50, level=cfg, seed=0):
        assert len(ex.steps) == 3 and 20 <= ex.start <= 30
        assert all(op in "*/" and 2 <= x <= 3 for op, x in ex.steps)
    with pytest.raises(ValueError, match="unknown difficulty 'extreme'"):
        reasoning_split("train", 1, level="extreme")
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        reasoning_split("dev", 1)
    for bad, msg in [(dict(steps=(0, 2)), "steps"), (dict(steps=(3, 2)), "steps"), (dict(values=(0, 9)), "values"),
                     (dict(operations=("%",)), "operations"), (dict(operations=()), "operations"),
                     (dict(max_factor=1), "max_factor"), (dict(values=(5, 9), max_result=4), "max_result")]:
        with pytest.raises(ValueError, match=msg):
            ReasoningConfig(**bad)
    # a space too small for the request is an error, not an endless loop
    tiny = ReasoningConfig(steps=(1, 1), values=(1, 1), operations=("+",), max_result=2)
    with pytest.raises(ValueError, match="distinct train problems"):
        reasoning_split("train", 1000, level=tiny)


def test_reasoning_texts_fit_small_contexts():
    """The presets are sized for character-level models: easy fits 128 characters, hard fits 256."""
    for level, limit in (("easy", 126), ("medium", 254), ("hard", 254)):
        longest = max(len(e.prompt + e.completion) for e in reasoning_split("train", 1000, level=level))
        assert longest <= limit, (level, longest)


def test_gsm8k_jsonl_roundtrip_and_loader(tmp_path):
    exs = reasoning_split("validation", 20, level="medium")
    path = tmp_path / "gen.jsonl"
    assert write_jsonl(exs, path) == 20
    loaded = load_gsm8k_jsonl(path)
    assert [(e.question, e.solution, e.answer) for e in loaded] == [(e.question, e.solution, e.answer) for e in exs]
    # GSM8K's own records: calculator annotations, thousands separators
    real = tmp_path / "gsm8k.jsonl"
    real.write_text(json.dumps({"question": "Natalia sold clips to 48 of her friends in April, and then she sold "
                                "half as many clips in May. How many clips did Natalia sell altogether?",
                                "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold "
                                "48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"}) + "\n\n"
                    + json.dumps({"question": "q", "answer": "1000+234=1234\n#### 1,234"}) + "\n")
    a, b = load_gsm8k_jsonl(real)
    assert a.answer == 72 and "<<" in a.solution and b.answer == 1234
    stripped = load_gsm8k_jsonl(real, strip_calculator=True)[0]
    assert stripped.solution.startswith("Natalia sold 48/2 = 24 clips") and stripped.answer == 72
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "12"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: answer has no '#### <integer>'"):
        load_gsm8k_jsonl(bad)
    bad.write_text('{"question": "q", "answer": "#### 1"}\n{"text": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not a JSON object"):
        load_gsm8k_jsonl(bad)


def test_prompt_completion_records(tmp_path):
    ex = reasoning_split("train", 1)[0]
    rec = ex.to_prompt_completion()
    assert rec["prompt"] + rec["completion"] == ex.question + "\n" + ex.solution


def test_gsm_symbolic_through_reasoning_gym():
    pytest.importorskip("reasoning_gym")
    exs = gsm_symbolic("test", 6, seed=0)
    assert exs == gsm_symbolic("test", 6, seed=0) and len(exs) == 6
    assert all(split_of(e.question) == "test" for e in exs)
    assert all(extract_answer(e.solution) == e.answer for e in exs)
    assert not {e.question for e in exs} & {e.question for e in gsm_symbolic("train", 30, seed=0)}


# ---------------------------------------------------------------------------------------------------------
# infilling
# ---------------------------------------------------------------------------------------------------------


def _corpus(paragraphs=80, seed=0):
    """Multi-sentence paragraphs with line breaks inside them, abbreviations and quotes."""
    rng = random.Random(seed)
    names = ["Mr. Gray", "Ada", "Bo", "Dr. Lee", "Kim", "the old cook"]
    verbs = ["walked to", "looked at", "painted", "sold", "found", "lost", "cleaned", "opened"]
    things = ["the red door", "a small boat", "the garden", "an old map", "the blue kite", "the market",
              "a letter", "the 3 lamps"]
    enders = [".", ".", ".", "!", "?", '."', "!'"]
    paras = []
    for _ in range(paragraphs):
        sents = []
        for _ in range(rng.randint(6, 12)):
            who = rng.choice(names)
            s = f"{who[0].upper()}{who[1:]} {rng.choice(verbs)} {rng.choice(things)}{rng.choice(enders)}"
            if rng.random() < 0.2:
                s = '"' + s.replace('."', '.').replace("!'", "!") + '"'
            sents.append(s)
        text = " ".join(sents)
        # wrap lines like a book does
        words, lines, line = text.split(" "), [], []
        for w in words:
            line.append(w)
            if rng.random() < 0.12:
                lines.append(" ".join(line))
                line = []
        lines.append(" ".join(line))
        paras.append("\n".join(lines))
    return "\n\n".join(paras)


def test_split_sentences():
    p = ('Mr. Gray met Dr. Lee at 5 p.m. near St. Mary\'s. "Hello!" she said. Was it late? or early? '
         "It was 3.5 miles away. J. R. R. Tolkien wrote it... The end")
    assert split_sentences(p) == ["Mr. Gray met Dr. Lee at 5 p.m. near St. Mary's.", '"Hello!" she said.',
                                  "Was it late? or early?", "It was 3.5 miles away.",
                                  "J. R. R. Tolkien wrote it...", "The end"]
    assert split_sentences("One.\n  Two   three.\nFour!") == ["One.", "Two three.", "Four!"]
    assert split_sentences("") == []


@pytest.mark.parametrize("sentences, hidden", [(5, 1), (5, 3), (3, 1), (4, 2)])
def test_infill_examples_reassemble_to_the_original_text(sentences, hidden):
    text = _corpus()
    normalized = [" ".join(p.split()) for p in text.split("\n\n")]
    exs = [e for s in SPLITS for e in infill_examples(text, s, sentences=sentences, hidden=hidden)]
    assert len(exs) > 40
    a = (sentences - hidden) // 2
    for ex in exs:
        assert ex.prefix + ex.middle + ex.suffix == ex.text
        assert any(ex.text in p for p in normalized)  # a contiguous window of one paragraph
        sents = split_sentences(ex.text)
        assert len(sents) == sentences
        assert ex.prefix == " ".join(sents[:a])
        assert ex.middle == " " + " ".join(sents[a:a + hidden])
        assert ex.suffix == " " + " ".join(sents[a + hidden:])
    assert make_infill(["A.", "B.", "C.", "D.", "E."], 3) == InfillExample("A.", " B. C. D.", " E.")


def test_infill_is_deterministic_with_fixed_disjoint_splits():
    text = _corpus()
    by_split = {s: infill_examples(text, s) for s in SPLITS}
    assert all(by_split[s] for s in SPLITS)
    texts = {s: {e.text for e in by_split[s]} for s in SPLITS}
    assert not texts["train"] & texts["test"] and not texts["train"] & texts["validation"]
    assert not texts["validation"] & texts["test"]
    assert infill_examples(text, "test", seed=5) == infill_examples(text, "test", seed=5)
    other = infill_examples(text, "test", seed=6)
    assert {e.text for e in other} == texts["test"] and other != infill_examples(text, "test", seed=5)
    assert infill_examples(text, "test", 3, seed=5) == infill_examples(text, "test", seed=5)[:3]
    # the middle of 3-of-5 spans three sentences of the same window as 1-of-5
    assert {e.text for e in infill_examples(text, "test", hidden=3)} == texts["test"]


def test_infill_limits_and_errors(tmp_path):
    text = _corpus()
    short = infill_examples(text, "train", max_chars=120)
    assert short and all(len(e.text) <= 120 for e in short)
    with pytest.raises(ValueError, match="asked for n=100000 test examples"):
        infill_examples(text, "test", 100_000)
    with pytest.raises(ValueError, match="hidden must be in"):
        infill_examples(text, "test", hidden=4)
    with pytest.raises(ValueError, match="sentences must be >= 3"):
        infill_examples(text, "test", sentences=2)
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    assert infill_from_file(path, "validation") == infill_examples(text, "validation")
    path.write_bytes(b"caf\xe9 au lait. " * 10)
    with pytest.raises(ValueError, match="corpus.txt is not UTF-8"):
        infill_from_file(path, "test")


def test_encode_infill_parts_and_oracle_length():
    ex = infill_examples(_corpus(), "test", 1)[0]
    tok = char_tokenizer([ex.text])  # one id per character
    p, m, s = encode_infill(ex, tok)
    assert p + m + s == tok.encode(ex.text)
    assert len(m) == len(ex.middle)
