"""The export's plan: how many copies of each document to write, and which to cut.

Documents are chosen per cluster in proportion to the final weights up to a token
budget, counted in `export.tokenizer`'s unit (climb.stages.export_units): each cluster's
documents are taken in one seeded random order without replacement until the cluster
runs dry, then again in the same order (epoch 2, 3, ...) up to `search.epoch_cap`
epochs; no cluster exceeds its share, the document that would cross it cut to fit
(`export.long_docs = "truncate"`) or passed over for shorter ones ("skip"). `select` is
that rule on arrays; `_plan` applies it to a run (a document the token store left out,
`target.decontaminate`, is not kept).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from climb.config import RunConfig, digest
from climb.io.files import InputError, read_json
from climb.runtime.stage import RunPaths, upstream_key
from climb.stages import export_units
from climb.stages.cluster import load_assignments


def budget_for(weights: np.ndarray, cluster_tokens: np.ndarray, cap: float, budget: int) -> int:
    if budget:
        return int(budget)
    pos = weights > 0
    return int(np.floor(np.min(cap * cluster_tokens[pos] / weights[pos])))


def _fill(order: np.ndarray, tokens: np.ndarray, want: int, long_docs: str) -> tuple[np.ndarray, int, int]:
    """One partial pass over a cluster's documents (in `order`) toward `want` tokens.

    Returns the documents taken whole, the document cut to fit (-1: none) and the
    tokens it keeps. "truncate" takes documents in order and cuts the one that
    would cross `want`; "skip" passes over documents that do not fit in what is
    left and takes later, shorter ones; neither ever exceeds `want`.
    """
    cum = np.cumsum(tokens[order])
    n = int(np.searchsorted(cum, want, side="right"))  # the longest prefix that fits whole
    got = int(cum[n - 1]) if n else 0
    if n == len(order) or got == want:
        return order[:n], -1, 0
    left = want - got
    if long_docs == "truncate":
        # A cut document keeps at least one token of text besides its EOS.
        return (order[:n], int(order[n]), left) if left >= 2 else (order[:n], -1, 0)
    rest = order[n:]
    fits = tokens[rest] <= left
    take = list(order[:n])
    if fits.any():
        # Greedy over the rest, in order: documents that fit in what is still wanted.
        suffix_min = np.minimum.accumulate(tokens[rest][::-1])[::-1]
        for j in np.flatnonzero(fits):
            if suffix_min[j] > left:
                break
            t = int(tokens[rest[j]])
            if t <= left:
                take.append(rest[j])
                left -= t
    return np.asarray(take, dtype=order.dtype), -1, 0


def select(doc_cluster: np.ndarray, doc_tokens: np.ndarray, weights: np.ndarray, budget: int,
           cap: float, seed: int, long_docs: str = "truncate") -> tuple[np.ndarray, dict]:
    """How many times each document is exported (0, 1, 2, ...) and per-cluster stats.

    Within a cluster documents are visited in one seeded order; pass e takes them
    again in that order, so repeats are even: no document is taken k+1 times
    while another of its cluster is taken fewer than k times. The last, partial
    pass stops at the cluster's share of the budget whatever the document lengths
    (see `_fill`); `info["cut"]` maps a document cut to fit to the tokens (EOS
    included) its last copy keeps.
    """
    rng = np.random.default_rng(seed)
    copies = np.zeros(len(doc_cluster), dtype=np.int64)
    cut: dict[int, int] = {}
    per = []
    for c, w in enumerate(weights):
        members = np.flatnonzero(doc_cluster == c)
        have = int(doc_tokens[members].sum())
        want = w * budget
        limit = cap * have
        goal = int(round(min(want, limit)))
        taken = 0
        if goal > 0 and len(members):
            order = members[rng.permutation(len(members))]
            full, rest = divmod(goal, have)
            copies[order] += full
            taken = full * have
            if rest > 0:
                whole, part, keep = _fill(order, doc_tokens, rest, long_docs)
                copies[whole] += 1
                taken += int(doc_tokens[whole].sum())
                if part >= 0:
                    copies[part] += 1
                    cut[part] = keep
                    taken += keep
        per.append({"cluster": c, "weight": float(w), "tokens_wanted": int(round(want)),
                    "tokens": taken, "tokens_available": have, "capped": bool(want > limit + 0.5),
                    "shortfall": max(0, goal - taken), "epochs": round(taken / have, 4) if have else 0.0})
    return copies, {"clusters": per, "cut": cut}


def _shard_docs(paths: RunPaths, store, shard: str, units: str) -> tuple[np.ndarray, np.ndarray]:
    """Cluster and size (in export.tokenizer's unit) of each kept document of a shard, in corpus order;
    a document the token store left out (target.decontaminate) is not kept."""
    clusters = load_assignments(paths, shard)["cluster"].to_numpy().copy()
    done = paths.tokenize.store / "parts" / shard / "done.json"
    if done.exists():
        gone = read_json(done).get("decontaminated", [])
        clusters[np.asarray(gone, dtype=np.int64)] = -1
    kept = clusters >= 0
    tokens = np.zeros(len(clusters), dtype=np.int64)
    if units != export_units.PROXY:
        tokens[kept] = np.load(counts_file(paths, shard, units))[kept]
        return clusters, tokens
    try:
        tokens[kept] = store.doc_tokens(shard)
    except (OSError, ValueError) as e:
        raise InputError(f"{store.path}: cannot read the document token counts of shard {shard} ({e}); run "
                         "`climb tokenize` (same --config and --run) to re-create them") from None
    return clusters, tokens


def counts_file(paths: RunPaths, shard: str, units: str) -> Path:
    """A shard's document sizes in `units` (export.tokenizer), under a folder keyed by the unit
    and the clusters they were counted for."""
    return paths.export.dir / "counts" / digest(export_units.key(units), units, upstream_key(paths, "cluster"))[:16] \
        / f"{shard}.npy"


def _plan(cfg: RunConfig, paths: RunPaths, w: np.ndarray) -> dict:
    """How many copies of each document (in shard order) to export, which are cut, and per-cluster stats."""
    from proxies.tokens import TokenStore
    store = TokenStore(paths.tokenize.store)
    names = paths.shards()
    per_shard = [_shard_docs(paths, store, s, cfg.export.tokenizer) for s in names]
    doc_cluster = np.concatenate([p[0] for p in per_shard])
    doc_tokens = np.concatenate([p[1] for p in per_shard])
    cluster_tokens = np.bincount(doc_cluster[doc_cluster >= 0], weights=doc_tokens[doc_cluster >= 0],
                                 minlength=len(w))
    budget = budget_for(w, cluster_tokens, cfg.search.epoch_cap, cfg.export.token_budget)
    copies, selection = select(doc_cluster, doc_tokens, w, budget, cfg.search.epoch_cap, cfg.export.seed,
                               cfg.export.long_docs)
    cut = np.zeros(len(copies), dtype=np.int64)
    for d, keep in selection.pop("cut").items():
        cut[d] = keep
    return {"shards": names, "shard_clusters": [p[0] for p in per_shard], "copies": copies, "cut": cut,
            "budget": budget, "selection": selection, "unit": cfg.export.tokenizer}


def cluster_rows(plan: dict) -> np.ndarray:
    """Rows the export writes per cluster (every copy of a document is a row)."""
    doc_cluster = np.concatenate(plan["shard_clusters"])
    kept = doc_cluster >= 0
    k = len(plan["selection"]["clusters"])
    return np.bincount(doc_cluster[kept], weights=plan["copies"][kept], minlength=k).astype(np.int64)


def row_probabilities(plan: dict, clusters: list[int]) -> list[float]:
    """`datasets.interleave_datasets` probabilities for these clusters' files: each cluster's
    share of the rows. Interleaving draws rows, not tokens; drawn by these, every cluster
    runs out at about the same time, so that reading every row once (the stopping strategy
    "all_exhausted_without_replacement") yields the realised token weights, with the
    clusters mixed evenly along the way (a cluster of long documents is not over-weighted,
    nor one of short ones left half unread)."""
    rows = cluster_rows(plan)[clusters].astype(np.float64)
    return (rows / rows.sum()).tolist()
