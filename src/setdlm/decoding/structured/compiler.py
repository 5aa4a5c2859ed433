"""Compiling a constraint's regular expression to a token automaton apart from the caller, bounded
(docs/decoding.md "Bounds"): :class:`Compiler` keeps processes running :mod:`setdlm.decoding.structured.worker`
and kills one past its time; :func:`cut_repetitions` cuts counted repetitions to what the output can
hold; :func:`without_end_mark` takes the end mark out of a pattern's classes. The bounds themselves and
the cache are :mod:`setdlm.decoding.structured.constraint`'s."""

from __future__ import annotations

import atexit
import os
import pickle
import re
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO

from ...errors import UserError


def cut_repetitions(pattern: str, max_bytes: int) -> str:
    """``pattern`` with every counted repetition ``{m}``, ``{m,}``, ``{m,n}`` cut to at most
    ``max_bytes + 1`` repeats: the same words of at most ``max_bytes`` bytes (an iteration reads a byte or
    more, or it reads nothing and more of them change nothing), so a bound far past what the output can
    hold costs nothing. Escapes and character classes are left as they are."""
    cap = max_bytes + 1
    out, i, depth, n = [], 0, 0, len(pattern)  # depth: nesting of [...] character classes
    while i < n:
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if c == "[":
            depth += 1
            if pattern[i + 1:i + 2] == "^":
                out.append("[^")
                i += 2
                if pattern[i:i + 1] == "]":  # a leading ] is literal
                    out.append("]")
                    i += 1
                continue
            if pattern[i + 1:i + 2] == "]" and depth == 1:
                out.append("[]")
                i += 2
                continue
        elif c == "]" and depth:
            depth -= 1
        elif c == "{" and not depth:
            close = pattern.find("}", i)
            body = pattern[i + 1:close] if close > 0 else ""
            parts = body.split(",")
            counts = len(parts) in (1, 2) and parts[0].isdigit()
            if counts and (len(parts) == 1 or parts[1] == "" or parts[1].isdigit()):
                lo = min(int(parts[0]), cap)
                if len(parts) == 1:
                    out.append(f"{{{lo}}}")
                elif parts[1] == "":
                    out.append(f"{{{lo},}}")
                else:
                    out.append(f"{{{lo},{max(lo, min(int(parts[1]), cap))}}}")
                i = close + 1
                continue
        out.append(c)
        i += 1
    return "".join(out)


def class_end(pattern: str, i: int) -> int | None:
    """One past the ``]`` closing the character class that opens at ``pattern[i]`` (nested classes and
    escapes skipped, a leading ``]`` literal); None when it is not closed."""
    j, depth = i + 1 + (pattern[i + 1:i + 2] == "^"), 1
    j += pattern[j:j + 1] == "]"
    while j < len(pattern) and depth:
        if pattern[j] == "\\":
            j += 2
            continue
        depth += {"[": 1, "]": -1}.get(pattern[j], 0)
        j += 1
    return None if depth else j


_FLAGS = re.compile(r"\(\?([a-zA-Z-]*)[:)]")  # (?flags) and (?flags:...)


def regex_atoms(pattern: str) -> Iterator[tuple[int, str | None]]:
    """``(start, atom)`` for each atom of ``pattern`` in order: an escape (``\\p{...}`` whole), a character
    class ``[...]`` whole, or one character; ``atom`` is None where a class or a ``\\p{`` is not closed (and
    the walk stops there)."""
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            j = i + 2
            if pattern[i + 1:i + 2] in ("p", "P"):
                j = pattern.find("}", i) + 1 if pattern[i + 2:i + 3] == "{" else i + 3
                if j == 0:
                    yield i, None
                    return
        elif c == "[":
            end = class_end(pattern, i)
            if end is None:
                yield i, None
                return
            j = end
        else:
            j = i + 1
        yield i, pattern[i:j]
        i = j


def without_end_mark(pattern: str, where: str) -> str:
    """``pattern`` with U+FFFF (the end mark of :mod:`setdlm.decoding.structured.worker`) taken out of every
    class: ``.``, ``[...]`` and ``\\D \\W \\S \\p \\P`` each intersected with ``[^\\x{FFFF}]``."""
    out = []
    for i, atom in regex_atoms(pattern):
        if atom is None:
            what = "character class" if pattern[i] == "[" else "property \\p{...}"
            raise UserError(f"{where}: an unclosed {what} in {pattern!r}", fields=(where,))
        if atom[0] == "[" or atom[:2] in ("\\p", "\\P", "\\D", "\\W", "\\S"):
            out.append(f"[{atom}&&[^\\x{{FFFF}}]]")
        elif atom == ".":
            out.append("[^\\n\\x{FFFF}]")
        elif atom == "(" and (m := _FLAGS.match(pattern, i)) and "s" in m.group(1).split("-")[0]:
            raise UserError(f"{where}: the flag s (. matching a newline) is not supported; write [\\s\\S] for it",
                            fields=(where,))
        elif atom == "\uffff":
            raise UserError(f"{where}: the noncharacter U+FFFF is not allowed in a constraint", fields=(where,))
        else:
            out.append(atom)
    return "".join(out)


@dataclass
class _Process:
    """One compiling process: its pipes, its memory bound and the vocabularies it holds (the last two digests)."""

    popen: subprocess.Popen[bytes]
    stdin: IO[bytes]
    stdout: IO[bytes]
    memory: int
    seen: list[str] = field(default_factory=list)


class Compiler:
    """Processes running :mod:`setdlm.decoding.structured.worker`, at most ``bounds.workers`` at once; one
    that passes its time is killed, one that outgrows its memory dies alone. :meth:`run` replies as the worker
    does, or ``("bound", message, which)``: ``which`` the bound passed, ``"seconds"`` or ``"memory"``, or
    ``"wait"`` (no compiler was free in time: the load's doing, not the pattern's)."""

    def __init__(self) -> None:
        self._idle: list[_Process] = []
        self._lock = threading.Lock()
        self._busy = 0
        self._free = threading.Condition(self._lock)
        atexit.register(self.close)

    def run(self, digest: str, pieces, pattern: str, seconds: float, bounds) -> tuple:
        if seconds <= 0:
            return ("bound", "waited past its time bound for a free compiler", "wait")
        deadline = time.monotonic() + seconds
        with self._free:
            while self._busy >= bounds.workers:
                left = deadline - time.monotonic()
                if left <= 0 or not self._free.wait(left):
                    return ("bound", f"waited {seconds:g} s for a free compiler (time bound)", "wait")
            self._busy += 1
            proc = self._idle.pop() if self._idle else None
        try:
            if proc is not None and (proc.popen.poll() is not None or proc.memory != bounds.memory):  # gone, stale
                self._retire(proc)
                proc = None
            if proc is None:
                proc = self._spawn(bounds.memory)
            reply = self._ask(proc, (digest, None if digest in proc.seen else pieces, pattern, bounds.edges),
                              deadline, seconds, bounds.memory)
            if reply[0] == "error" and reply[1] == "vocabulary":
                reply = self._ask(proc, (digest, pieces, pattern, bounds.edges), deadline, seconds, bounds.memory)
            if reply[0] != "bound":
                proc.seen = (proc.seen + [digest])[-2:]
                with self._lock:
                    self._idle.append(proc)
            return reply
        finally:
            with self._free:
                self._busy -= 1
                self._free.notify()

    def _spawn(self, memory: int) -> _Process:
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
        popen = subprocess.Popen([sys.executable, "-P", script, str(int(memory))], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        if popen.stdin is None or popen.stdout is None:  # PIPE gives both
            raise RuntimeError("the compiling process has no pipes")
        return _Process(popen, popen.stdin, popen.stdout, memory)

    def _ask(self, proc: _Process, request: tuple, deadline: float, seconds: float, memory: int) -> tuple:
        data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            proc.stdin.write(struct.pack("<Q", len(data)) + data)
            proc.stdin.flush()
            head = self._read(proc, 8, deadline)
            body = self._read(proc, struct.unpack("<Q", head)[0], deadline)
        except TimeoutError:
            proc.popen.kill()
            self._retire(proc)
            return ("bound", f"took more than the time bound ({seconds:g} s)", "seconds")
        except (EOFError, BrokenPipeError):
            self._retire(proc)
            return ("bound", f"outgrew the memory bound ({memory >> 20} MiB) and failed "
                             f"(exit {proc.popen.returncode})", "memory")
        return pickle.loads(body)

    @staticmethod
    def _read(proc: _Process, n: int, deadline: float) -> bytes:
        fd, parts, got = proc.stdout.fileno(), list[bytes](), 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, min(n - got, 1 << 20))
            if not chunk:
                raise EOFError
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for proc in idle:
            self._retire(proc)

    @staticmethod
    def _retire(proc: _Process) -> None:
        """End an idle process (its stdin closed, it exits) and wait for it."""
        try:
            proc.stdin.close()
        except OSError:
            pass
        proc.popen.wait()
        proc.stdout.close()
