"""A weak answer says so where the user looks: the terminal, the report and summary.json end
with the found mixture and one plain sentence, better / not shown better / worse."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from climb.stages.search.summary import mixture_lines, verdict

HELPER = Path(__file__).parent / "helpers" / "uniform_best_proxy.py"


def _summary(**comp):
    res = {"climb": 2.0, "uniform": 2.1, "natural": 2.2}
    return {"target": {"name": "bpb", "goal": "minimize"}, "results": res, "comparison": comp}


def _c(diff, lo, hi, v):
    return {"diff": diff, "ci95": [lo, hi], "verdict": v, "seeds": 5}


def test_better_than_both():
    v = verdict(_summary(uniform=_c(-0.1, -0.12, -0.08, "better"), natural=_c(-0.2, -0.22, -0.18, "better")))
    assert v["kind"] == "better" and v["best_measured"] == "climb"
    assert "better than uniform and natural" in v["sentence"]


def test_not_shown_better_names_the_baseline_and_its_interval():
    s = _summary(uniform=_c(-0.01, -0.03, +0.01, "not resolved"), natural=_c(-0.2, -0.22, -0.18, "better"))
    v = verdict(s)
    assert v["kind"] == "not shown better" and "not shown better than uniform" in v["sentence"]
    assert "[-0.0300, +0.0100]" in v["sentence"] and "natural" not in v["sentence"].split(";")[0]


def test_worse_says_worse_and_which_measured_best():
    s = _summary(uniform=_c(+0.05, +0.02, +0.08, "worse"), natural=_c(-0.2, -0.22, -0.18, "better"))
    s["results"] = {"climb": 2.15, "uniform": 2.1, "natural": 2.35}
    v = verdict(s)
    assert v["kind"] == "worse" and v["best_measured"] == "uniform"
    assert v["sentence"].startswith("The found mixture is worse than uniform") and "uniform measured best" in v["sentence"]


def test_mixture_lines_list_the_heaviest_clusters_with_their_terms():
    clusters = [{"cluster": i, "top_terms": [f"t{i}a", f"t{i}b"]} for i in range(8)]
    text = mixture_lines([0.05, 0.4, 0.0, 0.3, 0.05, 0.05, 0.1, 0.05], clusters, top=3)
    lines = text.splitlines()
    assert [ln.split(":")[0].split()[-1] for ln in lines[:3]] == ["1", "3", "6"]
    assert "t1a, t1b" in lines[0] and "40.0%" in lines[0]
    assert lines[-1].strip().startswith("4 more clusters") and "20.0%" in lines[-1]


@pytest.fixture(scope="module")
def uniform_best(tmp_path_factory):
    """A finished run whose planted target has its optimum at the uniform mixture."""
    from conftest import FakeModel, vocab_docs, write_parquet_shards

    from climb import pipeline
    from climb.config import load_config
    from climb.stages import embed
    tmp = tmp_path_factory.mktemp("uniform_best")
    write_parquet_shards(tmp / "corpus", vocab_docs(60), 2)
    cfg = load_config(None, [
        f'corpus.paths=["{tmp}/corpus/*.parquet"]', "cluster.k=4", "cluster.niter=10",
        "proxy.vocab_size=320", "proxy.seq_len=16", "proxy.tokenizer_docs=100",
        f'proxy.command="{sys.executable} {HELPER} {{weights}} {{out}}"',
        'target.objective=["loss"]', 'target.goal="minimize"', 'target.texts=["x"]',
        "search.iterations=[6, 4]", "search.pool_size=2000", "search.min_weight=0.0",
        "search.epoch_cap=100.0", "search.replicates=0", "search.eval_seeds=4"])
    mp = pytest.MonkeyPatch()
    mp.setattr(embed, "load_model", lambda c: FakeModel())
    try:
        pipeline.run_stage("report", cfg, tmp / "run")
    finally:
        mp.undo()
    return tmp / "run"


def test_a_run_that_cannot_beat_uniform_says_so_everywhere(uniform_best, capsys):
    from climb import pipeline
    from climb.config import load_config
    s = json.loads((uniform_best / "report" / "summary.json").read_text())
    v = s["verdict"]
    assert v["kind"] in ("not shown better", "worse") and v["best_measured"] == "uniform", v
    assert v["sentence"] in (uniform_best / "report" / "report.md").read_text()
    # The terminal: a finished report run again prints the table, the mixture and the sentence.
    cfg = load_config(uniform_best / "config.toml", [])
    pipeline.run_stage("report", cfg, uniform_best)
    out = capsys.readouterr().out
    assert "Found mixture (by cluster, heaviest first):" in out and v["sentence"] in out
    assert "cluster" in out.split("Found mixture")[1].splitlines()[1]
    # The sentence is the last thing said, before the report's path.
    assert out.rstrip().splitlines()[-3:-1] == [v["sentence"], ""]


def test_the_export_keeps_the_found_mixture_and_its_card_says_it_is_weak(uniform_best, caplog):
    from climb import pipeline
    from climb.config import load_config
    cfg = load_config(uniform_best / "config.toml", [])
    with caplog.at_level("WARNING"):
        pipeline.run_stage("export", cfg, uniform_best)
    s = json.loads((uniform_best / "report" / "summary.json").read_text())
    card = (uniform_best / "export" / "README.md").read_text()
    assert f"**Warning: {s['verdict']['sentence']}**" in card
    assert "under `\"uniform\"`" in card and "climb export --weights" in card
    mix = json.loads((uniform_best / "export" / "mixture.json").read_text())
    found = json.loads((uniform_best / "search" / "mixture.json").read_text())["weights"]
    assert mix["weights"] == pytest.approx(found)  # the found mixture, not silently another
    assert any("writes the found mixture all the same" in r.getMessage() for r in caplog.records)
