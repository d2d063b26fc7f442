"""A tiny run through every stage with the real code paths of a full run.

Real embedding model (offline, from its pip package), real k-means, real BPE,
real proxy training and evaluation; only the sizes are small: one demo shard,
8 clusters, 6 + 3 proxies of a few steps.
"""
from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from climb.cli import main

TINY = ["corpus.max_shards=1", "embed.max_seq_length=32", "cluster.k=8", "cluster.niter=10",
        "proxy.vocab_size=320", "proxy.tokenizer_docs=300", "proxy.n_embd=32", "proxy.seq_len=32",
        "proxy.steps=8", "proxy.batch_size=8", "proxy.warmup_steps=2", "search.iterations=[4,2]",
        "search.pool_size=2000", "export.token_budget=20000", 'proxy.swarm="stacked"',
        "search.experts=0"]  # the stacked swarm path (experts train one per worker; test_cheaper_search)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("e2e") / "run"
    args = ["run", "--config", "pipelines/demo.toml", "--run", str(run)]
    for s in TINY:
        args += ["--set", s]
    assert main(args) == 0
    return run


def test_every_stage_wrote_its_manifest(run_dir):
    for stage in ("embed", "cluster", "search", "export", "report"):
        m = json.loads((run_dir / stage / "manifest.json").read_text())
        assert m["stage"] == stage and m["hash"]


def test_summary_json_schema(run_dir):
    s = json.loads((run_dir / "report" / "summary.json").read_text())
    assert s["target"] == {"name": "bpb", "goal": "minimize"}
    assert set(s["results"]) == {"climb", "uniform", "natural"}
    assert all(np.isfinite(v) and 0 < v < 20 for v in s["results"].values())
    # search + 2 replicated mixtures x 2 more seeds + 3 mixtures x 5 paired evaluation seeds
    assert s["proxies_trained"] == 6 + 2 * 2 + 3 * 5
    assert s["clusters"] == 8
    for name in ("uniform", "natural"):
        c = s["comparison"][name]
        assert c["seeds"] == 5 and c["verdict"] in ("better", "worse", "not resolved")
        lo, hi = c["ci95"]
        assert lo <= c["diff"] <= hi
        assert c["diff"] == pytest.approx(s["results"]["climb"] - s["results"][name], abs=1e-9)
    q = s["quality"]
    assert q["seed_sd"] > 0 and q["paired_sd"] > 0 and len(q["predictor_oof_spearman"]) == 2


def test_report_page_and_plots(run_dir):
    page = (run_dir / "report" / "report.md").read_text()
    for png in ("cluster_sizes.png", "cluster_map.png", "score_by_iteration.png", "weights.png"):
        assert (run_dir / "report" / png).stat().st_size > 1000
        assert png in page


def test_export_matches_weights_and_budget(run_dir):
    mix = json.loads((run_dir / "export" / "mixture.json").read_text())
    assert abs(sum(mix["weights"]) - 1) < 1e-9
    rows = pq.read_table(sorted((run_dir / "export" / "data").rglob("*.parquet"))[0])
    assert rows.column_names == ["id", "text", "cluster", "epoch"]
    total = sum(c["tokens"] for c in mix["clusters"])
    assert total == mix["tokens"] and total >= 0.95 * 20000
    assert not (run_dir / "export" / "megatron_blend.txt").exists()  # Parquet: nothing for Megatron's --data-path
    inter = json.loads((run_dir / "export" / "interleave.json").read_text())
    assert abs(sum(inter["probabilities"]) - 1) < 1e-6 and abs(sum(inter["token_weights"]) - 1) < 1e-6


def test_rerun_skips_every_stage(run_dir):
    args = ["run", "--config", "pipelines/demo.toml", "--run", str(run_dir)]
    for s in TINY:
        args += ["--set", s]
    before = {s: (run_dir / s / "manifest.json").read_text() for s in ("embed", "cluster", "search", "export")}
    assert main(args) == 0
    for s, text in before.items():
        assert (run_dir / s / "manifest.json").read_text() == text


def test_search_stacked_its_proxies(run_dir):
    # proxy.swarm="stacked": the search trains its proxies as stacked models, as on a GPU.
    recs = [json.loads(x) for x in (run_dir / "search" / "results.jsonl").read_text().splitlines()]
    # on this CPU the search runs one worker process per core (2 here), so each
    # iteration is split into at least 2 groups: 2 + 2 stacked, then 1 + 1 alone
    from climb.runtime.workers import cpu_slots
    if cpu_slots() == 2:
        assert [r.get("stacked", 1) for r in recs] == [2] * 4 + [1] * 2
    assert all(r["status"] == "ok" for r in recs)
