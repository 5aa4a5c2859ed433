"""Shared test helpers, in one place: test files write ``from support import ...``; ``conftest.py`` holds only
fixtures built on these.

* ``tokenizers``        — the decoding vocabulary (``V``, ``PAD``/``BOS``/``EOS``/``MASK``, ``PROMPTS``) and its
  ``CharTokenizer``; ``task_tokenizer`` (reasoning tasks); ``tiny_tokenizer`` (word-level, Hugging Face);
* ``models``            — tiny random models: ``make_model`` (our backbone), ``tiny_model`` (a family over the
  decoding vocabulary), ``tiny`` (a family over a given tokenizer), ``save_tiny`` (a checkpoint for the CLI),
  ``tiny_hf`` (a transformers causal LM);
* ``recording``         — the real backbone wrapped: ``recorded``, ``scripted``, ``Counting``, ``SlowStart``,
  ``gated`` (forwards run when the test allows), ``failing`` (forwards that raise when the test asks) and
  ``committed_only_by`` (a token only one row's decode commits, to make that row's steps fail);
* ``references``        — from-scratch checks of a traced decode (logits and cache per step); ``session_results``
  (a session stepped to its end);
* ``cli``               — ``run`` (``setdlm ARGS`` in-process), ``assert_one_line_error``, ``subprocess_env``,
  ``write_hamlet``, ``png_size``;
* ``serving``           — a real server on a free loopback port (events: listening, closed), and ``Output``:
  a ``setdlm serve`` subprocess's output read line by line (an event when it listens);
* ``backbone_contract`` — the cache contract every backbone passes (our DiT and the Hugging Face adapter),
  imported as ``support.backbone_contract``;
* ``toy_task``          — a task added in one file, as docs/evaluation.md shows (imported as ``support.toy_task``:
  importing it registers ``toy``, so only tests/test_task_registry.py imports it, and unregisters it after);
* ``reference_sources`` — the authors' reference fixture reached every way a user reaches it (imported as
  ``support.reference_sources``: it needs ``safetensors`` and ``tokenizers``).

Optional dependencies (transformers, uvicorn) are imported inside the helpers that need them.
"""

from .cli import SRC, assert_one_line_error, png_size, run, study_script, subprocess_env, write_hamlet
from .models import FAMILY_KW, make_model, save_tiny, tiny, tiny_hf, tiny_model
from .recording import (Call, Counting, Failing, Gated, Recorder, Scripted, SlowStart, committed_only_by, failing,
                        gated, recorded, scripted)
from .references import (active_rows, assert_bd3lm_steps_exact, assert_cache_clean, assert_setdlm_steps_exact,
                         left_to_right_setdlm, session_results, setdlm_training_logits, step_logits)
from .serving import Output, free_port, openai_client, post_json, running
from .tokenizers import BOS, EOS, MASK, PAD, PROMPTS, V, CharTokenizer, task_tokenizer, tiny_tokenizer
