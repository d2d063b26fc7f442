"""The validate stage: a larger model on the found mixture and the baselines, with paired
seeds; rank transfer over search mixtures; resuming model by model; bad configs.

The proxies are the quadratic-bowl trainer (tests/helpers/quadratic_proxy.py); the
"larger model" is tests/helpers/noisy_proxy.py, the same bowl plus a seed effect shared
by every mixture trained with one seed and a small per-mixture noise, so the right
verdicts (the found mixture is better) and the rank order are known.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from climb.stages import cluster, embed, report, search, tokenize, validate

from climb import pipeline
from climb.config import ConfigError, load_config
from climb.optimize.quality import rank_transfer
from climb.runtime.layout import RunPaths

HELPERS = Path(__file__).parent / "helpers"
BOWL = HELPERS / "quadratic_proxy.py"
NOISY = HELPERS / "noisy_proxy.py"
LARGER = f'validate.model={{command = "{sys.executable} {NOISY} {{weights}} {{out}}"}}'


@pytest.fixture
def searched(tmp_path, fake_model, make_docs, write_shards):
    """A run folder searched with the bowl; returns (config for validate, paths)."""
    write_shards(tmp_path / "corpus", make_docs(60), 2)

    def make(*extra: str):
        cfg = load_config(None, [
            f'corpus.paths=["{tmp_path}/corpus/*.parquet"]', "cluster.k=4", "cluster.niter=10",
            "proxy.vocab_size=320", "proxy.seq_len=16", "proxy.tokenizer_docs=100",
            f'proxy.command="{sys.executable} {BOWL} {{weights}} {{out}}"',
            'target.objective=["loss"]', 'target.goal="minimize"', 'target.texts=["x"]',
            "search.iterations=[10, 6]", "search.pool_size=3000", "search.min_weight=0.0", "search.epoch_cap=100.0",
            'search.baselines=["uniform", "natural"]', "search.eval_seeds=2", "search.replicates=0",
            LARGER, "validate.rank_mixtures=6", *extra])
        paths = RunPaths(tmp_path / "run")
        embed.run(cfg, paths)
        cluster.run(cfg, paths)
        tokenize.run(cfg, paths)
        search.run(cfg, paths)
        return cfg, paths
    return make


def _lines(paths: RunPaths) -> list[dict]:
    return [json.loads(x) for x in (paths.root / "validate" / "results.jsonl").read_text().splitlines()]


def test_validate_pairs_seeds_judges_and_measures_rank_transfer(searched):
    cfg, paths = searched()
    stats = validate.run(cfg, paths)
    p = json.loads((paths.root / "validate" / "plan.json").read_text())
    recs = _lines(paths)
    seeds = [20_011, 20_012, 20_013]
    # paired: every compared mixture is trained with the same seeds, none the search used
    compared = [m for m in p["mixtures"] if m["role"] == "compared"]
    assert [m["name"] for m in compared] == ["climb", "uniform", "natural"]
    for m in compared:
        assert sorted(r["seed"] for r in recs if r["mixture_id"] == m["name"]) == seeds
    used = {r["seed"] for r in search.read_results(paths)} | {cfg.search.eval_seed + i for i in range(2)}
    assert not used & set(seeds)
    # the seed effect (sd 0.05) cancels in the paired differences (noise 0.002): resolved
    s = json.loads((paths.root / "validate" / "summary.json").read_text())
    for name in ("uniform", "natural"):
        c = s["target"]["comparison"][name]
        assert c["verdict"] == "better" and c["seeds"] == 3 and c["ci95"][1] < 0
    # rank mixtures span the search's range of proxy scores, best and worst included
    ok = [r for r in search.read_results(paths) if r["status"] == "ok"]
    rank = [m for m in p["mixtures"] if m["role"] == "rank"]
    scores = [m["proxy_score"] for m in rank]
    assert len(rank) == 6 and min(scores) == min(r["objective"] for r in ok)
    assert max(scores) == max(r["objective"] for r in ok)
    # the larger model is the same bowl plus noise: the ranks carry over
    assert s["rank"]["n"] == 6 and s["rank"]["spearman"] > 0.9 and s["rank"]["p_value"] < 0.01
    assert stats["models"] == 9 + sum(len(m["seeds"]) for m in rank)
    assert stats["verdicts"] == {"uniform": "better", "natural": "better"}


def test_validate_resumes_model_by_model(searched):
    cfg, paths = searched()
    validate.run(cfg, paths)
    vdir = paths.root / "validate"
    lines = (vdir / "results.jsonl").read_text().splitlines()
    (vdir / "results.jsonl").write_text("\n".join(lines[:-3]) + "\n")  # killed 3 models before the end
    (vdir / "manifest.json").unlink()
    stats = validate.run(cfg, paths)
    again = (vdir / "results.jsonl").read_text().splitlines()
    assert stats["trained"] == 3 and len(again) == len(lines)
    assert again[:-3] == lines[:-3]  # what was done is kept, not retrained
    ids = lambda xs: sorted((json.loads(x)["mixture_id"], json.loads(x)["seed"]) for x in xs)  # noqa: E731
    assert ids(again[-3:]) == ids(lines[-3:])
    # finished: a rerun trains nothing
    assert validate.run(cfg, paths).get("skipped_stage")


def test_run_validates_only_when_enabled_and_the_report_shows_it(searched):
    cfg, paths = searched()
    pipeline.run_all(cfg, paths.root)
    assert not (paths.root / "validate").exists()
    summary = json.loads((paths.root / "report" / "summary.json").read_text())
    assert "transfer" not in summary
    on = dataclasses.replace(cfg, validate=dataclasses.replace(cfg.validate, enabled=True))
    pipeline.run_all(on, paths.root)
    summary = json.loads((paths.root / "report" / "summary.json").read_text())
    page = (paths.root / "report" / "report.md").read_text()
    assert summary["transfer"]["target"]["comparison"]["natural"]["verdict"] == "better"
    assert "## Does it transfer?" in page and "transfer.png" in page
    assert (paths.root / "report" / "transfer.png").exists()


def test_rank_transfer_known_answers():
    r = rank_transfer(range(8), [x * 3 + 1 for x in range(8)])
    assert r["spearman"] == 1 and r["n"] == 8 and r["p_value"] == pytest.approx(1 / 40320)
    r = rank_transfer(range(8), [-x for x in range(8)])
    assert r["spearman"] == -1 and r["p_value"] == pytest.approx(1.0)
    # one swap of neighbours in 8: rho = 1 - 6 * 2 / (8 * 63)
    r = rank_transfer(range(8), [0, 1, 2, 4, 3, 5, 6, 7])
    assert r["spearman"] == pytest.approx(1 - 12 / 504)
    assert r["ci95"][0] < r["spearman"] < r["ci95"][1] < 1
    # unrelated scores: the interval spans zero
    rng = np.random.default_rng(3)
    r = rank_transfer(rng.normal(size=8), rng.normal(size=8))
    assert r["ci95"][0] < 0 < r["ci95"][1] and r["p_value"] > 0.05
    # missing scores are left out; too few points give no statistic
    assert rank_transfer([1, 2, np.nan, 4, 5], [1, 2, 3, 4, 5])["n"] == 4
    assert rank_transfer([1, 2], [1, 2])["spearman"] is None


def test_rank_mixtures_are_spread_over_the_scores():
    recs = [{"mixture_id": f"m{i}", "status": "ok", "objective": float(v), "weights": [i, 1.0]}
            for i, v in enumerate([5, 1, 9, 3, 7, 2, 8, 4, 6, 0])]
    # m9's mixture measured again: its first record (by id) stands for it
    recs.append({"mixture_id": "dup", "status": "ok", "objective": 0.5, "weights": [9, 1.0]})
    recs.append({"mixture_id": "bad", "status": "failed", "objective": None, "weights": [20, 1.0]})
    got = validate.choose_rank_mixtures(recs, 4, "minimize")
    assert [r["objective"] for r in got] == [0.5, 3, 6, 9]
    got = validate.choose_rank_mixtures(recs, 4, "maximize")
    assert [r["objective"] for r in got] == [9, 6, 3, 0.5]
    assert len(validate.choose_rank_mixtures(recs, 50, "minimize")) == 10


def test_heldout_metrics_and_their_directions():
    """Held-out metrics get their own verdicts, with accuracy maximised and losses minimised."""
    from climb.config.checks import validation_model
    cfg = load_config(None, ['validate.tasks={cloze = "x.jsonl"}'])
    seeds = [1, 2, 3]
    plan = {"seeds": seeds, "mixtures": [{"name": n, "role": "compared", "weights": [1.0], "proxy_score": None,
                                          "seeds": seeds} for n in ("climb", "uniform")]}
    recs = []
    for s in seeds:
        for n, acc in (("climb", 0.30), ("uniform", 0.20)):
            recs.append({"mixture_id": n, "seed": s, "status": "ok", "objective": 3.0 - acc + 0.01 * s,
                         "metrics": {"heldout/cloze/acc": acc + 0.001 * s, "heldout/cloze/gold_loss_per_byte":
                                     2 - acc + 0.01 * s, "heldout/cloze/n": 10}})

    no_run = RunPaths(Path("/nonexistent"))
    s = validate.summarize(cfg, no_run, plan, recs, validation_model(cfg))
    assert set(s["heldout"]) == {"heldout/cloze/acc", "heldout/cloze/gold_loss_per_byte"}
    assert s["heldout"]["heldout/cloze/acc"]["goal"] == "maximize"
    assert s["heldout"]["heldout/cloze/acc"]["comparison"]["uniform"]["verdict"] == "better"
    assert s["heldout"]["heldout/cloze/gold_loss_per_byte"]["goal"] == "minimize"
    assert s["heldout"]["heldout/cloze/gold_loss_per_byte"]["comparison"]["uniform"]["verdict"] == "better"
    assert s["target"]["comparison"]["uniform"]["verdict"] == "better"
    assert s["heldout"]["heldout/cloze/acc"]["constant"] is None
    # an accuracy every model scores 0 on is said to be uninformative, not compared
    for r in recs:
        r["metrics"]["heldout/cloze/acc"] = 0.0
    s = validate.summarize(cfg, no_run, plan, recs, validation_model(cfg))
    assert s["heldout"]["heldout/cloze/acc"]["constant"] == 0.0
    assert "uninformative" in report.transfer_section(s) and "uninformative" in "".join(validate.summary_lines(s))


def test_heldout_evaluation_of_a_built_in_model(tmp_path):
    """The built-in trainer's models are scored on the held-out texts and tasks too."""
    import torch
    from proxies.model import GPT, GPTConfig
    from proxies.tokenizer import train_bpe
    from climb.config import ProxyConfig, TargetConfig
    from climb.runtime.proxy_runs import ProxyTask, evaluate_task_metrics
    texts = [f"the quick brown fox {i} jumps over the lazy dog" for i in range(50)]
    tok = train_bpe(texts, 320, tmp_path / "tok.json")
    (tmp_path / "target.jsonl").write_text(json.dumps({"text": texts[0]}) + "\n")
    (tmp_path / "held.jsonl").write_text(json.dumps({"text": texts[1]}) + "\n")
    (tmp_path / "cloze.jsonl").write_text(json.dumps({"context": "the quick brown", "continuation": " fox"}) + "\n")
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16, seq_len=16), seed=0)
    heldout = TargetConfig(texts=(str(tmp_path / "held.jsonl"),), tasks={"cloze": str(tmp_path / "cloze.jsonl")},
                           objective=())
    task = ProxyTask(mixture_id="m", iteration=-3, weights=(1.0,), seed=0, tokens_dir="", run_dir=str(tmp_path),
                     proxy=ProxyConfig(), target=TargetConfig(texts=(str(tmp_path / "target.jsonl"),)), heldout=heldout)
    with torch.no_grad():
        m = evaluate_task_metrics(model, tok, task, "cpu")
    assert {"bpb", "heldout/bpb", "heldout/cloze/acc", "heldout/cloze/gold_loss_per_byte"} <= set(m)
    assert m["bpb"] != m["heldout/bpb"] and all(np.isfinite(v) for v in m.values())


@pytest.mark.parametrize("override,message", [
    ("validate.seeds=2", "validate.seeds must be at least 3"),
    ("validate.rank_mixtures=3", "validate.rank_mixtures must be 0"),
    ("validate.width=0", "validate.width must be at least 1"),
    ('validate.model={vocab_size = 64}', "may not set ['vocab_size']"),
    ('validate.model={n_layers = 4}', "unknown config key(s) ['n_layers'] in validate.model"),
    ('validate.model={lr = "fast"}', "validate.model.lr: expected float"),
    ('validate.model={n_embd = 100, n_head = 3}', "validate.model.n_head must divide n_embd, got n_head=3, n_embd=100"),
    ('validate.baselines=["random"]', "validate.baselines: unknown ['random']"),
    ('validate.baselines=["one-shot"]', 'only a search with "one-shot"'),
])
def test_bad_validate_configs_say_what_to_fix(override, message):
    with pytest.raises(ConfigError) as e:
        load_config("pipelines/demo.toml", [override])
    assert message in str(e.value)


def test_heldout_needs_the_built_in_trainer():
    with pytest.raises(ConfigError, match="evaluated by the built-in trainer"):
        load_config(None, ['validate.model={command = "train {weights} {out}"}', 'validate.texts=["h.jsonl"]'])


def test_a_lookup_run_validates_only_with_a_trainer(tmp_path):
    lookup = ['proxy.lookup="m.csv"', 'proxy.lookup_weights="w.csv"']
    load_config(None, lookup)  # searching a measured swarm is fine until validation is asked for
    with pytest.raises(ConfigError, match="proxy.lookup stands in for training"):
        load_config(None, [*lookup, "validate.enabled=true"])
    with pytest.raises(ConfigError, match="proxy.lookup stands in for training"):
        validate.run(load_config(None, lookup), RunPaths(tmp_path / "run"))
    load_config(None, [*lookup, "validate.enabled=true", 'validate.model={command = "t {weights} {out}"}'])


def test_validate_before_search_says_what_to_run(tmp_path):
    cfg = load_config("pipelines/demo.toml")
    with pytest.raises(FileNotFoundError, match="climb search"):
        validate.run(cfg, RunPaths(tmp_path / "run"))


def test_report_key_follows_validation(searched):
    """A report written before validation is written again once validate has run."""
    cfg, paths = searched()
    pipeline.run_stage("report", cfg, paths.root)
    before = json.loads((paths.root / "report" / "manifest.json").read_text())["hash"]
    validate.run(cfg, paths)
    stats = report.run(cfg, paths)
    assert not stats.get("skipped_stage")
    assert json.loads((paths.root / "report" / "manifest.json").read_text())["hash"] != before
