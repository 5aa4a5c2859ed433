"""Models on disk and on the Hub: every format setdlm reads or writes (docs/architecture.md).

* :mod:`~setdlm.formats.loading` — ``setdlm.load``: one front door, a name resolved to a folder and its reader
* :mod:`~setdlm.formats.checkpoint` — setdlm checkpoint folders, written atomically, checked when read
* :mod:`~setdlm.formats.pretrained` — the shipped models by name
* :mod:`~setdlm.formats.hub` — Hugging Face Hub downloads (only when a Hub name is asked for)
* :mod:`~setdlm.formats.hf` — Hugging Face causal LMs as backbones
* :mod:`~setdlm.formats.convert` — the paper authors' checkpoint layout
* :mod:`~setdlm.formats.gguf`, :mod:`~setdlm.formats.gguf_quant` — GGUF files, their quantized tensors
* :mod:`~setdlm.formats.quantize` — int8/int4 backbones built at load time
"""
