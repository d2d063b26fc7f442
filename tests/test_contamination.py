"""Target items planted in a corpus are found by their 13-grams, reported per cluster with examples,
warned about when a mixture leans on them, and with target.decontaminate removed from the token
store and the export."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow.parquet as pq

from climb import pipeline
from climb.stages.tokenize.contamination import contaminated_docs, ngram_hashes, warning
from conftest import vocab_docs
from scripted_run import prepare


def test_ngram_hashes_and_document_scan():
    ids = np.array([1, 2, 3, 4, 5, 0, 1, 2, 3, 9, 0])  # two documents, each ending in EOS (0)
    h = ngram_hashes(ids, 3)
    assert len(h) == 9 and h[0] == h[6]  # "1 2 3" twice
    assert len(ngram_hashes(ids, 3, eos=0)) == 9 - 4  # the four n-grams holding an EOS left out
    targets = np.unique(ngram_hashes(np.array([3, 4, 5]), 3))
    docs, pos, lengths = contaminated_docs(ids, targets, 3, eos=0)
    assert docs.tolist() == [0] and pos.tolist() == [2] and lengths.tolist() == [6, 5]
    # an n-gram across a document's end is no match
    across = np.unique(ngram_hashes(np.array([5, 0, 1]), 3))
    assert contaminated_docs(ids, across, 3, eos=0)[0].tolist() == []


def _corpus_with_target(tmp_path):
    """A corpus whose five documents (all of one topic, so mostly of one cluster) hold a held-out
    target article's text, and that target."""
    rng = np.random.default_rng(3)
    words = ["".join(rng.choice(list("klmnoprstuvz"), 6)) for _ in range(300)]
    target = [" ".join(rng.choice(words, 60)) for _ in range(4)]
    docs = vocab_docs(40)
    planted = []
    sea = [i for i, d in enumerate(docs) if d["label"] == "sea"]
    for j, i in enumerate(rng.choice(sea, 5, replace=False)):
        docs[i] = dict(docs[i], text=docs[i]["text"] + " " + target[j % 4][:200])
        planted.append(docs[i]["id"])
    (tmp_path / "target.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in target))
    return docs, set(planted)


def test_planted_target_items_are_found_reported_and_removed(tmp_path, monkeypatch):
    docs, planted = _corpus_with_target(tmp_path)
    cfg, paths, _, _ = prepare(tmp_path, monkeypatch, f'target.texts=["{tmp_path}/target.jsonl"]', docs=docs)
    pipeline.run_stage("search", cfg, paths.root)
    scan = json.loads(paths.search.contamination.read_text())
    assert scan["ngram"] == 13 and scan["docs"] == len(planted) == 5
    found = {e["id"] for c in scan["clusters"] for e in c["examples"]}
    assert found <= planted and len(found) >= min(5, sum(min(3, c["docs"]) for c in scan["clusters"]))
    assert all(e["text"] for c in scan["clusters"] for e in c["examples"])
    q = json.loads(paths.search.quality.read_text())
    assert q["contamination"]["docs"] == 5
    # a mixture all on the cluster that holds most of them leans on them; the natural one does not
    worst = max(scan["clusters"], key=lambda c: c["tokens"] / max(1, c["cluster_tokens"]))
    k = len(scan["clusters"])
    natural = np.array([c["cluster_tokens"] for c in scan["clusters"]], float)
    assert warning(scan, np.eye(k)[worst["cluster"]], natural / natural.sum()) is not None
    assert warning(scan, natural / natural.sum(), natural / natural.sum()) is None
    pipeline.run_stage("report", cfg, paths.root)
    page = (paths.root / "report" / "report.md").read_text()
    read = sum(c["cluster_docs"] for c in scan["clusters"])
    assert "## Contamination" in page and f"5 of the {read:,} documents the proxies read" in page
    # decontaminated: out of the store, so out of the search's scan and of the export
    clean = dataclasses.replace(cfg, target=dataclasses.replace(cfg.target, decontaminate=True))
    pipeline.run_stage("export", clean, paths.root)
    assert paths.stats("tokenize")["decontaminated"] == 5
    assert json.loads(paths.search.contamination.read_text())["docs"] == 0
    exported = {r["id"] for f in (paths.root / "export" / "data").rglob("*.parquet")
                for r in pq.read_table(f, columns=["id"]).to_pylist()}
    assert exported and not exported & planted
    assert not any("contamination" in w for w in json.loads(paths.search.quality.read_text())["warnings"])


def test_a_run_with_drop_and_decontaminate_exports_neither(tmp_path, monkeypatch):
    """dedup.drop and target.decontaminate together: the export holds no duplicate and no
    document holding the target."""
    docs, planted = _corpus_with_target(tmp_path)
    copies = [dict(d, id=f"copy-{d['id']}", text=d["text"].upper() + " !") for d in docs[:8]]
    docs += copies
    cfg, paths, _, _ = prepare(tmp_path, monkeypatch, f'target.texts=["{tmp_path}/target.jsonl"]',
                               "dedup.drop=true", "target.decontaminate=true", docs=docs)
    pipeline.run_stage("export", cfg, paths.root)
    exported = {r["id"] for f in (paths.root / "export" / "data").rglob("*.parquet")
                for r in pq.read_table(f, columns=["id"]).to_pylist()}
    dups = {r["id"] for s in paths.shards() for r in pq.read_table(paths.cluster.assignments(s)).to_pylist()
            if r["duplicate"]}
    assert len(dups) >= 8 and paths.stats("tokenize")["decontaminated"] >= 4
    assert exported and not exported & dups and not exported & planted
