"""Evaluation orchestration: what to measure (:class:`TaskSpec`), on which examples
(:func:`task_examples`), and checkpoints by path (:func:`evaluate_checkpoint`, :func:`bench_checkpoints`),
behind ``setdlm eval`` and ``setdlm bench`` (docs/evaluation.md).

The measurements themselves are :mod:`setdlm.evaluate` (likelihood, reasoning, infilling, the parallel
suite) and the sweeps and reports :mod:`setdlm.bench`. Nothing here imports the training code: a run's
held-out rows are rebuilt from its recorded arguments (:func:`heldout_rows`).
"""

from .examples import task_examples, write_predictions
from .likelihood import checkpoint_likelihood, heldout_rows, training_args
from .runs import BenchRun, bench_checkpoints, evaluate_checkpoint, labels
from .spec import DECODING_TASKS, TASKS, TaskSpec

__all__ = ["TaskSpec", "TASKS", "DECODING_TASKS", "task_examples", "write_predictions", "checkpoint_likelihood",
           "heldout_rows", "training_args", "evaluate_checkpoint", "bench_checkpoints", "BenchRun", "labels"]
