"""climb.config: loading TOML, --set overrides, validation, to_toml round trip, digest."""
from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import tomllib
from dataclasses import fields
from pathlib import Path

import pytest

from climb.config import (ClusterConfig, ConfigError, CorpusConfig, ProxyConfig, RunConfig, SearchConfig,
                          TargetConfig, from_dict, load_config, digest, to_dict, to_toml, without)
from proxies.config import GPTConfig, TrainConfig

REPO = Path(__file__).resolve().parents[1]

BASE = """
name = "t"

[corpus]
paths = ["data/*.parquet", "more/*.jsonl.gz"]
text_column = "content"

[cluster]
k = 4
min_quality = 1          # an int where a float is expected is accepted

[search]
iterations = [8, 4]
concentrations = [1, 2.5]

[target]
objective = ["bpb", "piqa/acc_norm"]
goal = "maximize"
tasks = { piqa = "tasks/piqa.jsonl" }
"""


@pytest.fixture
def cfg_file(tmp_path):
    p = tmp_path / "run.toml"
    p.write_text(BASE)
    return p


def test_load_toml_types_and_defaults(cfg_file):
    cfg = load_config(cfg_file)
    assert cfg.name == "t"
    assert cfg.corpus.paths == ("data/*.parquet", "more/*.jsonl.gz")
    assert cfg.corpus.text_column == "content"
    assert cfg.corpus.id_column == CorpusConfig().id_column  # untouched fields keep defaults
    assert cfg.cluster.k == 4
    assert cfg.cluster.min_quality == 1.0 and isinstance(cfg.cluster.min_quality, float)
    assert cfg.search.iterations == (8, 4)
    assert cfg.search.concentrations == (1.0, 2.5)
    assert all(isinstance(c, float) for c in cfg.search.concentrations)
    assert cfg.target.tasks == {"piqa": "tasks/piqa.jsonl"}
    assert cfg.target.objective == ("bpb", "piqa/acc_norm")
    assert cfg.target.goal == "maximize"
    assert cfg.embed == RunConfig().embed


def test_overrides_parse_as_toml_or_bare_string(cfg_file):
    cfg = load_config(cfg_file, ["cluster.k=8", "search.iterations=[4,2]", "embed.device=cpu",
                                 "corpus.paths=['x/*.parquet']", "name=other", "cluster.min_quality=0.25"])
    assert cfg.cluster.k == 8
    assert cfg.search.iterations == (4, 2)
    assert cfg.embed.device == "cpu"  # not valid TOML -> taken as a bare string
    assert cfg.corpus.paths == ("x/*.parquet",)
    assert cfg.name == "other"
    assert cfg.cluster.min_quality == 0.25
    # Fields not overridden still come from the file.
    assert cfg.corpus.text_column == "content"
    # Without a file, overrides apply to the defaults.
    assert load_config(None, ["cluster.k=8"]) == dataclasses.replace(RunConfig(), cluster=ClusterConfig(k=8))


def test_override_without_equals_rejected():
    with pytest.raises(ConfigError, match=r"section\.field=value"):
        load_config(None, ["cluster.k"])


@pytest.mark.parametrize("override, section, key", [
    ("cluster.kk=8", "cluster", "kk"),
    ("clustr.k=8", "top level", "clustr"),
])
def test_unknown_key_lists_known_keys(override, section, key):
    with pytest.raises(ConfigError) as ei:
        load_config(None, [override])
    msg = str(ei.value)
    assert repr(key) in msg and f"[{section}]" in msg
    known = ["k", "niter", "merge_to", "min_cluster_size"] if section == "cluster" else ["cluster", "corpus", "search"]
    assert "known:" in msg and all(repr(k) in msg.split("known:")[1] for k in known)


def test_unknown_key_in_file_rejected(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("[embed]\nmodle = 'x'\n")
    with pytest.raises(ConfigError, match=r"unknown config key.*'modle'.*\[embed\].*known:.*'model'"):
        load_config(p)


def test_bad_goal_rejected():
    with pytest.raises(ConfigError, match=r"target\.goal must be 'minimize' or 'maximize', got 'max'"):
        load_config(None, ["target.goal='max'"])


@pytest.mark.parametrize("override, match", [
    ("cluster.k=1", r"cluster\.k must be at least 2"),
    ("search.iterations=[]", r"search\.iterations"),
    ("search.iterations=[4,0]", r"search\.iterations"),
    ("executor.kind=slurm", r"executor\.kind"),
    ("proxy.schedule=linear", r"proxy\.schedule"),
    ("cluster.k='eight'", r"cluster\.k: expected int"),
    ("search.iterations=4", r"search\.iterations: expected a list"),
    ("cluster=3", r"cluster: expected a table"),
])
def test_invalid_values_rejected(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, [override])


def test_bool_for_int_field_rejected():
    with pytest.raises(ConfigError, match=r"cluster\.niter"):
        load_config(None, ["cluster.niter=true"])


def test_missing_and_invalid_file(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.toml not found.*pipelines/demo\.toml"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "broken.toml"
    bad.write_text("[cluster\nk = 3\n")
    with pytest.raises(ConfigError, match=r"broken\.toml: invalid TOML"):
        load_config(bad)


def _roundtrip(cfg: RunConfig, tmp_path: Path) -> RunConfig:
    p = tmp_path / "rt.toml"
    p.write_text(to_toml(cfg))
    return load_config(p)


def test_to_toml_roundtrips_defaults_and_file(cfg_file, tmp_path):
    assert _roundtrip(RunConfig(), tmp_path) == RunConfig()
    cfg = load_config(cfg_file, ["embed.device=cpu", "search.min_weight=1e-7", "export.token_budget=123456789012"])
    again = _roundtrip(cfg, tmp_path)
    assert again == cfg
    assert to_toml(again) == to_toml(cfg)
    tomllib.loads(to_toml(cfg))  # valid TOML on its own


def test_to_toml_roundtrips_awkward_strings(tmp_path):
    cfg = RunConfig(name='quote " back\\slash\ttab é',
                    corpus=CorpusConfig(paths=("{run}/data/*.parquet", "C:\\data\\x.jsonl"), id_column=""),
                    target=TargetConfig(tasks={}, texts=()),
                    search=SearchConfig(baselines=()))
    assert _roundtrip(cfg, tmp_path) == cfg


def test_to_toml_roundtrips_non_bmp_characters(tmp_path):
    cfg = RunConfig(name="run-\U0001F600", corpus=CorpusConfig(paths=("data/\U0001F4DA/*.parquet",)))
    assert _roundtrip(cfg, tmp_path) == cfg


@pytest.mark.parametrize("pipeline", sorted((REPO / "pipelines").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_pipelines_load_and_roundtrip(pipeline, tmp_path):
    cfg = load_config(pipeline)
    assert _roundtrip(cfg, tmp_path) == cfg
    # to_toml -> tomllib gives back the same data, field for field, and the same RunConfig
    data = tomllib.loads(to_toml(cfg))
    assert data == to_dict(cfg)
    assert from_dict(RunConfig, data) == cfg


def test_section_hash_stable_and_sensitive():
    a = ClusterConfig(k=8)
    h = digest(a)
    assert len(h) == 16 and int(h, 16) >= 0
    assert digest(ClusterConfig(k=8)) == h  # equal config -> equal hash
    assert digest(ClusterConfig(k=9)) != h
    assert digest(dataclasses.replace(a, min_quality=0.5)) != h
    assert digest(dataclasses.replace(a, quality_column="q")) != h
    # Several parts: order and every part matter; plain data works too.
    b = CorpusConfig()
    assert digest(a, b) == digest(ClusterConfig(k=8), CorpusConfig())
    assert digest(a, b) != digest(b, a)
    assert digest(a, "text") != digest(a, "content")
    assert digest({"x": 1, "y": 2}) == digest({"y": 2, "x": 1})
    # Stable across a save/load of the whole config.
    cfg = load_config(None, ["cluster.k=8"])
    assert digest(cfg.cluster, cfg.corpus) == digest(a, b)


# [proxy] settings that are the proxy model's (GPTConfig) or trainer's (TrainConfig),
# each with a valid value other than its default.
SHARED = {"n_layer": 3, "n_head": 4, "n_embd": 96, "seq_len": 64, "tie_embeddings": False,
          "steps": 50, "batch_size": 8, "lr": 1e-3, "warmup_steps": 5, "schedule": "wsd", "min_lr_ratio": 0.2,
          "average_last": 0.25, "precision": "fp32"}


def test_proxy_section_hash_is_pinned():
    # Run folders key on this hash: a change would train every proxy of a finished search again. The
    # curves recorded are left out of the search's key (how proxies are recorded, not what they measure).
    assert digest(without(ProxyConfig(), "curve_points", "curve_evals")) == "20eeb4c91c2fa791"
    assert to_dict(ProxyConfig()) == {"curve_points": 8, "curve_evals": 0, **{
        "tokenizer": "", "vocab_size": 4096, "tokenizer_docs": 4000, "n_layer": 2, "n_head": 2, "n_embd": 64,
        "seq_len": 128, "steps": 200, "batch_size": 16, "lr": 0.003, "warmup_steps": 20, "schedule": "cosine",
        "min_lr_ratio": 0.1, "average_last": 0.0, "tie_embeddings": True, "exact_batches": True,
        "common_streams": True, "device": "auto", "precision": "auto", "swarm": "auto", "swarm_size": 0,
        "command": "", "timeout_s": 0.0, "lookup": "", "lookup_weights": "", "lookup_key": "index"}}
    cfg = load_config(None, [f"proxy.{k}={json.dumps(v)}" for k, v in SHARED.items()])
    assert digest(without(cfg.proxy, "curve_points", "curve_evals")) == "63f93a5763148c43"


def test_proxy_shares_the_model_and_trainer_fields():
    model, train = {f.name: f for f in fields(GPTConfig)}, {f.name: f for f in fields(TrainConfig)}
    marked = set()
    for f in fields(ProxyConfig):
        owner = f.metadata.get("owner")
        if f.name == "vocab_size":  # the tokenizer's size asked for; the model gets the trained tokenizer's
            assert owner is None
            continue
        assert (owner is not None) == (f.name in model or f.name in train), f.name
        if owner is not None:
            theirs = (model if owner is GPTConfig else train)[f.name]
            assert (f.default, f.type) == (theirs.default, theirs.type), f.name
            marked.add(f.name)
    assert marked == set(SHARED)


def test_proxy_builders_pass_every_shared_field():
    assert ProxyConfig().model_config(320) == GPTConfig(vocab_size=320)
    assert ProxyConfig().train_config() == TrainConfig()
    pc = ProxyConfig(**SHARED)
    mcfg, tcfg = pc.model_config(320), pc.train_config(log_every=7)
    assert mcfg.vocab_size == 320 and tcfg.log_every == 7
    for name, value in SHARED.items():
        assert any(hasattr(c, name) for c in (mcfg, tcfg)), name
        for c in (mcfg, tcfg):
            if hasattr(c, name):
                assert getattr(c, name) == value != getattr(ProxyConfig(), name), name


@pytest.mark.parametrize("override, message", [
    ("proxy.schedule=linear", "proxy.schedule must be 'cosine' or 'wsd', got 'linear'"),
    ("proxy.precision=fp16", "proxy.precision must be 'auto', 'fp32' or 'bf16', got 'fp16'"),
    ("proxy.n_head=3", "proxy.n_head must divide n_embd, got n_head=3, n_embd=64"),
    ("proxy.n_head=0", "proxy.n_head must be at least 1, got 0"),
    ("proxy.n_embd=0", "proxy.n_embd must be at least 1, got 0"),
    ("proxy.seq_len=0", "proxy.seq_len must be at least 1, got 0"),
    ("proxy.batch_size=0", "proxy.batch_size must be at least 1, got 0"),
    ("proxy.warmup_steps=-1", "proxy.warmup_steps must be at least 0, got -1"),
    ("proxy.lr=0", "proxy.lr must be positive, got 0.0"),
    ("proxy.average_last=1.0", "proxy.average_last must be in [0, 1)"),
    ("proxy.swarm=both", "proxy.swarm must be 'auto', 'stacked' or 'single', got 'both'"),
    ('validate.model={schedule = "linear"}', "validate.model.schedule must be 'cosine' or 'wsd', got 'linear'"),
    ('validate.model={precision = "fp16"}', "validate.model.precision must be 'auto', 'fp32' or 'bf16'"),
    ("validate.model={n_head = 3}", "validate.model.n_head must divide n_embd, got n_head=3, n_embd=128"),
    ("validate.model={steps = 0}", "validate.model.steps must be at least 1, got 0"),
])
def test_bad_model_settings_name_the_key(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert message in str(e.value)
    if override.startswith("validate"):  # says where the larger model's values come from
        assert "validate.width" in str(e.value)


def test_config_and_cli_load_without_torch():
    # `climb --help` and config checks start in a fraction of a second; torch takes about one.
    code = ("import sys, climb.cli, climb.config; from proxies import GPTConfig, TrainConfig; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    # proxies stands alone: it never imports climb.
    for path in (REPO / "proxies").glob("*.py"):
        assert not re.search(r"^\s*(from|import)\s+climb\b", path.read_text(), re.M), path


def test_maximizing_a_loss_is_refused():
    with pytest.raises(ConfigError, match=r"target.goal = 'maximize', but target.objective \['bpb'\] is a loss"):
        load_config(None, ['target.goal="maximize"'])
    with pytest.raises(ConfigError, match=r"are losses"):
        load_config(None, ['target.goal="maximize"', 'target.objective=["bpb", "t/gold_loss_per_byte"]'])
    # a metric of another kind in the objective: the user's call
    assert load_config(None, ['target.goal="maximize"', 'target.objective=["bpb", "t/acc"]']).target.goal == "maximize"


def test_an_error_in_the_config_file_names_the_file(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('[cluster]\nk = "4"\n')
    with pytest.raises(ConfigError, match=r"mine.toml: cluster.k: expected int, got '4'"):
        load_config(f, [])
    with pytest.raises(ConfigError, match=r"mine.toml: cluster.k: expected int"):
        load_config(f, ["search.seed=3"])  # an unrelated override: still the file's own error
    f.write_text('[search]\niteration = [4, 2]\n')
    with pytest.raises(ConfigError, match=r"mine.toml: unknown config key\(s\) \['iteration'\] in \[search\]"):
        load_config(f, [])
    f.write_text('[cluster]\nk = 4\n')
    with pytest.raises(ConfigError, match=r"^cluster.k: expected int"):  # an override's error is the override's
        load_config(f, ['cluster.k="x"'])
