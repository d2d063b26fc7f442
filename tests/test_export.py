"""climb.export: choosing how often each document is exported (select), the budget, the weights."""
from __future__ import annotations

import numpy as np
import pytest

from climb.export import budget_for, check_weights, select


def _toy(seed: int = 0):
    """4 clusters of different sizes plus pruned documents (cluster -1), 1..60 tokens each."""
    rng = np.random.default_rng(seed)
    sizes = {0: 40, 1: 25, 2: 60, 3: 10, -1: 15}
    doc_cluster = np.concatenate([np.full(n, c) for c, n in sizes.items()])
    doc_cluster = doc_cluster[rng.permutation(len(doc_cluster))]
    doc_tokens = rng.integers(1, 61, size=len(doc_cluster)).astype(np.int64)
    return doc_cluster, doc_tokens


def _realised(doc_cluster, doc_tokens, copies, c):
    m = doc_cluster == c
    return int((copies[m] * doc_tokens[m]).sum())


def _check_select(doc_cluster, doc_tokens, weights, budget, cap, seed):
    copies, info = select(doc_cluster, doc_tokens, np.asarray(weights, float), budget, cap, seed)
    assert copies.shape == doc_cluster.shape and (copies >= 0).all()
    assert (copies[doc_cluster < 0] == 0).all()  # pruned documents are never exported
    per = info["clusters"]
    assert [p["cluster"] for p in per] == list(range(len(weights)))
    for c, w in enumerate(weights):
        m = doc_cluster == c
        have = int(doc_tokens[m].sum())
        want = w * budget
        goal = min(want, cap * have)
        got = _realised(doc_cluster, doc_tokens, copies, c)
        p = per[c]
        assert p["tokens"] == got and p["tokens_available"] == have
        assert p["tokens_wanted"] == round(want)
        assert p["capped"] == (want > cap * have + 0.5)
        if goal <= 0:
            assert got == 0 and (copies[m] == 0).all()
            continue
        # Reaches the goal, overshooting by less than one document of that cluster.
        assert goal - 1e-6 <= got < goal + doc_tokens[m].max()
        # Repeats are even: no document k+1 times while another is taken fewer than k times.
        assert copies[m].max() - copies[m].min() <= 1
        assert int(goal // have) <= copies[m].min() <= copies[m].max() <= int(goal // have) + 1
        assert p["epochs"] == pytest.approx(got / have, abs=1e-4)
    return copies, info


@pytest.mark.parametrize("weights, budget, cap", [
    ([0.4, 0.3, 0.2, 0.1], 3000, 4.0),    # partial first pass everywhere
    ([0.4, 0.3, 0.2, 0.1], 20000, 4.0),   # several epochs, cluster 3 capped
    ([0.1, 0.6, 0.0, 0.3], 9000, 2.0),    # a zero weight, cluster 1 capped at 2 epochs
    ([0.25, 0.25, 0.25, 0.25], 1000, 0.5),  # cap below one epoch
    ([0.0, 0.0, 1.0, 0.0], 5000, 4.0),    # everything from one cluster
])
def test_select_reaches_share_or_cap(weights, budget, cap):
    doc_cluster, doc_tokens = _toy()
    _check_select(doc_cluster, doc_tokens, weights, budget, cap, seed=0)


def test_select_flags_capped_clusters_and_zero_weights():
    doc_cluster, doc_tokens = _toy()
    have = np.bincount(doc_cluster[doc_cluster >= 0], weights=doc_tokens[doc_cluster >= 0])
    cap = 2.0
    # Cluster 3 (smallest) is asked for 3 epochs' worth; the others stay below the cap.
    budget = int(3 * have[3] / 0.3)
    w = [0.5, 0.2, 0.0, 0.3]
    copies, info = _check_select(doc_cluster, doc_tokens, w, budget, cap, seed=1)
    flags = [p["capped"] for p in info["clusters"]]
    assert flags == [w_ * budget > cap * h for w_, h in zip(w, have)]
    assert flags == [False, False, False, True]
    # The capped cluster got exactly `cap` whole epochs (integer cap: no partial pass).
    m3 = doc_cluster == 3
    assert (copies[m3] == 2).all()
    assert info["clusters"][3]["tokens"] == 2 * have[3] and info["clusters"][3]["epochs"] == 2.0
    # Weight 0: nothing from cluster 2.
    assert (copies[doc_cluster == 2] == 0).all() and info["clusters"][2]["tokens"] == 0


def test_select_multi_epoch_is_even():
    doc_cluster = np.zeros(10, int)
    doc_tokens = np.full(10, 10)
    copies, info = select(doc_cluster, doc_tokens, np.array([1.0]), 250, 4.0, seed=0)
    # 250 tokens of a 100-token cluster: 2 full passes + 5 documents of a third.
    assert sorted(copies.tolist()) == [2] * 5 + [3] * 5
    assert info["clusters"][0]["tokens"] == 250 and not info["clusters"][0]["capped"]
    copies, info = select(doc_cluster, doc_tokens, np.array([1.0]), 10_000, 4.0, seed=0)
    assert (copies == 4).all() and info["clusters"][0]["capped"] and info["clusters"][0]["tokens"] == 400


def test_select_deterministic_for_seed_and_varies_with_seed():
    doc_cluster, doc_tokens = _toy()
    w = np.array([0.4, 0.3, 0.2, 0.1])
    a, ia = select(doc_cluster, doc_tokens, w, 2500, 4.0, seed=7)
    b, ib = select(doc_cluster, doc_tokens, w, 2500, 4.0, seed=7)
    np.testing.assert_array_equal(a, b)
    assert ia == ib
    c, _ = select(doc_cluster, doc_tokens, w, 2500, 4.0, seed=8)
    assert not np.array_equal(a, c)
    # A different seed picks different documents, not different amounts.
    for cl in range(4):
        assert _realised(doc_cluster, doc_tokens, c, cl) < w[cl] * 2500 + doc_tokens[doc_cluster == cl].max()


def test_budget_for_given_budget_passes_through():
    assert budget_for(np.array([0.5, 0.5]), np.array([10.0, 10.0]), 4.0, 123) == 123


def test_budget_for_largest_uncapped_budget():
    doc_cluster, doc_tokens = _toy()
    have = np.bincount(doc_cluster[doc_cluster >= 0], weights=doc_tokens[doc_cluster >= 0], minlength=4)
    w = np.array([0.5, 0.3, 0.0, 0.2])
    cap = 3.0
    b = budget_for(w, have, cap, 0)
    pos = w > 0
    # No cluster exceeds its cap at b; one more token would push some cluster over.
    assert (w[pos] * b <= cap * have[pos] + 1e-6).all()
    assert (w[pos] * (b + 1) > cap * have[pos]).any()
    # Hand computed: the binding cluster is the one with the least cap*tokens/weight.
    assert b == int(np.floor(min(cap * have[c] / w[c] for c in (0, 1, 3))))
    # A zero-weight cluster never limits the budget, even an empty one.
    have0 = have.copy()
    have0[2] = 0
    assert budget_for(w, have0, cap, 0) == b
    # select at that budget flags nothing and exports about b tokens in total.
    copies, info = _check_select(doc_cluster, doc_tokens, w, b, cap, seed=0)
    assert not any(p["capped"] for p in info["clusters"])
    total = sum(p["tokens"] for p in info["clusters"])
    assert b <= total < b + 3 * doc_tokens.max()


def test_budget_for_hand_example():
    # cap * tokens / weight = 4*1000/0.5 = 8000, 4*100/0.3 = 1333.3, 4*1000/0.2 = 20000 -> 1333
    assert budget_for(np.array([0.5, 0.3, 0.2]), np.array([1000.0, 100.0, 1000.0]), 4.0, 0) == 1333


def test_check_weights_returns_validated_array():
    w = check_weights([0.2, 0.8], 2, "w")
    assert isinstance(w, np.ndarray) and w.tolist() == [0.2, 0.8]
    with pytest.raises(Exception, match=r"mix\.json: weights sum to 1\.100000, not 1"):
        check_weights([0.3, 0.8], 2, "mix.json")
