"""Constraint compilation is bounded (docs/decoding.md "Bounds"): a repetition past what ``max_tokens`` can hold
costs nothing, and a constraint past the time, memory or size bound is a one-line UserError naming its field
while the caller's process lives on; the automaton cache is bounded by bytes; a schema nested 300 levels is
refused, never a RecursionError. And the habits of users: ``^...$`` anchors, a choice that is a prefix of
another."""

import re

import pytest

pytest.importorskip("outlines_core")

from setdlm.data.tokenizers import char_tokenizer  # noqa: E402
from setdlm.decoding import generate  # noqa: E402
from setdlm.decoding.structured import constraint as C  # noqa: E402
from setdlm.errors import UserError  # noqa: E402

from support import tiny  # noqa: E402

CHAR = char_tokenizer(["abcdefghijklmnopqrstuvwxyz0123456789 {}[]\":,.-_"])


@pytest.fixture
def bounds():
    """Set the module's bounds for a test, restored after it."""
    old = C.DEFAULT_COMPILER.bounds
    yield C.set_bounds
    C.set_bounds(**{f: getattr(old, f) for f in ("seconds", "memory", "edges", "cache_bytes", "workers")})


def test_a_repetition_past_what_max_tokens_holds_costs_nothing():
    auto = C.automaton(C.regex(".{0,100000}"), CHAR, 12)  # one character a token: .{0,13}
    assert auto.states <= 14
    model = tiny("setdlm", CHAR, L=64, seed=0)
    out = generate(model, ["a", "b"], max_new_tokens=12, constraint=C.regex("[a-c]{0,100000}x"), threshold=0.3)
    assert all(re.fullmatch("[a-c]{0,11}x", t) for t in out.texts), out.texts
    assert C.cut_repetitions(r"a{3,100000}[{]\{9999}(b{7}){2,}", 10) == r"a{3,11}[{]\{9999}(b{7}){2,}"


def test_compilation_past_the_size_time_or_memory_bound_is_refused_and_the_caller_lives(bounds):
    bounds(edges=2000)
    with pytest.raises(UserError, match=r"regex: compiling regex\('\[ab\]\*a\[ab\]\{12\}'\) exceeds the size bound") as e:
        C.automaton(C.regex("[ab]*a[ab]{12}"), CHAR, 20)  # 2**12 states
    assert e.value.fields == ("regex",)
    bounds(edges=20_000_000, seconds=0.3)
    with pytest.raises(UserError, match="bound"):
        C.automaton(C.regex("[ab]*a[ab]{26}"), CHAR, 40)  # 2**26 states: past 0.3 s (or the memory) on any machine
    bounds(seconds=60, memory=150 << 20)
    with pytest.raises(UserError, match=r"outgrew the memory bound \(150 MiB\)"):
        C.automaton(C.regex(".{0,100000}"), CHAR)  # no max_tokens: 100,000 states
    assert C.automaton(C.regex("[ab]{3}"), CHAR, 5).states == 4  # a fresh compiler answers


def test_the_cache_is_bounded_by_bytes(bounds):
    one = C.automaton(C.regex("[a-z]{5}"), CHAR, 8)
    bounds(cache_bytes=3 * one.nbytes)
    for n in range(6, 12):
        C.automaton(C.regex(f"[a-z]{{{n}}}"), CHAR, 12)
        assert C.DEFAULT_COMPILER.cached_bytes() <= 3 * one.nbytes
    assert C.automaton(C.regex("[a-z]{11}"), CHAR, 12) is C.automaton(C.regex("[a-z]{11}"), CHAR, 12)


def test_a_schema_nested_300_levels_is_refused_in_one_line():
    schema = {"type": "string"}
    for _ in range(300):
        schema = {"type": "array", "items": schema}
    with pytest.raises(UserError, match="nested more than 64 levels"):
        C.json_schema(schema)


def test_anchors_are_dropped_and_a_choice_may_be_a_prefix_of_another():
    assert C.regex("^[ab]+$").pattern == "[ab]+" and C.regex(r"a\$").pattern == r"a\$"
    model = tiny("setdlm", CHAR, L=64, seed=1)
    out = generate(model, ["a", "b"], max_new_tokens=6, constraint=C.regex("^[ab]+-[0-9]$"), threshold=0.3)
    assert all(re.fullmatch("[ab]+-[0-9]", t) for t in out.texts), out.texts
    # exactly 7 tokens: only "yes sir" fits (it could never be written after "yes" matched)
    out = generate(model, ["a"], max_new_tokens=7, ignore_eos=True, constraint=C.choice(["yes", "yes sir"]))
    assert out.texts == ["yes sir"]


@pytest.mark.parametrize("pattern, what", [("a\\p{L", "property"), ("a[bc", "character class")])
def test_an_unclosed_class_or_property_is_one_error_not_a_hang(pattern, what):
    """``\\p{`` without its ``}`` sent the pattern walk back to the start, forever (the server's thread with it)."""
    with pytest.raises(UserError, match=f"unclosed {what}"):
        C.automaton(C.regex(pattern), CHAR, 8)


def test_two_compilers_in_one_process_keep_their_own_bounds_and_caches():
    """The bounds and the cache belong to a ConstraintCompiler (a session's, a server's, the library's default):
    one that allows 2,000 token transitions refuses what another compiles, the default is left as it was, and a
    session compiles its rows with its own."""
    from setdlm.decoding.session import Session

    small, big = C.ConstraintCompiler(C.Bounds(edges=2000)), C.ConstraintCompiler()
    wide = C.regex("[ab]*a[ab]{12}")  # 2**12 states
    with pytest.raises(UserError, match="exceeds the size bound"):
        small.automaton(wide, CHAR, 20)
    assert big.automaton(wide, CHAR, 20).states > 2000 and small.cached_bytes() == 0 < big.cached_bytes()
    assert C.DEFAULT_COMPILER.bounds.edges == C.Bounds().edges
    with pytest.raises(UserError, match="edges must be a positive number"):
        C.ConstraintCompiler(C.Bounds(edges=0))
    model = tiny("setdlm", CHAR, L=64, seed=0)
    with pytest.raises(UserError, match="exceeds the size bound"):
        Session(model, compiler=small).add("a", max_new_tokens=20, constraint=wide)
    s = Session(model, compiler=big)
    s.add("a", max_new_tokens=20, constraint=wide, threshold=0.3)
    while s.rows:
        s.step()
