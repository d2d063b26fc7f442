"""Device and precision: chosen by what is fast on the CPU at hand, recorded in every proxy record and
in the embed stage, keyed (embeddings of another precision never share a key), and a search whose
proxies mix them says so."""
from __future__ import annotations

import dataclasses
import importlib

import torch

from climb.optimize.quality import warnings
from climb.stages import embed

train = importlib.import_module("proxies.train")  # the module (the package exports a function of that name)


def test_bf16_on_a_cpu_only_with_amx(monkeypatch):
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    monkeypatch.setattr(train, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    assert not train.native_bf16(torch.device("cpu"))  # oneDNN's bf16 without AMX: slower than fp32
    monkeypatch.setattr(train, "cpu_flags", lambda: {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
    assert train.native_bf16(torch.device("cpu"))
    assert train.uses_bf16(torch.device("cpu"), "auto", 96) and not train.uses_bf16(torch.device("cpu"), "auto", 64)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    assert not train.native_bf16(torch.device("cpu"))
    assert train.uses_bf16(torch.device("cpu"), "bf16", 64)  # asked for: whatever the machine


def test_the_embed_key_holds_the_precision_used(monkeypatch, tmp_path):
    from climb.config import load_config
    cfg = load_config(None, [f'corpus.paths=["{tmp_path}/*.parquet"]', 'embed.device="cpu"'])
    monkeypatch.setattr(embed, "resolve_dtype", lambda pref, device: torch.bfloat16)
    bf16 = embed.resume_key(cfg)
    assert embed.precision(cfg) == ["cpu", "bfloat16"]
    monkeypatch.setattr(embed, "resolve_dtype", lambda pref, device: torch.float32)
    assert embed.precision(cfg) == ["cpu", "float32"] and embed.resume_key(cfg) != bf16


def test_proxy_records_say_where_they_trained_and_a_mix_is_a_warning(tmp_path, monkeypatch):
    from climb.runtime import proxy_runs
    from climb.stages import search, tokenize
    from scripted_run import prepare
    from test_cheaper_search import _builtin_cfg
    cfg, paths, _, _ = prepare(tmp_path, monkeypatch, "search.iterations=[4, 2]", "executor.processes=1")
    cfg = _builtin_cfg(cfg, tmp_path)
    tokenize.run(cfg, paths)
    search.run(cfg, paths)
    recs = search.read_results(paths)
    assert all(r["device"] == "cpu" and r["precision"] == "fp32" for r in recs)  # 32 wide: fp32 on any CPU
    assert proxy_runs.trained_in(dataclasses.replace(cfg.proxy, precision="bf16")) == {"device": "cpu",
                                                                                      "precision": "bf16"}
    import json
    q = json.loads(paths.search.quality.read_text())
    assert q["trained_in"] == ["cpu fp32"] and not any("mixed devices" in w for w in q["warnings"])
    assert any("mixed devices or precisions" in w and "cpu fp32 and cuda bf16" in w
               for w in warnings({"trained_in": ["cpu fp32", "cuda bf16"]}))

