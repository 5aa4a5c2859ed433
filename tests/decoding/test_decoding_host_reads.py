"""Host reads of device tensors during decoding (docs/decoding.md, "CUDA graphs": each is a sync on a GPU).
Counted on the CPU by wrapping the Tensor methods that read a value back (``tolist``, ``item``, ``int()``,
``bool()``, ``float()``, ``index``): a decode step reads a fixed handful, none per row, and the SetDLM step
reads the same with the threshold off as with it on (benchmarks/RESULTS.md, "the threshold-off anomaly")."""

import contextlib
import sys

import pytest
import torch

from support import PROMPTS, tiny_model
from setdlm.decoding import generate

READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__")


@contextlib.contextmanager
def counting():
    """Count host reads outside ``DecodeState._record`` (which turns a finished row into Python lists once)."""
    count = [0]
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def wrap(fn):
        def read(self, *a, **k):
            f = sys._getframe(1)
            while f is not None and f.f_code.co_name != "_record":
                f = f.f_back
            count[0] += f is None
            return fn(self, *a, **k)
        return read

    for name, fn in originals.items():
        setattr(torch.Tensor, name, wrap(fn))
    try:
        yield count
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


def _reads(model, prompts, **kw) -> tuple[int, int]:
    with counting() as n:
        out = generate(model, prompts, max_new_tokens=12, ignore_eos=True, **kw)
    return n[0], out.nfe


@pytest.mark.parametrize("family,fam,kw", [("ar", {}, {}), ("bd3lm", {}, {}), ("setdlm", {"D": 3}, {}),
                                           ("setdlm", {"D": 3}, {"threshold": 0.3})])
def test_reads_per_step_do_not_grow_with_the_batch(family, fam, kw):
    model = tiny_model(family, **fam)
    one, nfe1 = _reads(model, [PROMPTS[1]], **kw)
    three, nfe3 = _reads(model, [PROMPTS[1]] * 3, **kw)  # the same row thrice: the same steps
    assert nfe1 == nfe3 and one == three
    assert one <= 5 * nfe1 + 10  # a fixed handful per step (cache width, step shape, finished rows) + set-up


def test_threshold_off_reads_what_threshold_on_reads():
    model = tiny_model("setdlm", D=3)
    off, nfe_off = _reads(model, PROMPTS, window=3)
    on, nfe_on = _reads(model, PROMPTS, window=3, threshold=0.999)  # no extra commits at this model's confidences
    assert nfe_off == nfe_on and off == on
