"""The evaluation wing (docs/evaluation.md): what to measure (:class:`TaskSpec`), the task registry
(:data:`REGISTRY` of :class:`Task`), the examples of a task (:func:`task_examples`), and checkpoints by path
(:func:`evaluate_checkpoint`, :func:`bench_checkpoints`), behind ``setdlm eval`` and ``setdlm bench``.

One concept per module:

* :mod:`~setdlm.evaluation.registry` — the :class:`Task` record and :data:`REGISTRY`;
* :mod:`~setdlm.evaluation.spec` — :class:`TaskSpec`, checked against its task's entry;
* :mod:`~setdlm.evaluation.likelihood`, :mod:`~setdlm.evaluation.reasoning`, :mod:`~setdlm.evaluation.infill`,
  :mod:`~setdlm.evaluation.parallel` — one task each, registered by its own file (the estimator
  ``likelihood``, ``reasoning``, ``infill``, ``parallel`` and their ``*_steps`` live there);
* :mod:`~setdlm.evaluation.passes` — the decoding passes the tasks share, how one runs (:class:`EvalRun`) and
  ``interleave``; :mod:`~setdlm.evaluation.throughput` — decoding speed the paper's way;
* :mod:`~setdlm.evaluation.metrics` — exact match, ROUGE, likelihood and throughput summaries, AUP;
* :mod:`~setdlm.evaluation.sweeps` and :mod:`~setdlm.evaluation.reports` — ``setdlm bench``'s sweeps
  (:class:`BenchSpec`), and its table, plot and JSON;
* :mod:`~setdlm.evaluation.examples` and :mod:`~setdlm.evaluation.runs` — examples that fit, and checkpoints
  by path;
* :mod:`~setdlm.evaluation.harness` — the lm-evaluation-harness adapter (``python -m setdlm.evaluation.harness``;
  not imported here: it needs ``lm_eval``).

Nothing here imports the training code: a run's held-out rows are rebuilt from its recorded arguments
(:func:`heldout_rows`).
"""

from .registry import REGISTRY, Task, get_task, register
from .spec import TaskSpec
from . import likelihood, reasoning, infill, parallel  # noqa: F401  (each registers its task, in this order)
from .examples import task_examples, write_predictions
from .likelihood import checkpoint_likelihood, heldout_rows, training_args
from .passes import EvalRun
from .sweeps import BenchSpec
from .runs import BenchRun, LoadOptions, bench_checkpoints, evaluate_checkpoint, labels

__all__ = ["TaskSpec", "Task", "REGISTRY", "get_task", "register", "task_examples", "write_predictions",
           "checkpoint_likelihood", "heldout_rows", "training_args", "evaluate_checkpoint", "bench_checkpoints",
           "BenchRun", "labels", "EvalRun", "BenchSpec", "LoadOptions"]
