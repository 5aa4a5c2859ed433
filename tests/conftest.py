"""Shared fixtures: tiny random models on CPU (float64 where exactness is asserted)."""

import pytest
import torch

from setdlm.model import TransformerConfig, Transformer

torch.set_num_threads(1)  # tiny models: one thread is fastest and steadiest


def make_model(vocab=32, hidden=32, heads=2, layers=2, seed=0, dtype=torch.float64) -> Transformer:
    """A tiny backbone with every weight random (head too), in eval mode."""
    torch.manual_seed(seed)
    m = Transformer(TransformerConfig(vocab_size=vocab, hidden_size=hidden, n_heads=heads, n_layers=layers))
    m.init_weights(zero_head=False, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():  # make layer norms non-trivial so that they are exercised
        g = torch.Generator().manual_seed(seed + 1)
        for p in m.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return m.to(dtype).eval()


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
