"""The statistics a run's trust figures rest on: noise tables, paired verdicts, OOF skill, warnings."""
import numpy as np
import pytest

from climb.optimize.quality import noise, oof_spearman, paired_comparison, pooled_noise, seeds_to_resolve, snr, warnings


def test_known_difference_is_better_and_equal_mixtures_not_resolved():
    rng = np.random.default_rng(0)
    seed_effect = rng.normal(0, 0.1, size=8)           # shared by both mixtures: cancels when paired
    base = 3.0 + seed_effect + rng.normal(0, 0.005, 8)
    ours = 2.95 + seed_effect + rng.normal(0, 0.005, 8)
    c = paired_comparison(ours, base, "minimize")
    assert c["verdict"] == "better" and c["seeds"] == 8
    assert c["ci95"][0] < c["diff"] < c["ci95"][1] < 0 and abs(c["diff"] + 0.05) < 0.01
    assert paired_comparison(base, ours, "minimize")["verdict"] == "worse"
    # the same numbers as accuracies: higher is better
    assert paired_comparison(base, ours, "maximize")["verdict"] == "better"
    same = 3.0 + seed_effect + rng.normal(0, 0.005, 8)
    c2 = paired_comparison(same, base, "minimize")
    assert c2["verdict"] == "not resolved" and c2["ci95"][0] < 0 < c2["ci95"][1]


def test_unpaired_noise_would_not_resolve_what_pairing_does():
    # the same 0.05 gap with per-seed noise of 0.1 not shared between mixtures is not resolved by 5 seeds
    rng = np.random.default_rng(1)
    ours, base = 2.95 + rng.normal(0, 0.1, 5), 3.0 + rng.normal(0, 0.1, 5)
    assert paired_comparison(ours, base, "minimize")["verdict"] == "not resolved"


def test_seeds_to_resolve_is_the_first_count_whose_t_interval_excludes_zero():
    # |diff| = 0.01, sd of the differences 0.02: t(0.975, m-1) * 0.02 / sqrt(m) < 0.01 first at m = 18
    assert seeds_to_resolve(0.01, 0.02) == 18
    assert 2.110 * 0.02 / np.sqrt(18) < 0.01 < 2.120 * 0.02 / np.sqrt(17)  # t(0.975, 17), t(0.975, 16)
    assert seeds_to_resolve(-0.01, 0.02) == 18 and seeds_to_resolve(0.0, 0.02) is None
    assert seeds_to_resolve(1e-6, 1.0) is None  # beyond any budget
    # an unresolved comparison says what would resolve it; with that many seeds at the same
    # mean and sd of the differences, the interval excludes zero
    d = np.array([0.03, -0.01, 0.02, -0.02, 0.025])
    c = paired_comparison(d, np.zeros(5), "minimize")
    m = c["seeds_to_resolve"]
    assert c["verdict"] == "not resolved" and m > 5
    from scipy import stats
    assert stats.t.ppf(0.975, m - 1) * d.std(ddof=1) / np.sqrt(m) < abs(d.mean())
    assert "seeds_to_resolve" not in paired_comparison(d - 1, np.zeros(5), "minimize")


def test_paired_comparison_interval_is_the_t_interval():
    d = np.array([0.1, -0.2, 0.05, 0.3])
    c = paired_comparison(d, np.zeros(4), "minimize")
    half = 3.182446 * d.std(ddof=1) / 2  # t(0.975, 3)
    assert c["diff"] == pytest.approx(d.mean())
    assert c["ci95"] == pytest.approx([d.mean() - half, d.mean() + half], rel=1e-5)


def test_paired_comparison_skips_failed_seeds():
    c = paired_comparison([1.0, np.nan, 1.1], [2.0, 2.0, np.nan], "minimize")
    assert c["seeds"] == 1 and c["verdict"] == "not resolved" and c["ci95"] is None


def test_noise_separates_seed_noise_from_what_pairing_cancels():
    rng = np.random.default_rng(2)
    seed_effect = rng.normal(0, 0.2, size=400)
    table = np.array([m + seed_effect + rng.normal(0, 0.03, 400) for m in (1.0, 1.5, 2.0)])
    n = noise(table)
    assert n["seed_sd"] == pytest.approx(np.sqrt(0.2 ** 2 + 0.03 ** 2), rel=0.1)
    assert n["paired_sd"] == pytest.approx(0.03, rel=0.1)
    assert noise(table[:1])["seed_sd"] is None
    pooled = pooled_noise([table[:, :200], table[:, 200:]])
    assert pooled["paired_sd"] == pytest.approx(0.03, rel=0.1) and pooled["df"] == 2 * 2 * 199


def test_snr_and_oof_spearman():
    assert snr([1.0, 2.0, 3.0], 0.5) == pytest.approx(2.0)
    assert snr([1.0, 2.0], 0.5) is None
    rng = np.random.default_rng(3)
    X = rng.dirichlet(np.ones(5), size=40)
    y = X @ np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    assert oof_spearman(X, y, "linear") > 0.95
    assert abs(oof_spearman(X, rng.normal(size=40), "linear")) < 0.5
    assert oof_spearman(X[:4], y[:4], "linear") is None


def test_weak_signal_warning_names_what_to_change():
    weak = warnings({"snr": 1.0, "predictor_oof_spearman": [0.2, 0.1],
                     "comparison": {"natural": {"verdict": "not resolved", "seeds": 5}}})
    assert len(weak) == 3
    assert "proxy.steps" in weak[0] and "0.10" in weak[1] and "search.eval_seeds" in weak[2]
    assert warnings({"snr": 5.0, "predictor_oof_spearman": [0.8],
                     "comparison": {"natural": {"verdict": "better", "seeds": 5}}}) == []


def test_an_expert_feature_that_ranks_against_the_results_is_named():
    # The bench preset's seed 10: -0.80, -0.49, -0.26 over its three rounds; eleven demo runs end at 0.71-0.98.
    weak = warnings({"snr": 5.0, "experts_spearman": [0.9, -0.49, -0.26]})
    assert len(weak) == 1 and "-0.26" in weak[0] and "search.experts = 0" in weak[0]
    assert warnings({"snr": 5.0, "experts_spearman": [-0.2, 0.71]}) == []  # the last iteration counts
    assert warnings({"snr": 5.0, "experts_spearman": [None]}) == []
