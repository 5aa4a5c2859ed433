"""Shared fixtures, built on the helpers in ``support`` (tiny random models on CPU, float64 where exactness is
asserted). Helpers are imported from ``support``, never from this file."""

import pytest
import torch

from support import make_model

torch.set_num_threads(1)  # tiny models: one thread is fastest and steadiest


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from a second thread, and lose a lot when other work shares the cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def model64():
    return make_model()


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """Offline mode, an empty HF cache (also the default cache), no proxies."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    try:  # huggingface_hub read the variable at import: point its default cache there too
        from huggingface_hub import constants
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    except ImportError:
        pass
    for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.delenv(v, raising=False)
    return tmp_path / "empty-cache"
