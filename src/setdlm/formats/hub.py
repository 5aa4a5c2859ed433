"""The Hugging Face Hub as an optional extra (``pip install 'setdlm[hf]'``): load a checkpoint by repo id,
push a checkpoint folder (docs/method.md §9.3; the checkpoint layout of
:mod:`setdlm.formats.checkpoint`).

* :func:`snapshot` — a Hub id → a local folder in the Hugging Face cache. With network it downloads (only
  what loading needs: no optimizer state, no code); offline (``HF_HUB_OFFLINE=1`` or the Hub unreachable)
  a repo already in the cache still resolves, otherwise :class:`HubUnreachableError` says that
  a Hub id needs network access or a local path.
* :func:`push_folder` — upload a checkpoint folder (``setdlm.formats.checkpoint.save(..., push_to_hub="user/repo")``
  and ``Model.save(..., push_to_hub=...)`` call it).
* :func:`hub_reachable`, :func:`is_connection_failure`, :class:`HubUnreachableError` — the network checks
  every Hub access shares (here, :func:`snapshot`, :func:`setdlm.formats.hf.load_pretrained`, the authors' base models).

``huggingface_hub`` is imported inside the functions; everything else in setdlm works without it.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import UserError

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
# files a checkpoint needs to load: not the optimizer state, not the authors' Python sources
_IGNORE = ["optimizer.safetensors", "training_state.json", "*.py", "*.pt", "*.ckpt", "*.msgpack", "*.h5"]
_TOKENIZER = ["tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab*", "merges.txt", "*.model",
              "chat_template*"]
_SETDLM = ["config.json", "model.safetensors", "README.md", *_TOKENIZER]
_REFERENCE = ["config.json", "*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin",
              "pytorch_model.bin.index.json", *_TOKENIZER]


# ---------------------------------------------------------------------------------------------------------
# network: is the Hub reachable, and did a failure come from the network
# ---------------------------------------------------------------------------------------------------------


class HubUnreachableError(ConnectionError, ValueError):
    """A Hub id was given but the Hugging Face Hub cannot be reached (and the files are not cached). A
    ValueError too: the input cannot be used as given (the CLI reports it in one line)."""


def hub_reachable(timeout: float = 3.0) -> bool:
    """False in offline mode (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``) or when a TCP connection to the
    Hub endpoint fails; True when it succeeds or a proxy is configured (then transformers finds out itself)."""
    from huggingface_hub import constants

    flags = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    if constants.HF_HUB_OFFLINE or any(f and f.upper() in ("1", "ON", "YES", "TRUE") for f in flags):
        return False
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY")):
        return True
    url = urlsplit(os.environ.get("HF_ENDPOINT") or constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def is_connection_failure(e: BaseException | None) -> bool:
    """Does the exception chain say that the Hub could not be reached (as opposed to, e.g., no such repo)?"""
    while e is not None:
        if isinstance(e, (ConnectionError, TimeoutError, socket.gaierror)) or type(e).__name__ in (
                "LocalEntryNotFoundError", "ConnectError", "ConnectTimeout", "OfflineModeIsEnabled"):
            return True
        e = e.__cause__ or e.__context__
    return False


def is_hub_id(name: str) -> bool:
    """``owner/name`` (one slash, no path-like prefix): what the Hub calls a repo id."""
    return bool(_HUB_ID.match(name)) and not name.startswith((".", "~"))


def _hub():
    try:
        import huggingface_hub
    except ImportError:
        raise UserError("Hugging Face Hub ids need huggingface_hub: pip install 'setdlm[hf]'") from None
    return huggingface_hub


def snapshot(repo_id: str, *, revision: str | None = None, cache_dir: str | None = None,
             allow_patterns: Sequence[str] | None = None) -> Path:
    """The local folder of Hub repo ``repo_id`` (downloaded into the HF cache when the Hub is reachable)."""
    hub = _hub()
    offline = not hub_reachable()
    try:
        folder = hub.snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, local_files_only=offline,
                                       allow_patterns=list(allow_patterns) if allow_patterns else None,
                                       ignore_patterns=None if allow_patterns else _IGNORE)
    except Exception as e:  # huggingface_hub raises its own error types
        if offline or is_connection_failure(e):
            raise HubUnreachableError(
                f"{repo_id!r} is not a local folder and the Hugging Face Hub cannot be reached: loading a Hub id "
                f"needs network access; otherwise pass the path of a local folder (e.g. made elsewhere with "
                f"`hf download {repo_id} --local-dir DIR`)") from e
        raise UserError(f"cannot download {repo_id!r} from the Hugging Face Hub: {str(e).splitlines()[0]}") from e
    return Path(folder)


def snapshot_checkpoint(repo_id: str, *, revision: str | None = None, ema: bool = False) -> Path:
    """The local folder of a Hub repo holding a setdlm checkpoint or one in the authors' layout, with only
    the files loading needs (config.json first, to tell which). Other repos (e.g. a transformers model)
    come back with their config.json alone."""
    folder = snapshot(repo_id, revision=revision, allow_patterns=["config.json"])
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return folder  # the loader reports what is missing or broken
    if not isinstance(cfg, dict):
        return folder
    if cfg.get("format") == "setdlm":
        patterns = _SETDLM + (["ema.safetensors"] if ema else [])
    elif any(k in cfg for k in ("backbone_config", "backbone_config_passed", "noise_config", "setdlm")):
        patterns = _REFERENCE
    else:
        return folder
    return snapshot(repo_id, revision=revision, allow_patterns=patterns)


def push_folder(folder: str | Path, repo_id: str, *, private: bool | None = None, token: str | None = None,
                commit_message: str | None = None) -> str:
    """Upload checkpoint ``folder`` to Hub repo ``repo_id`` (created if missing); returns the commit URL.
    The optimizer state and training state are left out (they only serve resuming)."""
    if not is_hub_id(repo_id):
        raise UserError(f"push_to_hub needs a Hub repo id 'user/name', got {repo_id!r}")
    hub = _hub()
    if not hub_reachable():
        raise HubUnreachableError(f"pushing to {repo_id!r} needs network access to the Hugging Face Hub; the "
                                  f"checkpoint is saved locally at {str(folder)!r} (upload it later with "
                                  f"`hf upload {repo_id} {folder}`)")
    api = hub.HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    info = api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model",
                             commit_message=commit_message or "Upload setdlm checkpoint",
                             ignore_patterns=["optimizer.safetensors", "training_state.json", ".*"])
    return str(getattr(info, "commit_url", info))
