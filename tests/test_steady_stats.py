"""The steady-answer benchmark's own statistics: the found mixtures' spread with the comparison's
noise taken out, and replays of one arm written side by side without losing each other's proxies."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from benchmarks.steady_pick import _keep_replay, between_sd, term_noise

REPO = Path(__file__).resolve().parents[1]


def _table(rng, between, noise, seeds=8, evals=10):
    """Found objectives on shared comparison seeds: a search seed's own effect, a comparison seed's
    effect common to every run, and each proxy's noise."""
    return (rng.normal(0, between, (seeds, 1)) + rng.normal(0, 0.01, (1, evals))
            + rng.normal(0, noise, (seeds, evals)))


def test_between_sd_recovers_a_planted_spread_under_noise_larger_than_it():
    rng = np.random.default_rng(0)
    est, raw, covered = [], [], 0
    for _ in range(600):
        b = between_sd(_table(rng, 0.003, 0.013))
        est.append(b["estimate"] ** 2)
        raw.append(b["raw"] ** 2)
        covered += b["lower95"] <= 0.003
    # The raw sd carries the noise of a ten-seed mean (0.013 / sqrt(10) = 0.0041): larger than the spread.
    assert np.sqrt(np.mean(raw)) > 0.0045
    assert abs(np.sqrt(np.mean(est)) - 0.003) < 0.0006
    assert covered / 600 >= 0.93


def test_between_sd_is_zero_for_a_table_of_noise_alone_and_reads_a_quiet_spread_exactly():
    rng = np.random.default_rng(1)
    zero = [between_sd(_table(rng, 0.0, 0.013))["estimate"] for _ in range(200)]
    assert np.median(zero) < 0.001
    quiet = between_sd(_table(rng, 0.01, 1e-6))
    assert abs(quiet["estimate"] - quiet["raw"]) < 1e-5 and quiet["noise"] < 1e-5


def test_two_replays_of_one_arm_written_at_once_keep_every_entry(tmp_path):
    f = tmp_path / "replays.json"
    code = ("import sys; from pathlib import Path; from benchmarks.steady_pick import _keep_replay\n"
            "for i in range(40): _keep_replay(Path(sys.argv[1]), f'{sys.argv[2]}/s{i}', {'i': i})\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(f), who], cwd=REPO) for who in ("a", "b")]
    assert all(p.wait() == 0 for p in procs)
    got = json.loads(f.read_text())
    assert len(got) == 80 and got["a/s39"] == {"i": 39} and got["b/s0"] == {"i": 0}
    _keep_replay(f, "a/s0", {"i": -1})  # a later write of one entry replaces it and keeps the rest
    got = json.loads(f.read_text())
    assert len(got) == 80 and got["a/s0"] == {"i": -1}


def test_the_noisy_term_carries_the_objective_noise_and_the_shares_sum_to_one():
    rng = np.random.default_rng(3)
    M, E = 18, 10
    level = rng.normal(0, 0.02, (M, 1))  # each mixture's own level, common to the terms
    common = rng.normal(0, 0.01, (M, E))  # a model-level seed effect every term reads
    seed = rng.normal(0, 0.01, (1, E))  # a comparison seed's effect on every mixture
    tables = {"quiet": level + seed + common + rng.normal(0, 0.002, (M, E)),
              "loud": level + seed + common + rng.normal(0, 0.04, (M, E))}
    got = term_noise(tables, {"quiet": 0.5, "loud": 0.5})
    shares = {t: v["share"] for t, v in got["terms"].items()}
    assert abs(sum(shares.values()) - 1) < 1e-9
    assert shares["loud"] > 0.8 > 0.2 > shares["quiet"]
    assert got["terms"]["loud"]["noise_sd"] > 3 * got["terms"]["quiet"]["noise_sd"]
    # The objective's residual is the coefficients' combination of the terms' residuals.
    both = term_noise({"x": 0.5 * tables["quiet"] + 0.5 * tables["loud"]}, {"x": 1.0})
    assert abs(both["objective_noise_sd"] - got["objective_noise_sd"]) < 1e-12
    # Noise common to both terms shows as their residual correlation.
    assert got["residual_corr"]["quiet ~ loud"] > 0


def test_a_term_with_a_negative_coefficient_still_sums_to_one():
    rng = np.random.default_rng(4)
    t = {"loss": rng.normal(0, 0.01, (6, 5)), "acc": rng.normal(0, 0.01, (6, 5))}
    got = term_noise(t, {"loss": 0.5, "acc": -0.5})
    assert abs(sum(v["share"] for v in got["terms"].values()) - 1) < 1e-9


def _base_world(tmp_path, monkeypatch, here, got):
    import benchmarks.steady_pick as sp
    import benchmarks.variant_pair as vp
    import climb.runtime.proxy_runs as pr
    import climb.stages.search.common as sc
    monkeypatch.setattr(sp, "RECORDS", tmp_path)
    monkeypatch.setattr(sp, "_checked", {})
    monkeypatch.setattr(sp, "run_config", lambda *a, **k: None)
    base = tmp_path / f"base-{len(list(tmp_path.glob('base-*')))}"  # a fresh base folder per world
    base.mkdir()
    monkeypatch.setattr(sp, "names", lambda *a, **k: base)
    monkeypatch.setattr(vp, "base_digest", lambda run: here)
    monkeypatch.setattr(sc, "proxy_task", lambda *a, **k: a[4])
    trained = []
    monkeypatch.setattr(pr, "train_and_score", lambda t: trained.append(t) or {"objective": got})
    (tmp_path / "g49x_default_s20.json").write_text(json.dumps(
        {"base": "old", "search_seed": 20, "comparison_seeds": [7],
         "comparison": {"natural/7": {"weights": [0.5, 0.5], "objective": 2.5}}}))
    return sp, trained


def test_a_replay_is_refused_on_a_base_other_than_the_one_its_run_searched_on(tmp_path, monkeypatch):
    import pytest
    rec = {"base": "old", "search_seed": 21, "comparison_seeds": [7], "comparison": {}}
    sp, trained = _base_world(tmp_path, monkeypatch, "old", 2.5)
    assert sp.same_base("x", rec) == "same digest" and not trained  # nothing trained for the same bytes
    sp, trained = _base_world(tmp_path, monkeypatch, "new", 2.5 + 2e-8)
    assert "rebuilt base" in sp.same_base("x", rec) and trained == [[0.5, 0.5]]
    sp.same_base("x", rec)
    assert len(trained) == 1  # checked once per pair of digests
    monkeypatch.setattr(sp, "_checked", {})  # another process on the same base folder
    assert "rebuilt base" in sp.same_base("x", rec) and len(trained) == 1  # kept in the folder
    sp, trained = _base_world(tmp_path, monkeypatch, "new", 2.501)
    with pytest.raises(SystemExit, match="not the base"):
        sp.same_base("x", rec)
    sp, trained = _base_world(tmp_path, monkeypatch, "new", 2.5)
    with pytest.raises(SystemExit, match="no record on that base"):
        sp.same_base("x", dict(rec, base="elsewhere"))


def test_a_recorded_run_restored_on_a_new_machine_must_find_its_record_mixture(tmp_path, monkeypatch):
    import pytest

    import benchmarks.steady_pick as sp
    monkeypatch.setattr(sp, "RECORDS", tmp_path)
    monkeypatch.setattr(sp, "names", lambda preset, seed=None, arm="default":
                        tmp_path / ("base" if seed is None else f"g49x_{arm}_s{seed}"))
    (tmp_path / "base" / "tokenize").mkdir(parents=True)
    (tmp_path / "base" / "tokenize" / "manifest.json").write_text("{}")
    (tmp_path / "g49x_default_s20.json").write_text(json.dumps({"mixtures": {"weights": [0.25, 0.75]}}))
    runs = []

    def search(preset, seed, arm, baselines, weights):
        run = sp.names(preset, seed, arm)
        (run / "search").mkdir(parents=True, exist_ok=True)
        (run / "search" / "mixture.json").write_text(json.dumps({"weights": weights}))
        runs.append(baselines)
        return run
    monkeypatch.setattr(sp, "_search_run", lambda *a, **k: search(*a, **k, weights=[0.25, 0.75]))
    assert sp.restore("x", 20).name == "g49x_default_s20" and runs == [False]  # no baselines trained again
    monkeypatch.setattr(sp, "_search_run", lambda *a, **k: search(*a, **k, weights=[0.5, 0.5]))
    with pytest.raises(SystemExit, match="another mixture than its record"):
        sp.restore("x", 20)


def test_r_star_is_the_holding_rule_with_the_lower_mean_and_none_before_eight_seeds(monkeypatch):
    import pytest

    import benchmarks.steady_pick as sp
    seeds = list(range(20, 28))
    got = {}
    monkeypatch.setattr(sp, "judge", lambda preset, s, arm, out, rule: got[rule])

    def reading(diff, upper, n=8):
        return {"seeds": seeds[:n], "minus_arm_seen": {"diff": diff, "ci95": [diff - 0.01, upper]}}
    got.update({"measured-denoised": reading(-0.006, -0.001), "measured-mean4": reading(-0.004, -0.0005)})
    assert sp.r_star() == "measured-denoised"
    got["measured-mean4"] = reading(-0.008, -0.002)
    assert sp.r_star() == "measured-mean4"  # both hold: the lower mean
    got["measured-mean4"] = reading(-0.009, +0.001)
    assert sp.r_star() == "measured-denoised"  # a lower mean that does not hold is not R*
    got["measured-denoised"] = reading(-0.006, +0.0001)
    assert sp.r_star() is None
    got["measured-denoised"] = reading(-0.006, -0.001, n=7)
    with pytest.raises(SystemExit, match="not all of"):
        sp.r_star()


def _more_world(tmp_path, monkeypatch, objective):
    """steady_pick's more_seeds with proxies faked: `objective(weights, seed)` is what one trains to."""
    import contextlib

    import benchmarks.steady_pick as sp
    import climb.runtime.executor as ex
    import climb.stages.search.common as sc
    monkeypatch.setattr(sp, "RECORDS", tmp_path)
    monkeypatch.setattr(sp, "ensure_base", lambda preset: tmp_path)
    monkeypatch.setattr(sp, "same_base", lambda preset, rec: "same digest")
    monkeypatch.setattr(sp, "run_config", lambda *a, **k: type("C", (), {"executor": None})())
    monkeypatch.setattr(sp, "replay_pick", lambda preset, rec, rule, arm: {"weights": [0.5, 0.5]})
    monkeypatch.setattr(ex, "make_executor", lambda cfg, n: contextlib.nullcontext())
    monkeypatch.setattr(sc, "proxy_task", lambda cfg, base, name, it, w, seed: (list(w), seed))
    trained = []

    def run(cfg, executor, tasks, desc, on_record):
        for i, (w, seed) in enumerate(tasks):
            trained.append((tuple(w), seed))
            on_record(i, {"objective": objective(w, seed)})
    monkeypatch.setattr(sc, "run_proxies", run)
    for arm, w in (("target-last", [0.2, 0.8]), ("default", [0.9, 0.1])):
        for s in (20, 21, 22):
            (tmp_path / f"g49x_{arm}_s{s}.json").write_text(json.dumps({"goal": "minimize",
                                                                         "mixtures": {"weights": w}}))
    return sp, trained


def test_picks_on_further_comparison_seeds_resume_and_are_judged_on_those_seeds_alone(tmp_path, monkeypatch):
    import pytest
    noise = {(s, c): 0.002 * ((7 * s + 3 * c) % 5 - 2) for s in (20, 21, 22) for c in (1, 2, 3, 4)}
    sp, trained = _more_world(tmp_path, monkeypatch, lambda w, c: 2.0 + w[0] + 0.001 * c)
    sp.more_seeds("x", [20], "measured-mean4", "target-last", [1, 2])
    assert trained == [((0.5, 0.5), 1), ((0.5, 0.5), 2)]  # the rule's pick, not the run's own
    sp.more_seeds("x", [20], "measured-mean4", "target-last", [1, 2, 3])
    assert trained[2:] == [((0.5, 0.5), 3)]  # only what no proxy holds yet
    sp.more_seeds("x", [20], "seen", "default", [1])
    assert trained[3:] == [((0.9, 0.1), 1)]  # "seen": the record's own pick
    with pytest.raises(SystemExit, match="nothing judged"):
        sp.judge_more("x", [20, 21], "measured-mean4", "target-last", [1, 2, 3], None)

    # three search seeds whose picks differ by a planted 0.03 a seed, under noise; the default 0.15 worse
    objective = {"target-last": lambda s: (lambda w, c: 2.0 + 0.03 * (s - 20) + noise[s, c]),
                 "default": lambda s: (lambda w, c: 2.15 + noise[s, c])}
    kept, fresh = {}, tmp_path / "fresh"
    fresh.mkdir()
    for arm, rule in (("target-last", "measured-mean4"), ("default", "seen")):
        for s in (20, 21, 22):
            sp, _ = _more_world(fresh, monkeypatch, objective[arm](s))
            sp.more_seeds("x", [s], rule, arm, [1, 2, 3, 4])
        kept[arm] = json.loads(sp.more_file("x", arm).read_text())
    got = sp.judge_more("x", [20, 21, 22], "measured-mean4", "target-last", [2, 3, 4], None)
    assert got["found"]["20"] == pytest.approx(2.0 + np.mean([noise[20, c] for c in (2, 3, 4)]))  # seed 1 not read
    assert got["minus_default"]["diff"] < 0 and got["checks"]["paired_upper"]
    assert got["between_sd"]["estimate"] == pytest.approx(0.03, abs=0.005)  # the planted spread, noise out
    assert not got["checks"]["sd"] and not got["passes"]
    tight = sp.judge_more("x", [20, 21, 22], "measured-mean4", "target-last", [2, 3, 4], None, sd_limit=1.0)
    assert tight["passes"]


def test_further_seeds_refuse_a_pick_that_is_not_the_replayed_one(tmp_path, monkeypatch):
    import pytest
    sp, trained = _more_world(tmp_path, monkeypatch, lambda w, c: 2.0)
    sp.replays_file("x", "target-last").write_text(json.dumps({"measured-mean4/s20": {"weights": [0.4, 0.6]}}))
    with pytest.raises(SystemExit, match="differs from the replayed one"):
        sp.more_seeds("x", [20], "measured-mean4", "target-last", [1])
    assert not trained


def test_tl_mean4_steps_run_in_order_each_only_after_the_one_before_passed(monkeypatch):
    import pytest

    import benchmarks.steady_pick as sp
    read = {"tech": {"seeds": list(range(20, 30)), "passes": True},
            "sport": {"seeds": list(range(20, 30)), "passes": True}}
    sd = {"checks": {"sd": True}}
    monkeypatch.setattr(sp, "judge", lambda preset, *a, **k: read[preset])
    monkeypatch.setattr(sp, "judge_more", lambda *a, **k: sd)
    assert sp.tl_mean4_gate(3) == 0 and sp.tl_mean4_gate(4) == 0
    sd["checks"]["sd"] = False
    assert sp.tl_mean4_gate(3) == 0 and sp.tl_mean4_gate(4) == 3  # the fresh seeds' sd failed: no step 4
    read["sport"]["passes"] = False
    assert sp.tl_mean4_gate(3) == 3
    read["tech"]["seeds"] = list(range(20, 27))
    with pytest.raises(SystemExit, match="not judged yet"):
        sp.tl_mean4_gate(3)


def test_waiting_reads_again_until_what_it_reads_is_there_and_gives_up_after_its_time():
    import pytest

    import benchmarks.steady_pick as sp
    tries = []

    def read():
        tries.append(1)
        if len(tries) < 3:
            raise SystemExit("not all there yet")
        return "R"
    assert sp.waiting(read, minutes=1, poll=0.01) == "R" and len(tries) == 3
    with pytest.raises(SystemExit, match="not all there"):
        sp.waiting(lambda: (_ for _ in ()).throw(SystemExit("not all there yet")), minutes=0, poll=0.01)
