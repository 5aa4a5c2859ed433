"""Only bad input is a one-line error: the library raises :class:`setdlm.errors.UserError` where it detects
it and ``setdlm`` prints it as one line with its field names spelled as flags (exit 2); any other exception
is a bug and shows its traceback (docs/errors.md)."""

import subprocess
import sys
from pathlib import Path

import pytest

import setdlm
from setdlm.cli.command import run as run_command
from setdlm.errors import UserError, as_flags

from support import assert_one_line_error, run, subprocess_env


def _child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(),
                          timeout=120)


# a bug inside a command: the schedule's constructor breaks with an exception that is not bad input
_BUG = """
import sys
import setdlm.schedules as s
from setdlm.cli import main

def broken(*args, **kwargs):
    raise {exc}("internal bug: 'NoneType' object is not subscriptable")

s.StaggeredSchedule.from_dm = broken
sys.exit(main(["schedule", "--L", "64", "--D", "4"]))
"""


@pytest.mark.parametrize("exc", ["TypeError", "ValueError", "KeyError"])
def test_an_internal_error_shows_its_traceback(exc):
    proc = _child(_BUG.format(exc=exc))
    assert proc.returncode not in (0, 2), proc.stderr
    assert "Traceback (most recent call last)" in proc.stderr and f"{exc}: " in proc.stderr
    assert "internal bug" in proc.stderr and "setdlm schedule: error:" not in proc.stderr


def test_a_bad_flag_value_stays_one_line(capsys):
    code, _, err = run(["generate", "--prompt", "a", "--top-p", "0"], capsys)
    assert_one_line_error(code, err, "--top-p must lie in (0, 1], got 0.0")
    code, _, err = run(["schedule", "--L", "64", "--D", "0"], capsys)
    assert_one_line_error(code, err, "D")
    proc = _child("import sys; from setdlm.cli import main; sys.exit(main(['generate', '--prompt', 'a', '--top-k', '-1']))")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "setdlm generate: error: --top-k must be an integer >= 0 (0 = off), got -1"]


def test_run_turns_only_user_errors_into_exit_2(capsys):
    def raise_(e):
        def call():
            raise e
        return call

    assert run_command("eval", raise_(UserError("n must be a positive integer, got 0", fields=("n",))), str) == 2
    assert capsys.readouterr().err == "setdlm eval: error: --n must be a positive integer, got 0\n"
    assert run_command("eval", raise_(FileNotFoundError(2, "No such file or directory", "x.txt")), str) == 2
    assert capsys.readouterr().err == "setdlm eval: error: x.txt: No such file or directory\n"
    for e in (TypeError("bug"), ValueError("bug"), RuntimeError("bug")):
        with pytest.raises(type(e)):
            run_command("eval", raise_(e), str)
    assert issubclass(UserError, ValueError)  # `except ValueError` callers keep catching it


def test_field_names_become_flags_as_whole_words_only():
    e = UserError("max_new_tokens applies to task reasoning/parallel, not infill; data data.txt has no n_max",
                  fields=("max_new_tokens", "task", "data", "n"))
    assert as_flags(e) == ("--max-new-tokens applies to --task reasoning/parallel, not infill; --data data.txt has "
                           "no n_max")
    assert as_flags(UserError("plain words", fields=())) == "plain words"
    assert str(e).startswith("max_new_tokens applies to task")  # Python callers read the library's words

    # a value with a flag of its own (the CLI's VALUE_FLAGS) is spelled as that flag, other values as --name value
    spec = UserError("speculate='next_token' needs a head; speculate='x' does not exist; use speculate=True",
                     fields=("speculate",))
    assert as_flags(spec, {"speculate": ("next_token",)}) == ("--speculate-next-token needs a head; --speculate x does "
                                                             "not exist; use --speculate")


SRC = Path(setdlm.__file__).resolve().parent
# modules whose deliberate `raise ValueError` stays: internal invariants (a bug if it fires, so a traceback),
# and those that other changes are rewriting (PENDING: the lead converts them when those land)
PLAIN_VALUE_ERRORS = {
    "model.py": "the KV cache's invariants (crop length, rows, key columns)",
    "batch.py": "the batch tensors' shared shape", "data/dataset.py": "the dataset tensors' shared shape",
    "decoding/state.py": "the decoder state's canvas and joins",
    "mask_rules.py": "a mask rule's kind and set ids agreeing (built by the library, not the caller)",
}


def test_bad_input_is_raised_as_user_error():
    """Where the library detects bad input it raises UserError, so that the command line shows it as one line
    and a bug still shows its traceback: a plain ``raise ValueError(`` only where PLAIN_VALUE_ERRORS says."""
    found = {}
    for p in SRC.rglob("*.py"):
        rel = p.relative_to(SRC).as_posix()
        n = p.read_text(encoding="utf-8").count("raise ValueError(")
        if n and rel not in PLAIN_VALUE_ERRORS:
            found[rel] = n
    assert not found, f"raise UserError for bad input (setdlm.errors), not ValueError: {found}"


def test_a_switch_given_as_true_is_its_flag():
    e = UserError("out 'r' already holds a training run; pass resume=True or choose another folder",
                  fields=("out", "resume"))
    assert as_flags(e) == "--out 'r' already holds a training run; pass --resume or choose another folder"


# flags of other programs that a message may quote (torchrun's, the Hugging Face CLI's)
OTHER_PROGRAMS_FLAGS = {"--nproc-per-node", "--local-dir"}


def test_training_and_format_errors_name_arguments_not_flags():
    """The library's messages name the argument (``steps``, ``resume=True``) and list it in ``fields``; the
    command line spells it as a flag (``as_flags``), so no message of the library hard-codes a flag."""
    import ast
    import re

    found = []
    for folder in ("training", "formats"):
        for p in (SRC / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("UserError", "check_fits"):
                    words = " ".join(c.value for a in node.args for c in ast.walk(a)
                                     if isinstance(c, ast.Constant) and isinstance(c.value, str))
                    found += [(p.name, f) for f in re.findall(r"--[a-z][\w-]*", words)
                              if f not in OTHER_PROGRAMS_FLAGS]
    assert not found, found
