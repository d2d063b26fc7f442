"""Which clusters read like the target: a prior the search can start from (`search.target_prior`).

Each cluster's text, as the proxies read it (the first `proxy.read_cap()` tokens of the token
store), gives a smoothed unigram model over the proxies' tokens. Every target document (a
held-out text, or a task item's query with its gold answer) goes to the cluster whose model
gives it the highest likelihood; the share of target documents per cluster is the target's
affinity. It costs one pass over the tokens the proxies read anyway, and no embedding model.

The search draws `search.target_prior` of its candidate pool (so of its first, random round)
around the affinity blended half and half with the usual prior (the natural token shares
**temperature); the rest as before. A search seed that would otherwise never draw the clusters
the target resembles then measures some of them in its first round.
"""
from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)


def unigram_affinity(cluster_counts: np.ndarray, docs: list, usable: np.ndarray, alpha: float = 0.5) -> dict:
    """Per usable cluster, the share of `docs` (token-id arrays) its add-`alpha` unigram model
    (`cluster_counts`: clusters x vocabulary) scores highest; unusable clusters get none.
    Empty documents are not counted."""
    counts = np.asarray(cluster_counts, np.float64)
    usable = np.asarray(usable, bool)
    logp = np.log(counts + alpha) - np.log(counts.sum(1, keepdims=True) + alpha * counts.shape[1])
    logp[~usable] = -np.inf
    votes = np.zeros(len(counts))
    for ids in docs:
        ids = np.asarray(ids, np.int64)
        if not len(ids):
            continue
        bag = np.bincount(ids, minlength=counts.shape[1])[: counts.shape[1]]
        nz = np.flatnonzero(bag)
        votes[int(np.argmax(logp[:, nz] @ bag[nz]))] += 1
    n = int(votes.sum())
    share = votes / n if n else np.where(usable, 1.0 / max(1, usable.sum()), 0.0)
    return {"share": share.tolist(), "docs": n}


def target_affinity(cfg, paths, usable: np.ndarray, write: bool = True) -> dict | None:
    """The run's target affinity (kept in search/affinity.json unless `write` is false); None where
    the target has no text here."""
    from climb.io.files import InputError, write_json
    from climb.runtime.proxy_runs import tokenizer_of
    from climb.runtime.targets import load_target, target_pieces
    from proxies.tokens import TokenStore
    try:
        target = load_target(cfg.target, paths.root)
    except InputError as e:
        log.warning("search.target_prior: the target cannot be read here (%s); the pool is drawn around the "
                    "natural shares alone", e)
        return None
    pieces = target_pieces(target)
    if not pieces:
        log.warning("search.target_prior: the target has no text (an lm-eval task only); the pool is drawn around "
                    "the natural shares alone")
        return None
    tok = tokenizer_of(paths.tokenize.dir)
    store = TokenStore(paths.tokenize.store)
    vocab = int(tok.vocab_size)
    counts = np.zeros((store.n_clusters, vocab), np.float64)
    read = cfg.proxy.read_cap()
    for c in range(store.n_clusters):
        if usable[c]:
            head = store.head(c, read)
            counts[c] = np.bincount(np.asarray(head[0:len(head)], np.int64), minlength=vocab)[:vocab]
    out = unigram_affinity(counts, tok.encode_batch(pieces), usable)
    if write:
        write_json(paths.search.affinity, out)
    top = np.argsort(out["share"])[::-1][:3]
    log.info("target affinity: the target's %d documents read most like clusters %s", out["docs"],
             ", ".join(f"{c} ({out['share'][c]:.0%})" for c in top if out["share"][c] > 0))
    return out


def pool_prior(natural: np.ndarray, temperature: float, share: np.ndarray) -> np.ndarray:
    """The centre of the target-drawn part of the pool: the affinity blended half and half with
    the natural shares**temperature (so no usable cluster is left out of it)."""
    p = np.asarray(natural, np.float64) ** temperature
    p = p / p.sum()
    q = 0.5 * p + 0.5 * np.where(p > 0, share, 0.0) / max(np.where(p > 0, share, 0.0).sum(), 1e-300)
    return q / q.sum()
