"""The process that compiles a constraint's regular expression to a token automaton with outlines-core,
apart from the caller, under a memory bound (docs/decoding.md "Constrained decoding", "Bounds").

It is run as a script (``python -P worker.py MEMORY_BYTES``; it imports nothing of setdlm, only
outlines-core) by :mod:`setdlm.decoding.structured.compiler`, which kills it when the time bound passes; a
compilation that outgrows the memory bound ends in an allocation failure here, not in the caller. It
exits when its stdin closes (the caller ended it, or exited).

Protocol on stdin/stdout, each message an 8-byte little-endian length and a pickle:

* request ``(digest, pieces or None, pattern, max_edges)``: ``pieces`` (the token bytes, None for special
  tokens) is sent once per vocabulary ``digest``; ``pattern`` is the constraint's followed by the end mark
  U+FFFF (which the constraint's own words never hold): outlines-core's automaton drops the ways on from
  a match (``a(bc)?`` cannot write ``abc``), so the match is only complete at the mark, and the states
  the mark leaves are the accepting ones;
* reply ``("ok", initial, finals, edges)`` with ``edges`` the bytes of an int64 array of
  ``(source, token, destination)`` triples, or ``("error", kind, message)`` with ``kind`` one of
  ``"vocabulary"`` (a digest this process has not seen), ``"incompatible"`` (the tokens cannot spell
  the pattern), ``"invalid"`` (not a regular expression) or ``"size"`` (more than ``max_edges`` edges).
"""

import pickle
import resource
import struct
import sys
from array import array
from typing import BinaryIO

END_MARK = "\uffff".encode()  # a noncharacter no output holds: the pattern sent is (P)\x{FFFF}
Request = tuple[str, list[bytes | None] | None, str, int]  # (digest, pieces or None, pattern, max_edges)


def _read(stream: BinaryIO) -> Request | None:
    head = stream.read(8)
    if len(head) < 8:
        return None
    return pickle.loads(stream.read(struct.unpack("<Q", head)[0]))


def _write(stream: BinaryIO, obj: tuple) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _compile(oc, vocab, end: int, pattern: str, max_edges: int):
    """The automaton of ``pattern`` (which ends in the end mark, token ``end``): its accepting states are
    those the end mark leaves; the end mark's and EOS's own edges are dropped."""
    try:
        index = oc.Index(pattern, vocab)
    except ValueError as e:
        return ("error", "incompatible" if "incompatible" in str(e) else "invalid", str(e))
    except Exception as e:  # the Rust side's panics and other failures
        return ("error", "invalid", f"{type(e).__name__}: {e}")
    trans = index.get_transitions()  # {state: {token: next state}}
    if sum(len(out) for out in trans.values()) > max_edges:
        return ("error", "size", f"more than {max_edges} token transitions")
    edges, finals = array("q"), []
    for s, out in trans.items():
        for t, d in out.items():
            if t < end:
                edges.extend((s, t, d))
            elif t == end:
                finals.append(s)
    return ("ok", index.get_initial_state(), sorted(finals), edges.tobytes())


def main() -> None:
    memory = int(sys.argv[1])
    if memory > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    import outlines_core as oc

    vocabs: dict[str, tuple] = {}  # digest -> (Vocabulary, the end mark's token id); the last two kept
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while (req := _read(stdin)) is not None:
        digest, pieces, pattern, max_edges = req
        if pieces is not None:
            by_bytes: dict[bytes, list[int]] = {}
            for i, b in enumerate(pieces):
                if b:
                    by_bytes.setdefault(b, []).append(i)
            end = len(pieces)  # the end mark's token; EOS (outside the map) one past it
            by_bytes.setdefault(END_MARK, []).append(end)
            vocabs[digest] = (oc.Vocabulary(end + 1, by_bytes), end)
            while len(vocabs) > 2:
                vocabs.pop(next(iter(vocabs)))
        if digest not in vocabs:
            _write(stdout, ("error", "vocabulary", digest))
            continue
        vocab, end = vocabs[digest]
        _write(stdout, _compile(oc, vocab, end, pattern, max_edges))


if __name__ == "__main__":
    main()
