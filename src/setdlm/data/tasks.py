"""Offline evaluation tasks: GSM8K-shaped arithmetic word problems and sentence infilling (docs/method.md §5.2, §5.4).

Reasoning (``reasoning_split``): a question about one running amount, changed by a chain of operations, a
worked solution of one line per operation and a final ``#### <integer>`` line, the shape of GSM8K::

    Ann has 7 pens. She buys 5 more. She gives away 3. How many pens does Ann have now?
    7+5=12
    12-3=9
    #### 9

Difficulty knobs (``ReasoningConfig``): the number of steps, the range of the numbers, the operations and
the largest intermediate result; presets ``easy``, ``medium``, ``hard``. Every answer is an exact integer
(subtraction never goes below 1, division is always exact). ``load_gsm8k_jsonl`` reads GSM8K's own JSONL
(``question`` / ``answer``) and ``gsm_symbolic`` wraps the GSM-Symbolic generator of ``reasoning-gym``.

Infilling (``infill_examples``): windows of ``sentences`` consecutive sentences from any text, with the middle
``hidden`` sentences removed (ROCStories: 1 of 5 or 3 of 5, docs/method.md §5.4) so that
``prefix + middle + suffix`` is the window text exactly; ``encode_infill`` tokenizes the three parts
separately, as the paper does, and the middle's token count is the oracle length.
:func:`setdlm.data.sources.infill_from_source` draws them from any ``setdlm train`` text source, e.g. the
built-in ``"shakespeare"``; ``without_heldout_windows`` gives the text to train on so that validation and
test windows stay unseen (the built-in ``"shakespeare-train"``).

Splits: an example belongs to ``train``, ``validation`` or ``test`` by a keyed hash of its text (the question,
or the infill window), 10% validation and 10% test. The split of a text never depends on the seed, the
size asked for or the generator settings, so no test question can appear in any train set; the seed only
picks which examples of a split are drawn, and a smaller draw is a prefix of a larger one.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterable, Sequence

from ..errors import UserError

# the answer line of a GSM8K solution (docs/method.md §5.2; lm-eval's strict match reads the same line)
# "#### 1,234", "####-5", "#### − 7", "#### $12", "#### 12.00"
_ANSWER = re.compile(r"####[ \t]*\$?[ \t]*([-−–]?)[ \t]*(\d[\d,]*)(\.\d+)?")


def extract_answer(text: str) -> int | None:
    """The integer after the first ``####`` in ``text``, or None when there is none.

    Robust to spaces around the number and the sign, thousands separators (``1,234``), a leading ``$``,
    Unicode minus signs and a zero fraction (``12.00``). A non-zero fraction (``2.5``) is not an integer
    and gives None, as does a missing ``####`` line: both score as wrong.
    """
    m = _ANSWER.search(text)
    if m is None:
        return None
    sign, digits, frac = m.groups()
    if frac is not None and frac.strip(".0"):
        return None
    value = int(digits.replace(",", ""))
    return -value if sign else value


SPLITS = ("train", "validation", "test")
HOLDOUT = 0.1  # fraction of all texts in validation, and again in test


def split_of(text: str) -> str:
    """The split a text belongs to, fixed forever by a hash of the text alone."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8, person=b"setdlm-split").digest()
    u = int.from_bytes(digest, "big") / 2**64
    return "test" if u < HOLDOUT else "validation" if u < 2 * HOLDOUT else "train"


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")


# ---------------------------------------------------------------------------------------------------------
# reasoning: arithmetic word problems
# ---------------------------------------------------------------------------------------------------------

OPERATIONS = ("+", "-", "*", "/")


@dataclass(frozen=True)
class ReasoningConfig:
    """Difficulty knobs of the arithmetic word problems."""

    steps: tuple[int, int] = (1, 2)  # fewest and most operations per problem (inclusive)
    values: tuple[int, int] = (1, 9)  # range of the starting amount and of the +/- operands
    operations: tuple[str, ...] = ("+", "-")  # any of + - * /
    max_factor: int = 9  # * and / operands are drawn from 2..max_factor
    max_result: int = 99  # every intermediate amount stays in [1, max_result]

    def __post_init__(self):
        (s0, s1), (v0, v1) = self.steps, self.values
        if not 1 <= s0 <= s1:
            raise UserError(f"steps must be (lo, hi) with 1 <= lo <= hi, got {self.steps}")
        if not 1 <= v0 <= v1:
            raise UserError(f"values must be (lo, hi) with 1 <= lo <= hi, got {self.values}")
        bad = [op for op in self.operations if op not in OPERATIONS]
        if bad or not self.operations or len(set(self.operations)) != len(self.operations):
            raise UserError(f"operations must be distinct members of {OPERATIONS}, got {self.operations}")
        if self.max_factor < 2:
            raise UserError(f"max_factor must be >= 2, got {self.max_factor}")
        if self.max_result < v0:
            raise UserError(f"max_result must be >= the smallest value {v0}, got {self.max_result}")


LEVELS = {
    # one or two single-digit additions/subtractions: a few-million-parameter model learns these on CPU
    "easy": ReasoningConfig(steps=(1, 2), values=(1, 9), operations=("+", "-"), max_result=99),
    # two or three steps with multiplication, numbers up to 20
    "medium": ReasoningConfig(steps=(2, 3), values=(1, 20), operations=("+", "-", "*"), max_factor=5,
                              max_result=200),
    # three or four steps, all four operations, two-digit operands, three-digit intermediates
    "hard": ReasoningConfig(steps=(3, 4), values=(10, 99), operations=OPERATIONS, max_factor=9,
                            max_result=999),
}


def reasoning_config(level: str | ReasoningConfig) -> ReasoningConfig:
    if isinstance(level, ReasoningConfig):
        return level
    if level not in LEVELS:
        raise UserError(f"unknown difficulty {level!r}; choose one of {', '.join(LEVELS)} or a ReasoningConfig")
    return LEVELS[level]


@dataclass(frozen=True)
class ReasoningExample:
    """One problem. ``start`` and ``steps`` hold the structured data of generated problems (empty if loaded)."""

    question: str
    solution: str  # the worked solution, ending with the line '#### <answer>'
    answer: int
    start: int | None = None
    steps: tuple[tuple[str, int], ...] = ()  # (operation, operand) in order

    @property
    def prompt(self) -> str:
        """What the model is given: the question and a newline."""
        return self.question + "\n"

    @property
    def completion(self) -> str:
        """What the model should write: the solution."""
        return self.solution

    def to_dict(self) -> dict:
        """GSM8K's own record format (``answer`` is the whole solution with its ``####`` line)."""
        return {"question": self.question, "answer": self.solution}

    def to_prompt_completion(self) -> dict:
        """The ``prompt`` / ``completion`` record that ``setdlm train`` reads (the prompt is never masked)."""
        return {"prompt": self.prompt, "completion": self.completion}


_NAMES = (("Ann", "She"), ("Ben", "He"), ("Cara", "She"), ("Dan", "He"), ("Eva", "She"), ("Finn", "He"),
          ("Gina", "She"), ("Hugo", "He"), ("Ivy", "She"), ("Jack", "He"), ("Kate", "She"), ("Leo", "He"),
          ("Mia", "She"), ("Noah", "He"), ("Olga", "She"), ("Paul", "He"))
_ITEMS = ("apples", "pens", "cards", "coins", "books", "eggs", "stamps", "shells", "marbles", "cookies",
          "stickers", "beads", "shirts", "toys", "rocks", "plums")
_TEMPLATES = {
    "+": ("{P} buys {b} more.", "{P} finds {b} more.", "{P} gets {b} more."),
    "-": ("{P} gives away {b}.", "{P} loses {b}.", "{P} sells {b}."),
    "*": ("{P} now has {b} times as many.", "{P} ends with {b} times as many."),
    "/": ("{P} keeps 1/{b} of them.", "{P} keeps one of {b} equal parts."),
}


def apply_operation(value: int, op: str, operand: int) -> int:
    """``value op operand`` for integer amounts; division must be exact."""
    if op == "+":
        return value + operand
    if op == "-":
        return value - operand
    if op == "*":
        return value * operand
    if op == "/":
        if operand == 0 or value % operand:
            raise UserError(f"{value}/{operand} is not an exact integer division")
        return value // operand
    raise UserError(f"unknown operation {op!r}; choose one of {OPERATIONS}")


def _operands(value: int, op: str, cfg: ReasoningConfig) -> list[int]:
    """Operands that keep the amount an integer in [1, max_result]."""
    lo, hi = cfg.values
    if op == "+":
        return list(range(lo, min(hi, cfg.max_result - value) + 1))
    if op == "-":
        return list(range(lo, min(hi, value - 1) + 1))
    if op == "*":
        return list(range(2, min(cfg.max_factor, cfg.max_result // value) + 1))
    return [d for d in range(2, cfg.max_factor + 1) if value % d == 0]


def _sample_chain(rng: random.Random, cfg: ReasoningConfig) -> tuple[int, list[tuple[str, int]]]:
    for _ in range(1000):
        n = rng.randint(*cfg.steps)
        start = value = rng.randint(cfg.values[0], min(cfg.values[1], cfg.max_result))
        steps = []
        for _ in range(n):
            options = [(op, xs) for op in cfg.operations if (xs := _operands(value, op, cfg))]
            if not options:
                break
            op, xs = rng.choice(options)
            operand = rng.choice(xs)
            value = apply_operation(value, op, operand)
            steps.append((op, operand))
        else:
            return start, steps
    raise UserError(f"no problem satisfies {cfg}: widen values, operations or max_result")


def make_problem(start: int, steps: Sequence[tuple[str, int]], rng: random.Random) -> ReasoningExample:
    """Render a chain of operations as a question (wording drawn from ``rng``) and a worked solution."""
    name, pronoun = rng.choice(_NAMES)
    item = rng.choice(_ITEMS)
    sentences = [f"{name} has {start} {item[:-1] if start == 1 else item}."]  # every item is a plain -s plural
    lines = []
    value = start
    for op, operand in steps:
        sentences.append(rng.choice(_TEMPLATES[op]).format(P=pronoun, b=operand))
        result = apply_operation(value, op, operand)
        lines.append(f"{value}{op}{operand}={result}")
        value = result
    sentences.append(f"How many {item} does {name} have now?")
    lines.append(f"#### {value}")
    return ReasoningExample(" ".join(sentences), "\n".join(lines), value, start, tuple(steps))


def reasoning_split(split: str, n: int, *, level: str | ReasoningConfig = "easy", seed: int = 0
                    ) -> list[ReasoningExample]:
    """``n`` distinct generated problems of ``split`` at a difficulty preset or config, deterministic in seed."""
    _check_split(split)
    if n < 0:
        raise UserError(f"n must be >= 0, got {n}")
    cfg = reasoning_config(level)
    rng = random.Random(f"setdlm-reasoning:{seed}:{split}")
    out: list[ReasoningExample] = []
    seen: set[str] = set()
    misses = 0
    while len(out) < n:
        start, steps = _sample_chain(rng, cfg)
        ex = make_problem(start, steps, rng)
        if ex.question in seen or split_of(ex.question) != split:
            misses += 1
            if misses > 1000 + 100 * n:
                raise UserError(f"only {len(out)} distinct {split} problems found for {cfg}; ask for fewer "
                                f"than n={n} or widen the config")
            continue
        seen.add(ex.question)
        out.append(ex)
    return out


def load_gsm8k_jsonl(path: str | Path, *, strip_calculator: bool = False) -> list[ReasoningExample]:
    """Read GSM8K-format JSONL: one object per line with ``question`` and ``answer`` (ending ``#### <int>``).

    ``strip_calculator`` removes GSM8K's ``<<48/2=24>>`` calculator annotations from the solutions.
    """
    path = Path(path)
    out = []
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                question, solution = rec["question"], rec["answer"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise UserError(f"{path}:{i}: not a JSON object with 'question' and 'answer' ({e})") from None
            if strip_calculator:
                solution = re.sub(r"<<[^>]*>>", "", solution)
            answer = extract_answer(solution)
            if answer is None:
                raise UserError(f"{path}:{i}: answer has no '#### <integer>' line")
            out.append(ReasoningExample(question, solution, answer))
    if not out:
        raise UserError(f"{path}: no examples")
    return out


def gsm_symbolic(split: str, n: int, *, seed: int = 0, **kwargs) -> list[ReasoningExample]:
    """``n`` problems of ``split`` from the GSM-Symbolic generator of ``reasoning-gym`` (optional extra).

    The worked solution is the generator's ``answer_cot`` (it ends with ``#### <answer>``); ``kwargs`` go to
    ``reasoning_gym.create_dataset("gsm_symbolic", ...)``. Splits follow the same question hash as above.
    """
    _check_split(split)
    if n < 0:
        raise UserError(f"n must be >= 0, got {n}")
    try:
        import reasoning_gym
    except ImportError as e:
        raise ImportError("gsm_symbolic needs the 'reasoning-gym' package: pip install 'setdlm[reasoning]'") from e
    size = max(16, 4 * n)
    while True:
        out, seen = [], set()
        for rec in reasoning_gym.create_dataset("gsm_symbolic", size=size, seed=seed, **kwargs):
            q = rec["question"]
            if q in seen or split_of(q) != split:
                continue
            seen.add(q)
            answer = int(rec["answer"])
            cot = rec.get("metadata", {}).get("answer_cot") or ""
            solution = cot if extract_answer(cot) == answer else f"{cot}\n#### {answer}".lstrip()
            out.append(ReasoningExample(q, solution, answer))
        if len(out) >= n:
            return out[:n]
        if size >= 64 * (n + 16):
            raise UserError(f"only {len(out)} distinct {split} problems from gsm_symbolic, asked for {n}")
        size *= 2


# ---------------------------------------------------------------------------------------------------------
# infilling: hide the middle sentence(s) of a window
# ---------------------------------------------------------------------------------------------------------

_ABBREVIATIONS = frozenset("mr mrs ms dr st jr sr prof rev gen col capt lt sgt vs etc no mt fig e.g i.e".split())
_END = re.compile(r"[.!?]+[\"'”’)\]]*(?= )")


def split_sentences(paragraph: str) -> list[str]:
    """Sentences of one paragraph, whitespace collapsed to single spaces.

    A sentence ends at ``.``, ``!`` or ``?`` (closing quotes or brackets may follow) before a space and a
    capital letter or digit (optionally behind an opening quote), except after common abbreviations
    (``Mr.``, ``e.g.``). Joining the result with single spaces gives the normalized paragraph back.
    """
    text = " ".join(paragraph.split())
    out, begin = [], 0
    for m in _END.finditer(text):
        nxt = text[m.end() + 1:m.end() + 3].lstrip("\"'“‘([")
        if not nxt or not (nxt[0].isupper() or nxt[0].isdigit()):
            continue
        word = text[begin:m.start()].rsplit(" ", 1)[-1]
        abbreviation = word.lower() in _ABBREVIATIONS or (len(word) == 1 and word.isupper() and word != "I")
        if abbreviation and m.group().rstrip("\"'”’)]") == ".":
            continue
        out.append(text[begin:m.end()])
        begin = m.end() + 1
    if begin < len(text):
        out.append(text[begin:])
    return out


def paragraphs(text: str) -> list[str]:
    """Blocks of text separated by blank lines (a text without blank lines is one paragraph)."""
    return [p for p in re.split(r"\n[ \t]*\n", text) if p.strip()]


@dataclass(frozen=True)
class InfillExample:
    """A window of sentences with its middle hidden; whitespace before a part belongs to that part."""

    prefix: str  # the leading sentences
    middle: str  # " " + the hidden sentences: the reference
    suffix: str  # " " + the trailing sentences

    @property
    def text(self) -> str:
        return self.prefix + self.middle + self.suffix

    def to_dict(self) -> dict:
        return {"prefix": self.prefix, "middle": self.middle, "suffix": self.suffix}


def make_infill(window: Sequence[str], hidden: int) -> InfillExample:
    """Hide the middle ``hidden`` of ``window``'s sentences (the left context gets the smaller half)."""
    if not 1 <= hidden <= len(window) - 2:
        raise UserError(f"hidden must be in [1, {len(window) - 2}] for {len(window)} sentences, got {hidden}")
    a = (len(window) - hidden) // 2
    b = a + hidden
    return InfillExample(" ".join(window[:a]), " " + " ".join(window[a:b]), " " + " ".join(window[b:]))


def _windows(text: str, sentences: int, max_chars: int | None, min_words: int) -> Iterable[list[str]]:
    """Non-overlapping windows of consecutive sentences inside each paragraph, skipping unfit sentences."""
    for para in paragraphs(text):
        sents = split_sentences(para)
        i = 0
        while i + sentences <= len(sents):
            w = sents[i:i + sentences]
            fits = max_chars is None or sum(map(len, w)) + sentences - 1 <= max_chars
            if fits and all(len(s.split()) >= min_words for s in w):
                yield w
                i += sentences
            else:
                i += 1


def infill_examples(text: str, split: str, n: int | None = None, *, sentences: int = 5, hidden: int = 1,
                    seed: int = 0, max_chars: int | None = None, min_words: int = 2) -> list[InfillExample]:
    """Infilling examples of ``split`` from ``text``, shuffled by ``seed``; ``n`` of them (all when None).

    ``sentences``/``hidden``: 5/1 and 5/3 are ROCStories' "Infill 1/5" and "Infill 3/5". ``max_chars`` drops
    windows longer than that (to fit a small model's context); ``min_words`` drops windows with a sentence of
    fewer words (stage directions, headings).
    """
    _check_split(split)
    if sentences < 3:
        raise UserError(f"sentences must be >= 3 (a prefix, a middle and a suffix), got {sentences}")
    if not 1 <= hidden <= sentences - 2:
        raise UserError(f"hidden must be in [1, {sentences - 2}] for {sentences} sentences, got {hidden}")
    pool, seen = [], set()
    for w in _windows(text, sentences, max_chars, min_words):
        t = " ".join(w)
        if t not in seen and split_of(t) == split:
            seen.add(t)
            pool.append(make_infill(w, hidden))
    random.Random(f"setdlm-infill:{seed}:{split}").shuffle(pool)
    if n is None:
        return pool
    if not 0 <= n <= len(pool):
        raise UserError(f"asked for n={n} {split} examples but the text gives {len(pool)} "
                        f"({sentences}-sentence windows, max_chars={max_chars})")
    return pool[:n]


def infill_from_file(path: str | Path, split: str, n: int | None = None, **kwargs) -> list[InfillExample]:
    """``infill_examples`` over a UTF-8 text file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    return infill_examples(text, split, n, **kwargs)


def without_heldout_windows(text: str, *, sentences: int = 5, max_chars: int | None = None,
                            min_words: int = 2) -> str:
    """``text`` without every paragraph that holds a validation or test infilling window (windows of these
    settings; ``hidden`` does not change them), paragraphs joined by blank lines. A model trained on it
    has seen no held-out window; the train windows of the paragraphs kept are unchanged (for the built-in
    Shakespeare 4.5% of the text goes, and 1,067 of 1,148 train windows stay)."""
    keep = [p for p in paragraphs(text)
            if all(split_of(" ".join(w)) == "train" for w in _windows(p, sentences, max_chars, min_words))]
    return "\n\n".join(keep)


def encode_infill(example: InfillExample, tokenizer) -> tuple[list[int], list[int], list[int]]:
    """Token ids of prefix, middle and suffix, each encoded on its own (docs/method.md §5.4); ``len(middle)`` is the
    oracle length of the gap. ``tokenizer.encode`` must not add special tokens."""
    return tokenizer.encode(example.prefix), tokenizer.encode(example.middle), tokenizer.encode(example.suffix)


def write_jsonl(records: Iterable, path: str | Path) -> int:
    """Write examples (anything with ``to_dict``) or dicts as JSONL; returns the number written."""
    count = 0
    with Path(path).open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r.to_dict() if hasattr(r, "to_dict") else r, ensure_ascii=False) + "\n")
            count += 1
    return count
