"""Duplicates planted at known rates are found (exact and near, with no false ones), reported per
cluster, and with dedup.drop = true leave the token store and the export."""
from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from climb import pipeline
from climb.stages.cluster.dedup import exact_firsts, near_groups, normalise, text_hash
from scripted_run import prepare


def _planted(seed: int = 0):
    """150 documents of 80 words from 2,000 made-up ones, 15 exact copies (case, punctuation and
    spacing changed) and 15 near copies (two words replaced), each planted under a new id."""
    rng = np.random.default_rng(seed)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    vocab = sorted({"".join(rng.choice(letters, 7)) for _ in range(2100)})[:2000]
    base = [{"id": f"doc-{i:03d}", "text": " ".join(rng.choice(vocab, 80))} for i in range(150)]
    exact, near = {}, {}
    for j, i in enumerate(rng.choice(150, 30, replace=False)):
        src = base[i]
        if j < 15:
            text = "  " + src["text"].upper().replace(" ", " ,  ") + "!"
            exact[f"copy-{j:02d}"] = src["id"]
        else:
            words = src["text"].split()
            for k in rng.choice(80, 2, replace=False):
                words[k] = str(rng.choice(vocab))
            text = " ".join(words)
            near[f"near-{j:02d}"] = src["id"]
        base.append({"id": f"copy-{j:02d}" if j < 15 else f"near-{j:02d}", "text": text})
    order = rng.permutation(len(base))
    return [base[i] for i in order], exact, near


def _flags(paths) -> dict[str, tuple[int, str]]:
    out = {}
    for s in paths.shards():
        t = pq.read_table(paths.cluster.assignments(s)).to_pylist()
        out.update({r["id"]: (r["duplicate"], r["duplicate_of"]) for r in t})
    return out


def _found(flags, pairs: dict, kind: int) -> int:
    """Planted pairs found: either one of the two flagged as the other's duplicate, of this kind."""
    return sum((flags[a][0] == kind and flags[a][1] == b) or (flags[b][0] == kind and flags[b][1] == a)
               for a, b in pairs.items())


def test_normalised_hashes_and_groups():
    assert normalise("Hello,  World!") == normalise("hello world") and text_hash("A b") == text_hash("a-B")
    assert text_hash("a b") != text_hash("a c")
    h = np.array([5, 7, 5, 9, 7, 5])
    kept = np.array([True, True, True, True, False, True])
    assert exact_firsts(h, kept).tolist() == [-1, -1, 0, -1, -1, 0]  # a pruned row is neither
    e = np.eye(4, dtype=np.float32)
    e = np.vstack([e, e[1] + 0.01 * e[2], e[3]])
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    assert near_groups(e, 0.99, 3).tolist() == [0, 1, 2, 3, 1, 3]  # rows 4 and 5 join 1 and 3, the earlier


@pytest.fixture()
def run(tmp_path, monkeypatch):
    docs, exact, near = _planted()
    cfg, paths, _, _ = prepare(tmp_path, monkeypatch, "dedup.threshold=0.9", docs=docs)
    return cfg, paths, exact, near, len(docs)


def test_planted_duplicates_are_found_at_their_rates_and_reported(run):
    cfg, paths, exact, near, n = run
    flags = _flags(paths)
    assert _found(flags, exact, 1) == 15  # every exact copy, as exact
    assert _found(flags, near, 2) == 15  # every near copy, as near
    planted = set(exact) | set(exact.values()) | set(near) | set(near.values())
    false = [i for i, (k, _) in flags.items() if k and i not in planted]
    assert false == []  # no document flagged that was not planted
    assert sum(k > 0 for k, _ in flags.values()) == 30
    summary = json.loads(paths.cluster.summary.read_text())
    assert sum(c["duplicates"]["exact"] for c in summary["clusters"]) == 15
    assert sum(c["duplicates"]["near"] for c in summary["clusters"]) == 15
    assert sum(c["docs_distinct"] for c in summary["clusters"]) == n - 30
    stats = paths.stats("cluster")
    assert stats["duplicates"]["rate"] == pytest.approx(30 / n, abs=1e-6) and stats["duplicates"]["dropped"] == 0
    pipeline.run_stage("report", cfg, paths.root)
    page = (paths.root / "report" / "report.md").read_text()
    assert "## Duplicates" in page and "15 exact and 15 near duplicates" in page


def test_dropped_duplicates_leave_the_store_and_the_export(run):
    import dataclasses
    cfg, paths, exact, near, n = run
    drop = dataclasses.replace(cfg, dedup=dataclasses.replace(cfg.dedup, drop=True))
    pipeline.run_stage("export", drop, paths.root)
    flags = _flags(paths)
    dups = {i for i, (k, _) in flags.items() if k}
    assert len(dups) == 30
    for s in paths.shards():
        t = pq.read_table(paths.cluster.assignments(s)).to_pylist()
        assert all(r["cluster"] == -1 and r["duplicate_cluster"] >= 0 for r in t if r["id"] in dups)
    exported = {r["id"] for f in (paths.root / "export" / "data").rglob("*.parquet")
                for r in pq.read_table(f, columns=["id"]).to_pylist()}
    assert exported and not exported & dups
    tstats = paths.stats("tokenize")
    assert sum(tstats["dropped_duplicate_tokens"]) > 0 and sum(tstats["duplicate_tokens"]) == 0
    from climb.stages.search.summary import duplicates
    d = duplicates(paths)
    assert d["dropped"] and d["total"]["tokens_before"] - d["total"]["tokens_after"] == sum(
        tstats["dropped_duplicate_tokens"])
    # and undone: with drop off again every document is back in its cluster
    pipeline.run_stage("tokenize", cfg, paths.root)
    flags_after = {r["id"]: r["cluster"] for s in paths.shards()
                   for r in pq.read_table(paths.cluster.assignments(s)).to_pylist()}
    assert all(flags_after[i] >= 0 for i in dups)
