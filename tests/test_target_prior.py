"""search.target_prior: the target's affinity to clusters and the pool drawn partly around it."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from climb.config import RunConfig, ConfigError
from climb.config.checks import check_config
from climb.stages.search.affinity import pool_prior, unigram_affinity
from climb.stages.search.common import candidate_pool


def test_unigram_affinity_sends_each_document_to_the_cluster_it_reads_like():
    counts = np.array([[50, 50, 0, 0], [0, 0, 50, 50], [25, 25, 25, 25]], float)
    docs = [[0, 1, 0], [2, 3, 3], [3, 2], [1], []]
    out = unigram_affinity(counts, docs, np.array([True, True, True]))
    assert out["docs"] == 4  # the empty document is not counted
    assert out["share"] == pytest.approx([0.5, 0.5, 0.0])


def test_unigram_affinity_never_names_an_unusable_cluster():
    counts = np.array([[50, 50, 0, 0], [0, 0, 50, 50]], float)
    out = unigram_affinity(counts, [[0, 1], [2, 3]], np.array([False, True]))
    assert out["share"] == pytest.approx([0.0, 1.0])


def test_pool_prior_blends_half_and_half_and_keeps_every_usable_cluster():
    natural = np.array([0.5, 0.3, 0.2, 0.0])
    q = pool_prior(natural, 1.0, np.array([0.0, 0.0, 1.0, 0.0]))
    assert q == pytest.approx([0.25, 0.15, 0.6, 0.0])


def _space(k=8):
    natural = np.full(k, 1 / k)
    return {"natural": natural, "uniform": natural, "max_weight": np.ones(k), "usable": np.ones(k, bool)}


def _cfg(frac):
    cfg = RunConfig()
    return dataclasses.replace(cfg, search=dataclasses.replace(cfg.search, target_prior=frac))


def test_the_pool_leans_toward_the_target_clusters_by_the_share_asked():
    space = _space()
    space["target"] = np.array([1.0, 0, 0, 0, 0, 0, 0, 0])
    lean = [candidate_pool(_cfg(f), space, 2000, 3)[:, 0].mean() for f in (0.0, 0.5, 1.0)]
    assert lean[0] == pytest.approx(1 / 8, abs=0.02)
    assert lean[0] < lean[1] < lean[2]
    assert lean[2] == pytest.approx(0.5 * 1 + 0.5 / 8, abs=0.05)  # around the blend, not the target alone


def test_the_pool_holds_the_bounds_and_is_deterministic():
    space = _space()
    space["max_weight"] = np.full(8, 0.4)
    space["target"] = np.array([0.9, 0.1, 0, 0, 0, 0, 0, 0])
    cfg = _cfg(0.5)
    a, b = candidate_pool(cfg, space, 500, 7), candidate_pool(cfg, space, 500, 7)
    assert np.array_equal(a, b)
    assert (a <= 0.4 + 1e-9).all() and np.allclose(a.sum(1), 1)
    assert ((a == 0) | (a >= cfg.search.min_weight - 1e-12)).all()


def test_without_an_affinity_the_pool_is_the_natural_one():
    space = _space()
    assert np.array_equal(candidate_pool(_cfg(0.5), space, 200, 1), candidate_pool(_cfg(0.0), space, 200, 1))


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_a_target_prior_outside_0_1_is_refused(bad):
    with pytest.raises(ConfigError, match="search.target_prior"):
        check_config(_cfg(bad))


def test_the_default_keeps_older_search_keys():
    from climb.config import digest
    from climb.config.schema import key_data
    cfg = RunConfig()
    assert "target_prior" not in key_data(cfg.search) and "target_prior" in key_data(_cfg(0.5).search)
    assert digest(cfg.search) != digest(_cfg(0.5).search)
