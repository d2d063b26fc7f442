"""A token store capped per cluster at what the proxies read (tokenize.cap) trains them on the same
batches as the whole store, keeps at most the cap per cluster with each shard in proportion, and
still counts every document.

Run: PYTHONPATH=. python -m pytest tests/test_capped_store.py -q
"""
from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest

from proxies.sampler import MixtureSampler, SwitchSampler
from proxies.tokens import (PartsNeeded, TokenStore, apportion, drop_merged_parts, merge_token_stores,
                            write_shard_tokens)

SEQ, BATCH, STEPS = 8, 6, 12
R = STEPS * BATCH * (SEQ + 1)  # the most tokens one proxy draws from one cluster: 648
SHARDS = ("s0", "s1", "s2")
# Documents per (shard, cluster): clusters 0-2 exceed R (cluster 1 mostly in one shard), cluster 3
# is smaller than R, cluster 4 is empty, cluster 5 holds one shard's documents only.
DOCS = {"s0": [14, 3, 9, 4, 0, 0], "s1": [20, 30, 9, 3, 0, 25], "s2": [6, 2, 9, 5, 0, 0]}


class _IdTok:
    """Each text is its token ids, space-separated; EOS 0."""
    vocab_size, eos_id = 65536, 0

    def encode_batch(self, texts):
        return [[int(w) for w in t.split()] for t in texts]


def _corpus() -> dict[str, tuple[list[str], list[int]]]:
    """Per shard (texts, clusters). A token is 10000 * (cluster + 1) + 1000 * shard + a counter, so
    it tells its cluster and shard; documents run 5 to 60 tokens."""
    rng = np.random.default_rng(0)
    out = {}
    for s, name in enumerate(SHARDS):
        rows = [c for c, n in enumerate(DOCS[name]) for _ in range(n)]
        rng.shuffle(rows)
        texts = []
        for i, c in enumerate(rows):
            base = 10000 * (c + 1) + 1000 * s
            texts.append(" ".join(str(base + (i * 7 + j) % 999 + 1) for j in range(int(rng.integers(5, 61)))))
        out[name] = (texts, rows)
    return out


def _build(path, cap: int, corpus=None):
    corpus = corpus or _corpus()
    for name in corpus:
        write_shard_tokens(*corpus[name], _IdTok(), path, name, cap=cap)
    merge_token_stores(path, list(corpus), 6, cap=cap)
    drop_merged_parts(path, list(corpus))
    return TokenStore(path)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The whole store, one capped at R, and one capped above it."""
    d = tmp_path_factory.mktemp("capped")
    return {cap: _build(d / f"cap{cap}", cap) for cap in (0, R, 2 * R + 7)}


MIXTURES = [[0.5, 0.2, 0.1, 0.1, 0.0, 0.1], [0.0, 1.0, 0, 0, 0, 0], [0.1, 0.1, 0.6, 0.0, 0.0, 0.2],
            [1 / 3, 0.0, 1 / 3, 1 / 3, 0.0, 0.0]]


def _batches(sampler, n: int = STEPS) -> list[np.ndarray]:
    return [sampler.sample_windows() for _ in range(n)]


@pytest.mark.parametrize("exact,common", [(True, True), (False, True), (True, False), (False, False)])
def test_a_capped_store_gives_the_batches_of_the_whole_store(stores, exact, common):
    for i, w in enumerate(MIXTURES):
        runs = [_batches(MixtureSampler(s, np.array(w), SEQ, BATCH, seed=i, exact=exact, common=common,
                                        read_cap=R)) for s in stores.values()]
        for other in runs[1:]:
            assert all(np.array_equal(a, b) for a, b in zip(runs[0], other)), (w, exact, common)
    # the read cap is what makes them equal: the whole store read whole gives other batches
    w = np.array(MIXTURES[1])
    whole = _batches(MixtureSampler(stores[0], w, SEQ, BATCH, seed=1, exact=exact, common=common))
    capped = _batches(MixtureSampler(stores[R], w, SEQ, BATCH, seed=1, exact=exact, common=common))
    assert not all(np.array_equal(a, b) for a, b in zip(whole, capped))


def test_a_continuation_of_a_shared_base_draws_alike_from_every_store(stores):
    natural = stores[0].token_shares()
    switch = STEPS // 3
    got = []
    for s in stores.values():
        after = MixtureSampler(s, np.array(MIXTURES[0]), SEQ, BATCH, seed=5 + 2**32, exact=True, common=True,
                               read_cap=R)
        scratch = SwitchSampler(MixtureSampler(s, natural, SEQ, BATCH, seed=5, exact=True, common=True, read_cap=R),
                                after, switch)
        cont = SwitchSampler(None, MixtureSampler(s, np.array(MIXTURES[0]), SEQ, BATCH, seed=5 + 2**32, exact=True,
                                                  common=True, read_cap=R), switch)
        cont.skip(switch)
        got.append((_batches(scratch), _batches(cont, STEPS - switch)))
    for scratch, cont in got[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(got[0][0], scratch))
        assert all(np.array_equal(a, b) for a, b in zip(got[0][1], cont))
    assert all(np.array_equal(a, b) for a, b in zip(got[0][0][switch:], got[0][1]))


def test_every_store_reads_the_same_head_mapped_or_not(stores):
    for c in range(6):
        for n in (SEQ + 1, 100, R, 0):
            heads = [s.head(c, n or R, mapped=m)[:] for s in stores.values() for m in (False, True)]
            assert all(np.array_equal(heads[0], h) for h in heads[1:]), (c, n)
            assert len(heads[0]) == min(n or R, stores[0].tokens[c])
    # a window across two shards' pieces reads both
    view = stores[0].head(0, R)
    pieces = [p for p in stores[R].pieces(0) if p[2]]
    edge = pieces[1][1]
    assert np.array_equal(view[edge - 3:edge + 3], stores[R].array(0)[edge - 3:edge + 3])


def test_the_capped_files_hold_at_most_the_cap_and_the_index_counts_everything(stores):
    full = stores[0]
    for cap, s in stores.items():
        assert np.array_equal(s.tokens, full.tokens) and np.array_equal(s.bytes, full.bytes)
        assert s.index["docs"] == full.index["docs"] and s.index["shard_tokens"] == full.index["shard_tokens"]
        for name in SHARDS:
            assert np.array_equal(s.doc_tokens(name), full.doc_tokens(name))
        want = np.minimum(full.tokens, cap) if cap else full.tokens
        assert np.array_equal(s.stored, want) and s.index["cap"] == cap
        for c in range(6):
            assert len(s.array(c)) == want[c]
            f = s.path / f"cluster_{c:05d}.bin"
            assert f.stat().st_size == 2 * want[c] if want[c] else not f.exists() or f.stat().st_size == 0
    assert (full.tokens[:3] > R).all() and full.tokens[3] < R and full.tokens[4] == 0
    total = lambda s: sum(f.stat().st_size for f in s.path.rglob("cluster_*.bin"))  # noqa: E731
    assert total(stores[R]) == 2 * int(np.minimum(full.tokens, R).sum()) < 0.65 * total(stores[0])


def test_each_shard_gives_its_share_of_a_capped_cluster(stores):
    s, full = stores[R], stores[0]
    for c in range(6):
        sizes = [full.index["shard_tokens"][n].get(str(c), 0) for n in SHARDS]
        pieces = s.pieces(c)
        whole = {p[0]: full.array(c)[p[1]:p[1] + p[2]] for p in full.pieces(c)}
        longest = max((len(d) for t in _corpus().values() for d in t[0]), default=0) + 1
        for (name, off, n, tokens), size in zip(pieces, sizes):
            assert tokens == size
            # the shard's first tokens of the cluster, about its share of them
            assert abs(n - min(R, full.tokens[c]) * size / max(1, full.tokens[c])) <= min(2, longest)
            part = s.array(c)[off:off + n]
            assert np.array_equal(part, whole[name][:n])
            assert set((part[part > 0] // 1000) % 10) <= {SHARDS.index(name)}
        assert sum(p[2] for p in pieces) == s.stored[c]


def test_apportion_is_a_prefix_of_one_order_and_keeps_the_shares():
    rng = np.random.default_rng(3)
    for _ in range(200):
        sizes = [int(x) for x in rng.integers(0, 40, size=int(rng.integers(1, 6)))]
        order = sorted((Fraction(2 * j + 1, 2 * n), s) for s, n in enumerate(sizes) for j in range(n))
        want = [0] * len(sizes)
        for k in range(sum(sizes) + 2):
            assert apportion(k, sizes) == want, (k, sizes)
            if k < len(order):
                want[order[k][1]] += 1
    # huge counts (products beyond 2**63) and many shards: exact, nested, near the shares
    sizes = [int(x) for x in rng.integers(1, 10**12, size=300)]
    prev = [0] * 300
    for k in (10**6, 10**9, 3 * 10**12, sum(sizes) - 1):
        q = apportion(k, sizes)
        assert sum(q) == k and all(a >= b for a, b in zip(q, prev))
        assert max(abs(a - k * n / sum(sizes)) for a, n in zip(q, sizes)) < 4
        prev = q


def test_the_natural_mixture_and_weight_checks_use_the_full_counts(stores):
    from climb.config import RunConfig
    from climb.stages.search.common import mixture_space
    cfg = RunConfig()
    full, capped = stores[0], stores[R]
    assert np.array_equal(capped.token_shares(), full.token_shares())
    a, b = mixture_space(cfg, full.tokens), mixture_space(cfg, capped.tokens)
    for k in ("natural", "max_weight", "usable"):
        assert np.array_equal(a[k], b[k])
    assert not np.allclose(full.token_shares(), capped.stored / capped.stored.sum())


def test_a_shard_added_or_gone_merges_as_a_fresh_capped_store(tmp_path):
    corpus = _corpus()
    cap = R
    live = tmp_path / "live"
    two = {k: corpus[k] for k in ("s0", "s1")}
    _build(live, cap, two)
    # a shard added: the kept shards' shares of a capped cluster shrink; read from the merged files
    merge_sets = [("s0", "s1", "s2"), ("s0", "s2")]  # then one gone: s0's share grows past what was kept
    for names in merge_sets:
        for name in names:  # only the new shard is tokenized; the others' parts were dropped
            if not (live / "parts" / name / "done.json").exists():
                write_shard_tokens(*corpus[name], _IdTok(), live, name, cap=cap)
        try:
            merge_token_stores(live, list(names), 6, cap=cap)
        except PartsNeeded as e:
            assert names == ("s0", "s2") and "s0" in e.shards
            before = json.loads((live / "index.json").read_text())
            for name in e.shards:  # its part files were dropped: it is tokenized again
                write_shard_tokens(*corpus[name], _IdTok(), live, name, cap=cap)
            assert json.loads((live / "index.json").read_text()) == before  # nothing was changed
            merge_token_stores(live, list(names), 6, cap=cap)
        else:
            assert names == ("s0", "s1", "s2")
        drop_merged_parts(live, list(names))
        fresh = _build(tmp_path / "-".join(names), cap, {k: corpus[k] for k in names})
        got = TokenStore(live)
        assert got.index == fresh.index
        for c in range(6):
            assert np.array_equal(got.array(c), fresh.array(c))


def test_a_part_capped_below_the_store_is_tokenized_again(tmp_path):
    texts, clusters = _corpus()["s1"]
    small = write_shard_tokens(texts, clusters, _IdTok(), tmp_path, "s1", cap=100)
    assert max(small["stored_per_cluster"].values()) == 100 and small["tokens_per_cluster"][1] > 100
    with pytest.raises(PartsNeeded, match="s1"):
        merge_token_stores(tmp_path, ["s1"], 6, cap=R)
    again = write_shard_tokens(texts, clusters, _IdTok(), tmp_path, "s1", cap=R)
    assert again["cap"] == R and max(again["stored_per_cluster"].values()) == R
    assert again["tokens_per_cluster"] == small["tokens_per_cluster"]
    assert merge_token_stores(tmp_path, ["s1"], 6, cap=R)["stored"][1] == R
    # a store merged again at another cap is merged again
    assert merge_token_stores(tmp_path, ["s1"], 6, cap=R // 2)["stored"][1] == R // 2


def test_an_index_from_before_caps_reads_as_uncapped(stores, tmp_path):
    import shutil
    old = tmp_path / "old"
    shutil.copytree(stores[0].path, old)
    index = json.loads((old / "index.json").read_text())
    for key in ("cap", "stored"):
        index.pop(key)
    (old / "index.json").write_text(json.dumps(index))
    s = TokenStore(old)
    assert s.cap == 0 and np.array_equal(s.stored, s.tokens)
    w = np.array(MIXTURES[0])
    a = _batches(MixtureSampler(s, w, SEQ, BATCH, seed=0, exact=True, common=True, read_cap=R))
    b = _batches(MixtureSampler(stores[R], w, SEQ, BATCH, seed=0, exact=True, common=True, read_cap=R))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    # merged again by today's merge at the same cap (none): found complete, left alone
    assert merge_token_stores(old, list(SHARDS), 6) == index


def test_the_cap_is_part_of_the_tokenize_key(monkeypatch, tmp_path):
    from climb.config import load_config
    from climb.config.checks import token_cap
    from climb.runtime.layout import RunPaths
    from climb.stages import tokenize
    monkeypatch.setattr(tokenize, "upstream_key", lambda paths, stage: "clusters")
    paths = RunPaths(tmp_path / "run")

    def key(*sets):
        cfg = load_config(None, ["proxy.steps=10", "proxy.batch_size=4", "proxy.seq_len=16", *sets])
        return tokenize.key(cfg, paths), token_cap(cfg)
    auto, cap = key()
    assert cap == 10 * 4 * 17
    assert key(f"tokenize.cap={cap}") == (auto, cap)  # the same cap, however it is given
    assert key("proxy.steps=20")[0] != auto  # "auto" follows the proxies
    assert key(f"tokenize.cap={2 * cap}")[0] != auto
    # the validation model trains on validate.tokens (2) times the steps: the store keeps enough for it
    assert key("validate.enabled=true") == (key(f"tokenize.cap={2 * cap}")[0], 2 * cap)
    none, _ = key("tokenize.cap=0")
    assert none != auto
    # no cap keys as before caps existed: older run folders keep their store
    cfg = load_config(None, ["proxy.steps=10", "proxy.batch_size=4", "proxy.seq_len=16"])
    from climb.config import digest
    assert none == digest("clusters", *tokenize._settings(cfg, None)[:4])


def test_a_change_of_cap_tokenizes_again(tmp_path, monkeypatch):
    import dataclasses

    from climb import pipeline
    from climb.config import TokenizeConfig
    from climb.stages.tokenize import cluster_tokens
    from scripted_run import prepare
    cfg, paths, _, _ = prepare(tmp_path, monkeypatch, "proxy.steps=2", "proxy.batch_size=4")
    cap = 2 * 4 * 17
    first = pipeline.run_stage("tokenize", cfg, paths.root)
    store = TokenStore(paths.tokenize.store)
    assert first["cap"] == cap == store.cap and store.stored.max() == cap and store.tokens.max() > cap
    natural = cluster_tokens(paths)
    assert pipeline.run_stage("tokenize", cfg, paths.root).get("skipped_stage")
    whole = dataclasses.replace(cfg, tokenize=TokenizeConfig(cap=0))
    again = pipeline.run_stage("tokenize", whole, paths.root)
    assert not again.get("skipped_stage") and again["cap"] == 0
    store = TokenStore(paths.tokenize.store)
    assert np.array_equal(store.stored, store.tokens) and np.array_equal(cluster_tokens(paths), natural)
    assert again["tokens"] == first["tokens"] and again["stored_tokens"] > first["stored_tokens"]


def test_the_contamination_scan_of_a_capped_store_names_the_documents_of_the_whole(tmp_path):
    from climb.stages.tokenize.contamination import ngram_hashes, scan_store
    corpus = _corpus()
    planted = list(range(60001, 60014))
    where = {}  # shard -> the row planted: s1's and s2's first document of cluster 0, and s0's last
    for name, pick in (("s0", -1), ("s1", 0), ("s2", 0)):
        texts, clusters = corpus[name]
        row = [i for i, c in enumerate(clusters) if c == 0][pick]
        texts[row] = texts[row] + " " + " ".join(map(str, planted))
        where[name] = row
    targets = np.unique(ngram_hashes(np.array(planted), 13))

    class _Tok:
        def decode(self, ids):
            return " ".join(map(str, ids))
    scans = {cap: scan_store(_build(tmp_path / f"c{cap}", cap, corpus), targets, 13, 0, _Tok(), lambda c, idx: list(idx))
             for cap in (0, R)}
    whole, capped = scans[0]["clusters"][0], scans[R]["clusters"][0]
    # the document index counts the cluster's documents in shard order, then row order
    order = [(name, i) for name in SHARDS for i, c in enumerate(corpus[name][1]) if c == 0]
    assert sorted(e["id"] for e in whole["examples"]) == sorted(order.index((n, r)) for n, r in where.items())
    assert sorted(e["id"] for e in capped["examples"]) == sorted(order.index((n, where[n])) for n in ("s1", "s2"))
    assert all(e["text"] == " ".join(map(str, planted)) for e in capped["examples"])
    assert capped["cluster_tokens"] == R < whole["cluster_tokens"] and capped["cluster_docs"] < whole["cluster_docs"]


def test_proxies_experts_and_the_validation_model_read_their_own_caps(stores, tmp_path):
    import dataclasses

    from climb.config import load_config
    from climb.config.checks import validation_model
    from climb.runtime.proxy_runs import _sampler
    from climb.runtime.layout import RunPaths
    from climb.stages.search.common import proxy_task
    cfg = load_config(None, [f"proxy.steps={STEPS}", f"proxy.batch_size={BATCH}", f"proxy.seq_len={SEQ}"])
    paths = RunPaths(tmp_path / "run")
    task = proxy_task(cfg, paths, "m", 0, MIXTURES[0], 0)
    assert task.read_cap == cfg.proxy.read_cap() == R
    # an expert trains a quarter of the steps, yet walks each cluster as the proxies do
    expert = dataclasses.replace(task, proxy=dataclasses.replace(cfg.proxy, steps=STEPS // 4))
    s = _sampler(stores[0], expert.weights, expert.proxy, 0, "cpu", "expert", None, expert.read_cap)
    assert s.read_cap == R
    model = validation_model(cfg)
    v = proxy_task(dataclasses.replace(cfg, proxy=model), paths, "v", -3, MIXTURES[0], 0)
    assert v.read_cap == model.read_cap() == 2 * R
