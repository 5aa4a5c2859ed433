"""A training run that stops after its checkpoint of step ``GATE_STEP`` and waits there to be killed: the gate of
the SIGKILL-then-resume tests (no clock, no polling).

The run is ``python -m setdlm.training`` with the training loop's ``save`` wrapped: after the checkpoint of step
``GATE_STEP`` (or later), rank 0 writes to the fifo ``GATE_READY``, then every rank blocks reading the fifo
``GATE_HOLD``, which nobody writes, until the test kills the run."""

import os
import subprocess
import threading
from pathlib import Path

SCRIPT = """import os, runpy
import setdlm.training.loop as loop
real = loop.save
def gated(state, *a, **k):
    path = real(state, *a, **k)
    if state.step >= int(os.environ["GATE_STEP"]):
        if os.environ.get("RANK", "0") == "0":
            with open(os.environ["GATE_READY"], "w") as f:
                f.write("saved")
        open(os.environ["GATE_HOLD"]).read()
    return path
loop.save = gated
runpy.run_module("setdlm.training", run_name="__main__")
"""


def gated_run(folder: Path, step: int) -> tuple[Path, dict[str, str], threading.Event]:
    """``(script, env, saved)``: run ``script`` in place of ``-m setdlm.training`` with ``env`` added to its
    environment; ``saved`` is set once the checkpoint of ``step`` is on disk (the run then waits to be killed)."""
    script, ready, hold = folder / "gated_run.py", folder / "gate_ready", folder / "gate_hold"
    script.write_text(SCRIPT)
    os.mkfifo(ready)
    os.mkfifo(hold)
    saved = threading.Event()
    threading.Thread(target=lambda: (ready.read_text(), saved.set()), daemon=True).start()
    return script, {"GATE_READY": str(ready), "GATE_HOLD": str(hold), "GATE_STEP": str(step)}, saved


def reached(proc: subprocess.Popen, saved: threading.Event, step: int, timeout: float = 600) -> None:
    """Wait until the gated run ``proc`` has saved its checkpoint of ``step`` and holds at the gate. A run that
    exits first (a crash, or one that never reaches the gate) fails the test at once, with its exit code, not after
    the hang guard's ``timeout``."""
    threading.Thread(target=lambda: (proc.wait(), saved.set()), daemon=True).start()
    assert saved.wait(timeout), f"the run never reached its step-{step} checkpoint (hang guard)"
    assert proc.poll() is None, f"the run exited with code {proc.returncode} before its step-{step} checkpoint"
