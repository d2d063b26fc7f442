"""climb.config: loading TOML, --set overrides, validation, to_toml round trip, section_hash."""
from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from climb.config import (ClusterConfig, ConfigError, CorpusConfig, RunConfig, SearchConfig, TargetConfig,
                          _build, load_config, section_hash, to_dict, to_toml)

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
    assert _build(RunConfig, data) == cfg


def test_section_hash_stable_and_sensitive():
    a = ClusterConfig(k=8)
    h = section_hash(a)
    assert len(h) == 16 and int(h, 16) >= 0
    assert section_hash(ClusterConfig(k=8)) == h  # equal config -> equal hash
    assert section_hash(ClusterConfig(k=9)) != h
    assert section_hash(dataclasses.replace(a, min_quality=0.5)) != h
    assert section_hash(dataclasses.replace(a, quality_column="q")) != h
    # Several parts: order and every part matter; plain data works too.
    b = CorpusConfig()
    assert section_hash(a, b) == section_hash(ClusterConfig(k=8), CorpusConfig())
    assert section_hash(a, b) != section_hash(b, a)
    assert section_hash(a, "text") != section_hash(a, "content")
    assert section_hash({"x": 1, "y": 2}) == section_hash({"y": 2, "x": 1})
    # Stable across a save/load of the whole config.
    cfg = load_config(None, ["cluster.k=8"])
    assert section_hash(cfg.cluster, cfg.corpus) == section_hash(a, b)
