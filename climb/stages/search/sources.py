"""The mixture by source: how much of each cluster's tokens each source (web, code, books ...) holds.

Users think in sources, the search in clusters. `source_shares` gives, per cluster, the
tokens of each source (`corpus.source_column`, or the corpus file where none is named:
climb.io.sources), counted as the natural mixture counts them (`cluster_tokens`: every
token of every document in the token store, a capped store's too). It is worked out from
what the tokenize stage kept of each shard: `parts/<shard>/doc_tokens.npy` holds the tokens
of each document the shard wrote, in corpus order, and those documents are the shard's
clustered ones (cluster >= 0 in its assignments: pruned documents and dropped duplicates
have -1) less those `done.json` lists as decontaminated. Only the source column of the
corpus is read (nothing at all where the sources are the files).

The search writes it to `search/sources.json` and puts it in its mixture space
(`space["sources"]`); the share of source s in a mixture w is `w @ share[:, s]` (`by_source`).
A run folder made before it has no sources.json: `load_source_shares` works it out on demand.
"""
from __future__ import annotations

import logging

import numpy as np

from climb.config import RunConfig
from climb.io.files import InputError, read_json, write_json
from climb.io.sources import file_sources
from climb.runtime.layout import RunPaths

log = logging.getLogger(__name__)


def store_documents(paths: RunPaths, shard: str) -> tuple[np.ndarray, np.ndarray]:
    """Each of a shard's documents' cluster (-1: not in the token store) and tokens in the store
    (EOS included; 0 where not in it), in corpus order."""
    from climb.stages.cluster import load_assignments
    clusters = load_assignments(paths, shard)["cluster"].to_numpy().astype(np.int64)
    part = paths.tokenize.store / "parts" / shard
    if (part / "done.json").exists():
        gone = read_json(part / "done.json").get("decontaminated", [])
        clusters[np.asarray(gone, dtype=np.int64)] = -1
    kept = clusters >= 0
    try:
        counts = np.load(part / "doc_tokens.npy")
    except (OSError, ValueError) as e:
        raise InputError(f"{part}: cannot read the document token counts ({e}); run `climb tokenize` "
                         "(same --config and --run) to re-create them") from None
    if len(counts) != int(kept.sum()):
        raise InputError(f"{part}: {len(counts)} document token counts for {int(kept.sum())} documents in the "
                         "store; run `climb tokenize` (same --config and --run) to make them again")
    tokens = np.zeros(len(clusters), np.int64)
    tokens[kept] = counts
    return clusters, tokens


def shard_sources(cfg: RunConfig, shard: str, path, documents: int) -> tuple[list[str], np.ndarray]:
    """The sources of a shard (corpus file `path`) and each of its `documents` documents' source
    as an index into them: `corpus.source_column`'s values, or the shard's name for all."""
    if not cfg.corpus.source_column:
        return [shard], np.zeros(documents, np.int64)
    names, codes = file_sources(path, cfg.corpus, documents)
    return names, codes


def source_shares(cfg: RunConfig, paths: RunPaths) -> dict:
    """{"column": corpus.source_column, "names": the S sources (sorted), "tokens": k x S tokens of
    each source in each cluster, "share": k x S, each cluster's row summing to 1 (0 throughout for
    a cluster with no tokens), "docs": k x S documents}. The tokens of a cluster sum to its
    `cluster_tokens`. Every source the corpus files name is there, one without tokens too."""
    k = paths.n_clusters()
    # Sources by file need no corpus file: a search on a store whose corpus moved still runs.
    files = paths.shard_files(cfg) if cfg.corpus.source_column else {}
    tokens: dict[str, np.ndarray] = {}
    docs: dict[str, np.ndarray] = {}
    for shard in paths.shards():
        if cfg.corpus.source_column and shard not in files:
            raise InputError(f"the corpus has no file for shard {shard!r} (corpus.paths changed since it was "
                             "embedded); run the stages again with the corpus they were made from")
        clusters, sizes = store_documents(paths, shard)
        names, codes = shard_sources(cfg, shard, files.get(shard), len(clusters))
        if not names:  # a file with no rows
            continue
        kept = clusters >= 0
        cells = clusters[kept] * len(names) + codes[kept]
        got = np.rint(np.bincount(cells, weights=sizes[kept], minlength=k * len(names))).astype(np.int64)
        n = np.bincount(cells, minlength=k * len(names))
        for j, name in enumerate(names):
            tokens[name] = tokens.get(name, np.zeros(k, np.int64)) + got.reshape(k, -1)[:, j]
            docs[name] = docs.get(name, np.zeros(k, np.int64)) + n.reshape(k, -1)[:, j]
    names = sorted(tokens)
    t = np.stack([tokens[s] for s in names], axis=1) if names else np.zeros((k, 0), np.int64)
    total = t.sum(axis=1, keepdims=True)
    share = np.divide(t, total, out=np.zeros(t.shape), where=total > 0)
    return {"column": cfg.corpus.source_column, "names": names, "tokens": t.tolist(), "share": share.tolist(),
            "docs": (np.stack([docs[s] for s in names], axis=1) if names else t).tolist()}


def write_source_shares(cfg: RunConfig, paths: RunPaths) -> dict:
    """`source_shares`, written to search/sources.json."""
    shares = source_shares(cfg, paths)
    write_json(paths.search.sources, shares)
    log.info("search: %d sources (%s)", len(shares["names"]),
             f"corpus.source_column {cfg.corpus.source_column!r}" if cfg.corpus.source_column else "the corpus files")
    return shares


def load_source_shares(cfg: RunConfig, paths: RunPaths) -> dict | None:
    """search/sources.json where it is of the config's source column; else (a run folder made before
    it) `source_shares` worked out now; None where that fails (the corpus or the store gone)."""
    f = paths.search.sources
    if f.exists():
        shares = read_json(f)
        if shares.get("column") == cfg.corpus.source_column:
            return shares
    try:
        return source_shares(cfg, paths)
    except (InputError, OSError) as e:
        log.info("the mixture by source is left out: %s", e)
        return None


def by_source(shares: dict, mixtures: dict) -> dict:
    """{"names": the sources, <mixture name>: each source's share of that mixture's tokens, ...} for
    `mixtures` (name -> weights per cluster): mixture w gives source s `w @ share[:, s]`."""
    share = np.asarray(shares["share"], dtype=np.float64).reshape(-1, len(shares["names"]))
    return {"names": list(shares["names"]),
            **{name: (np.asarray(w, dtype=np.float64) @ share).tolist() for name, w in mixtures.items()}}


def mixture_by_source(cfg: RunConfig, paths: RunPaths, mix: dict | None = None) -> dict | None:
    """The found, natural and uniform mixtures by source: search/mixture.json's `by_source` (`mix`:
    that file's contents, read when not given), or, for a run folder made before it, worked out
    from `load_source_shares`; None where neither is there."""
    if mix is None:
        if not paths.search.mixture.exists():
            return None
        mix = read_json(paths.search.mixture)
    if mix.get("by_source"):
        return mix["by_source"]
    shares = load_source_shares(cfg, paths)
    if shares is None:
        return None
    return by_source(shares, {name: mix[key] for name, key in (("climb", "weights"), ("natural", "natural"),
                                                                ("uniform", "uniform")) if key in mix})


def main_sources(shares: dict, cluster: int, top: int = 3) -> str:
    """A cluster's largest sources by tokens with their shares, e.g. "web 62%, code 30%"."""
    row = np.asarray(shares["share"][cluster], dtype=np.float64)
    order = [int(j) for j in np.argsort(-row, kind="stable")[:top] if row[j] > 0]
    return ", ".join(f"{shares['names'][j]} {row[j]:.0%}" for j in order)
