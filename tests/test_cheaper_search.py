"""A search that spends less proxy compute: successive halving on the curves (search.halving)
and expert features (search.experts). The rule and the feature are checked against direct
computations; the search against a scripted trainer whose values at the rung and at the end
are known, and end to end with the built-in trainer."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from climb.config import ConfigError, load_config
from climb.optimize.experts import ExpertFeature, ExpertPrior, ensemble_bpb, ensemble_loss
from climb.optimize.halving import continue_set, curve_shift, predicted_final
from climb.optimize.predictor import make_predictor
from climb.runtime import proxy_runs
from climb.stages import search, tokenize
from climb.stages.search import cheap as search_cheap
from climb.stages.search.summary import compute_account
from scripted_run import prepare


# ----------------------------------------------------------------- the halving rule
def test_continue_set_keeps_the_best_fraction_and_what_the_curve_model_cannot_rule_out():
    v = {"a": 3.0, "b": 2.0, "c": 2.05, "d": 4.0, "e": 2.5, "f": 3.5, "g": 2.6, "h": 5.0}
    assert continue_set(v, "minimize", 0.25) == ["b", "c"]  # no curve model yet: rank only
    assert continue_set(v, "maximize", 0.25) == ["h", "d"]
    # sd 0.2: a rung value within 1.96 * sqrt(2) * 0.2 = 0.554 of the best could still end best.
    assert continue_set(v, "minimize", 0.25, (-0.5, 0.2, 3)) == ["b", "c", "e"]
    # ... at most as many again as the kept fraction.
    assert continue_set(v, "minimize", 0.25, (-0.5, 1.0, 3)) == ["b", "c", "e", "g"]
    assert continue_set({"x": 1.0}, "minimize", 0.1) == ["x"]
    with pytest.raises(ValueError):
        continue_set(v, "minimize", 0.0)


def test_curve_shift_and_predicted_final():
    assert curve_shift([]) == (0.0, None, 0)
    assert curve_shift([(3.0, 2.5)]) == (-0.5, None, 1)
    mean, sd, n = curve_shift([(3.0, 2.5), (2.0, 1.3), (4.0, 3.7)])
    assert (mean, n) == (pytest.approx(-0.5), 3) and sd == pytest.approx(np.std([-0.5, -0.7, -0.3], ddof=1))
    assert predicted_final(2.2, (mean, sd, n)) == (pytest.approx(1.7), sd)


# ----------------------------------------------------------------- expert features
def test_ensemble_bpb_is_the_bpb_of_the_mixed_token_probabilities():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(500, 3, 7))  # 500 tokens, 3 experts, a vocabulary of 7
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    tokens = rng.integers(0, 7, size=500)
    logp = np.log(probs[np.arange(500), :, tokens])  # (tokens, experts)
    n_bytes = 1234
    W = np.array([[1.0, 0.0, 0.0], [0.2, 0.3, 0.5], [0.0, 0.5, 0.5]])
    direct = [-np.log2((probs[np.arange(500), :, tokens] * w).sum(1)).sum() / n_bytes for w in W]
    assert ensemble_bpb(logp, n_bytes, W) == pytest.approx(direct, rel=1e-10)
    # Any weights per token: a mean over two "items" of their losses per byte.
    coef = np.r_[np.full(200, 1 / (2 * 300)), np.full(300, 1 / (2 * 700))]
    items = [-(np.log((probs[np.arange(500), :, tokens] * w).sum(1)) * coef).sum() for w in W]
    assert ensemble_loss(logp, coef, W) == pytest.approx(items, rel=1e-10)
    # Stable where every expert gives a token almost nothing.
    assert np.isfinite(ensemble_bpb(logp - 800.0, n_bytes, W)).all()
    with pytest.raises(ValueError, match="experts"):
        ensemble_bpb(logp, n_bytes, W[:, :2])


def test_expert_ensemble_bpb_equals_a_direct_computation_on_toy_models(tmp_path):
    """Two toy GPTs as experts: token_logprobs + ensemble_bpb give the bpb of the model whose
    next-token distribution is the w-mixture of theirs, computed here from their logits."""
    from proxies.config import GPTConfig
    from proxies.evaluate import bits_per_byte, token_logprobs
    from proxies.model import GPT
    from proxies.tokenizer import train_bpe
    texts = ["the quick brown fox jumps over the lazy dog. " * 3, "one two three four five. " * 5, "abc " * 40]
    tok = train_bpe(iter(texts * 4), 320, tmp_path / "tok.json")
    experts = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        experts.append(GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=32, seq_len=16)).eval())
    cols = [token_logprobs(m, tok, texts) for m in experts]
    logp, n_bytes = np.stack([c[0] for c in cols], 1), cols[0][1]
    assert n_bytes == sum(len(t.encode()) for t in texts)
    for m, (lp, _) in zip(experts, cols):  # one expert alone: its own bits per byte
        assert -lp.astype(np.float64).sum() / (math.log(2) * n_bytes) == pytest.approx(
            bits_per_byte(m, tok, texts), rel=1e-6)
    # Directly: the same EOS-separated stream in windows of seq_len predictions, probabilities mixed.
    stream = [tok.eos_id]
    for ids in tok.encode_batch(texts):
        stream += ids + [tok.eos_id]
    w = np.array([0.3, 0.7])
    nll = 0.0
    with torch.no_grad():
        for s in range(0, len(stream) - 1, 16):
            x = torch.tensor([stream[s:s + 16]])
            y = stream[s + 1:s + 17]
            p = sum(wi * torch.softmax(m(x)[0][0, :len(y)].double(), -1) for wi, m in zip(w, experts))
            nll -= torch.log2(p[torch.arange(len(y)), torch.tensor(y)]).sum().item()
    assert ensemble_bpb(logp, n_bytes, w[None])[0] == pytest.approx(nll / n_bytes, rel=1e-5)


def test_expert_gold_losses_give_a_tasks_gold_loss_per_byte(tmp_path):
    """An expert's gold-continuation log-probabilities, weighted as the search weights them,
    give evaluate_task's gold_loss_per_byte; for multiple choice and cloze items alike."""
    from proxies.config import GPTConfig
    from proxies.evaluate import evaluate_task, gold_token_logprobs
    from proxies.model import GPT
    from proxies.tokenizer import train_bpe
    tok = train_bpe(iter(["the cat sat on the mat. a dog ran far. " * 5] * 4), 300, tmp_path / "tok.json")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=32, seq_len=16)).eval()
    items = [{"query": "Question: where did the cat sit?", "choices": ["on the mat", "far away"], "gold": 0},
             {"query": "the dog", "choices": [" ran far", " sat"], "gold": 1},
             {"context": "the cat sat on the", "continuation": " mat. a dog ran far. " * 3}]  # longer than seq_len
    got = gold_token_logprobs(model, tok, items)
    coef = np.concatenate([np.full(len(lp), 1 / (b * len(items))) for lp, b in got])
    logp = np.concatenate([lp for lp, _ in got])[:, None]
    assert ensemble_loss(logp, coef, np.ones((1, 1)))[0] == pytest.approx(
        evaluate_task(model, tok, items)["gold_loss_per_byte"], rel=1e-6)


def test_expert_prior_fits_a_line_in_the_feature_and_the_base_on_the_rest():
    rng = np.random.default_rng(1)
    logp = np.log(rng.dirichlet(np.ones(5), size=200)[:, :3] + 1e-3)
    feature = ExpertFeature(logp, np.full(len(logp), 1 / 400))
    X = rng.dirichlet(np.ones(3), size=12)
    y = 0.5 + 2.0 * feature(X) + 0.01 * rng.normal(size=12)
    m = ExpertPrior(make_predictor("linear"), feature).fit(X, y)
    assert m.slope == pytest.approx(2.0, abs=0.1)
    Q = rng.dirichlet(np.ones(3), size=50)
    assert np.corrcoef(m.predict(Q), 0.5 + 2.0 * feature(Q))[0, 1] > 0.99
    # A feature that runs against the measurements gets no slope: the base predictor alone.
    flat = ExpertPrior(make_predictor("linear"), feature).fit(X, -y)
    assert flat.slope == 0.0
    # A token sample: the same feature on fewer tokens (bytes scaled), close to the whole.
    many = np.log(rng.dirichlet(np.ones(5), size=4000)[:, :3] + 1e-3)
    coef = np.full(4000, 1 / 8000)
    sub = ExpertFeature(many, coef, max_tokens=1000, seed=3)
    assert len(sub.logp) == 1000 and sub.coef.sum() == pytest.approx(coef.sum())
    assert np.corrcoef(sub(Q), ExpertFeature(many, coef)(Q))[0, 1] > 0.9


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="search.halving"):
        load_config(None, ["search.halving=[0.25]"])
    with pytest.raises(ConfigError, match="search.halving"):
        load_config(None, ["search.halving=[0.25, 1.5]"])
    with pytest.raises(ConfigError, match="search.experts"):
        load_config(None, ["search.experts=2.0"])
    with pytest.raises(ConfigError, match="built-in proxy trainer"):
        load_config(None, ["search.halving=[0.25, 0.25]", 'proxy.command="x {weights} {out}"'])
    with pytest.raises(ConfigError, match="accuracy|gold_loss_per_byte"):
        load_config(None, ["search.experts=0.25", 'target.objective=["piqa/acc"]', 'target.goal="maximize"'])


# ----------------------------------------------------------------- the search, scripted
def _bowl(w) -> float:
    """The scripted proxy's final loss: a bowl around most weight on the last cluster."""
    w = np.asarray(w, float)
    t = np.full(len(w), 0.1 / (len(w) - 1))
    t[-1] = 0.9
    return float(((w - t) ** 2).sum())


def _scripted(calls):
    """A stand-in for the built-in trainer: at a rung, the final loss + 0.3 + a known wobble; at
    the end, the final loss. A paused run writes its checkpoint; a continued one needs it."""
    def run(task, deadline=None):
        final = _bowl(task.weights)
        wobble = 0.02 * math.sin(7 * sum(i * w for i, w in enumerate(task.weights)))
        tps = 100
        if task.stop_at:
            Path(task.checkpoint).parent.mkdir(parents=True, exist_ok=True)
            Path(task.checkpoint).write_text("paused")
            calls.append(("rung", task.mixture_id))
            return {"loss": final + 0.3 + wobble}, task.stop_at * tps, {"params": 10}
        if task.checkpoint:
            assert Path(task.checkpoint).read_text() == "paused"
            calls.append(("continue", task.mixture_id))
        else:
            calls.append(("full", task.mixture_id))
        return {"loss": final}, task.proxy.steps * tps, {"params": 10}
    return run


def _halving_search(tmp_path, monkeypatch):
    """A finished search of 8 -> 8 -> 4 proxies halving at a quarter of 40 steps, on the
    scripted trainer; (cfg, paths, the trainer's calls)."""
    cfg, paths, _, _ = prepare(tmp_path, monkeypatch, "search.iterations=[8, 8, 4]", "search.replicates=0",
                               "executor.processes=1")
    cfg = dataclasses.replace(cfg, proxy=dataclasses.replace(cfg.proxy, command="", steps=40),
                              search=dataclasses.replace(cfg.search, halving=(0.25, 0.25)))
    calls: list = []
    monkeypatch.setattr(proxy_runs, "_builtin", _scripted(calls))
    tokenize.run(cfg, paths)
    search.run(cfg, paths)
    return cfg, paths, calls


def test_halving_stops_the_right_proxies_and_counts_what_they_cost(tmp_path, monkeypatch):
    cfg, paths, calls = _halving_search(tmp_path, monkeypatch)
    recs = {r["mixture_id"]: r for r in search.read_results(paths)}
    for it in (0, 1):
        rungs = json.loads(paths.search.rungs(it).read_text())
        assert len(rungs) == 8 and all(r["tokens"] == 10 * 100 for r in rungs.values())
        by_rung = sorted(rungs, key=lambda m: rungs[m]["objective"])
        went_on = [m for m in rungs if "rung" in recs[m]]
        # The best quarter by the value at the rung continued, and (from the second iteration on,
        # with a curve model) any within its band; the rest stopped.
        assert set(went_on) == set(by_rung[:len(went_on)]) and 2 <= len(went_on) <= 4
        for m in rungs:
            r = recs[m]
            if m in went_on:
                assert ("continue", m) in calls and r["objective"] == pytest.approx(_bowl(r["weights"]))
                assert r["tokens"] == 40 * 100 and r["rung"]["objective"] == rungs[m]["objective"]
            else:
                assert ("continue", m) not in calls and r["tokens"] == 10 * 100
                # Its predicted final: the rung value plus the mean shift of the proxies that went on.
                assert r["stopped"]["objective"] == rungs[m]["objective"]
                assert r["objective"] == pytest.approx(rungs[m]["objective"] - 0.3, abs=0.05)
        assert not list((paths.search.dir / "checkpoints").glob("it%d-*" % it))
    assert all(r["iteration"] == 2 and "rung" not in r for m, r in recs.items() if m.startswith("it2"))
    assert sum(1 for c in calls if c[0] == "full") == 4 + 2 * 3  # the last iteration, the comparison
    # The account: stopped proxies cost their rung, continued ones their whole run.
    acct = compute_account(paths)["by_purpose"]["search"]
    assert acct["tokens"] == sum(r["tokens"] for r in recs.values())
    assert acct["token_params"] == 10 * acct["tokens"]
    # The found mixture is one trained to the end.
    best = json.loads(paths.search.mixture.read_text())["best_seen"]["mixture_id"]
    assert "stopped" not in recs[best]


def test_a_halving_search_killed_in_its_continuations_resumes_to_the_same_outputs(tmp_path, monkeypatch):
    cfg, paths, calls = _halving_search(tmp_path, monkeypatch)
    want = search.read_results(paths)
    # A kill after the second iteration's first continuation: its rungs and checkpoints on
    # disk, the log up to that record.
    lines = paths.search.results.read_text().splitlines()
    cut = next(i for i, x in enumerate(lines) if json.loads(x)["iteration"] == 1 and "rung" in json.loads(x))
    paths.search.results.write_text("".join(x + "\n" for x in lines[:cut + 1]))
    for f in paths.search.dir.glob("plan_2.json"):
        f.unlink()
    for m in json.loads(paths.search.rungs(1).read_text()):
        paths.search.checkpoint(m).write_text("paused")
    calls.clear()
    search.run(cfg, paths)
    strip = lambda rs: [{k: v for k, v in r.items() if k != "seconds"} for r in rs]  # noqa: E731
    assert strip(search.read_results(paths)) == strip(want)
    assert not any(c[0] == "rung" for c in calls)  # no rung trained again


# ----------------------------------------------------------------- end to end, built-in trainer
def _builtin_cfg(cfg, tmp_path, *sets):
    shard = sorted(cfg.corpus.paths)[0].replace("*.parquet", "part-00000.parquet")
    pc = dataclasses.replace(cfg.proxy, command="", n_layer=1, n_embd=32, steps=24, batch_size=4, warmup_steps=2,
                             device="cpu", curve_points=4)
    tc = dataclasses.replace(cfg.target, texts=(shard,), objective=("bpb",))
    return dataclasses.replace(cfg, proxy=pc, target=tc)


@pytest.mark.parametrize("setting", [{"halving": (0.25, 0.5)}, {"experts": 0.5}, {"experts": 0.5, "tasks": True}],
                         ids=["halving", "experts", "experts on texts and a task"])
def test_a_cheaper_search_runs_end_to_end_on_the_builtin_trainer(tmp_path, monkeypatch, setting):
    cfg, paths, _, _ = prepare(tmp_path, monkeypatch, "search.iterations=[4, 4, 2]", "search.replicates=1",
                               "search.replicate_seeds=1", "executor.processes=1")
    cfg = _builtin_cfg(cfg, tmp_path)
    if setting.pop("tasks", False):  # the objective: the mean of the texts' bpb and a task's gold loss per byte
        task = tmp_path / "task.jsonl"
        task.write_text("\n".join(json.dumps(x) for x in [
            {"query": "alpha beta", "choices": [" gamma delta", " epsilon"], "gold": 0},
            {"context": "one two three", "continuation": " four five six seven"}]) + "\n")
        cfg = dataclasses.replace(cfg, target=dataclasses.replace(cfg.target, tasks={"t": str(task)},
                                                                  objective=("bpb", "t/gold_loss_per_byte")))
    cfg = dataclasses.replace(cfg, search=dataclasses.replace(cfg.search, **setting))
    tokenize.run(cfg, paths)
    stats = search.run(cfg, paths)
    recs = search.read_results(paths)
    assert len(recs) == 10 and all(r["status"] == "ok" for r in recs)
    by = compute_account(paths)["by_purpose"]
    full = 24 * 4 * cfg.proxy.seq_len
    if "halving" in setting:
        stopped = [r for r in recs if "stopped" in r]
        went_on = [r for r in recs if "rung" in r]
        assert len(went_on) >= 4 and stopped and all(r["tokens"] == 6 * 4 * cfg.proxy.seq_len for r in stopped)
        assert all(r["tokens"] == full and r["curve"]["step"][-1] == 24 for r in went_on)
        assert stats["stopped_proxies"] == len(stopped)
        assert by["search"]["tokens"] < len(recs) * full
        assert f"{len(stopped)} stopped at 0.25 of their steps by successive halving" in _report(cfg, paths)
    else:
        experts = json.loads(paths.search.experts.read_text())
        k = stats["clusters"]
        assert len(experts) == k == stats["expert_proxies"] and by["experts"]["proxies"] == k
        assert all(r["tokens"] == full // 2 and sum(r["weights"]) == 1.0 and max(r["weights"]) == 1.0
                   for r in experts.values())
        lp = np.load(paths.search.expert_logprobs(0))
        coef = np.load(proxy_runs.coef_path(paths.search.expert_logprobs(0)))
        assert lp.shape == coef.shape and (lp <= 0).all()
        # An expert's own objective on the target is what its log-probabilities give.
        for c in range(k):
            lp = np.load(paths.search.expert_logprobs(c))
            e = experts[f"expert-{c:03d}"]["objective"]
            assert -(coef * lp.astype(np.float64)).sum() == pytest.approx(e, rel=1e-5)
        report = _report(cfg, paths)
        assert "after one expert per cluster trained 0.5 of the steps" in report
        # How the experts rank the measured mixtures, per iteration, recomputed from the records.
        from scipy.stats import spearmanr
        from climb.optimize.experts import ensemble_loss
        skill = json.loads(paths.search.quality.read_text())["experts_spearman"]
        assert len(skill) == 3 and "experts' ensemble loss against the measured results" in report
        logp = np.stack([np.load(paths.search.expert_logprobs(c)) for c in range(k)], 1).astype(np.float64)
        seen = sorted(recs, key=lambda r: r["mixture_id"])
        f = ensemble_loss(logp, coef, np.array([r["weights"] for r in seen]))
        full_skill = spearmanr(f, [r["objective"] for r in seen]).statistic
        assert logp.shape[0] <= search_cheap.EXPERT_TOKENS  # so the feature scores every target token, as here
        assert skill[-1] == pytest.approx(full_skill, abs=1e-9)
        # The simulated re-runs do not model a search the experts steer: no figure, no warning from it, and
        # the report says why.
        st = json.loads(paths.search.quality.read_text())["steadiness"]
        assert "rerun_sd" not in st and st["rerun_skipped"] == "experts' ensemble loss"
        assert "not simulated for a search steered by the experts' ensemble loss" in report
        assert not any("move with the search seed" in w
                       for w in json.loads(paths.search.quality.read_text())["warnings"])
    # The summary's proxy count is the account's: experts and stopped proxies included.
    summary = json.loads((paths.root / "report" / "summary.json").read_text())
    assert summary["proxies_trained"] == summary["compute"]["total"]["proxies"]


def _report(cfg, paths) -> str:
    from climb import pipeline
    pipeline.run_stage("report", cfg, paths.root)
    return (paths.root / "report" / "report.md").read_text()


def test_experts_skill_ranks_a_runs_measured_mixtures_by_another_runs_experts(tmp_path):
    """benchmarks/experts_skill.py: the experts of one run (clusters 0 and 2 of 3) scoring the
    search proxies of another, against a direct computation."""
    from scipy.stats import spearmanr

    from benchmarks.experts_skill import skill
    rng = np.random.default_rng(1)
    logp = np.log(rng.uniform(0.01, 1.0, size=(50, 2)))
    coef = np.full(50, 0.02)
    folder = tmp_path / "experts" / "search" / "experts"
    folder.mkdir(parents=True)
    for j, c in enumerate((0, 2)):
        np.save(folder / f"cluster_{c:03d}.npy", logp[:, j].astype(np.float32))
        np.save(folder / f"cluster_{c:03d}.coef.npy", coef)
    W = rng.dirichlet(np.ones(3), size=12)
    direct = ensemble_loss(logp.astype(np.float32), coef, W[:, [0, 2]])
    y = direct ** 2 + rng.normal(0, 0.01, 12)  # monotone in the feature, with noise
    measured = tmp_path / "measured" / "search"
    measured.mkdir(parents=True)
    rows = [{"mixture_id": f"it0-{i:03d}", "seed": 0, "weights": list(w), "objective": float(v), "status": "ok"}
            for i, (w, v) in enumerate(zip(W, y))]
    rows.append({"mixture_id": "it0-999", "seed": 0, "weights": [1 / 3] * 3, "objective": None,
                 "status": "failed"})  # not counted
    (measured / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = skill(tmp_path / "experts", tmp_path / "measured")
    assert out["mixtures"] == 12
    assert out["spearman"] == pytest.approx(spearmanr(direct, y).statistic)
    assert out["ensemble_range"] == pytest.approx([direct.min(), direct.max()], rel=1e-6)
