"""Does the corpus contain the test? The target's text looked for in the token store by long n-grams.

A target is a benchmark's items or held-out text; where the corpus holds them (or near
copies), a search finds the cluster that holds them and reports a gain that is leakage.
As the GPT-3 and Llama reports did, a document is *contaminated* when it shares an
n-gram of `target.contamination` tokens (13 by default; the proxies' tokens, which the
store already holds) with the target: the held-out texts, and each task item's query
and gold continuation. The target's n-grams are hashed (64-bit polynomial hashes) into
one sorted array, small beside the corpus; each cluster's token file is scanned in
blocks with numpy, n-grams crossing a document's end left out, so memory stays bounded
whatever the store's size.

The search stage runs the scan (`search/contamination.json`: per cluster the documents
and tokens contaminated and a few examples) and warns when the found mixture leans on
contaminated clusters more than the natural mixture does; `target.decontaminate = true`
has the tokenize stage leave those documents out of the store (and so out of the
search and the export).

    from climb.stages.tokenize.contamination import target_ngrams, scan_store
"""
from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)
P = np.uint64(1_000_003)  # the hash's base; arithmetic wraps at 2^64
BLOCK = 1 << 24  # tokens scanned at once


def ngram_hashes(ids: np.ndarray, n: int, eos: int | None = None) -> np.ndarray:
    """The hash of every n consecutive ids (those holding `eos` left out); uint64, in order."""
    ids = np.asarray(ids)
    if len(ids) < n:
        return np.zeros(0, np.uint64)
    m = len(ids) - n + 1
    h = np.zeros(m, np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = h * P + ids[j:j + m].astype(np.uint64)
    if eos is not None:
        bad = np.convolve((ids == eos).astype(np.int32), np.ones(n, np.int32), mode="valid") > 0
        h = h[~bad]
    return h


def target_ngrams(texts: list[str], tasks: dict[str, list[dict]], tok, n: int) -> np.ndarray:
    """Sorted unique n-gram hashes of the held-out texts and of every task item's query and gold
    continuation (a cloze item's context and continuation), in the proxies' tokens."""
    from climb.runtime.targets import target_pieces
    pieces = target_pieces({"texts": texts, "tasks": tasks})
    hashes = [ngram_hashes(np.asarray(ids, np.int64), n) for ids in tok.encode_batch(pieces)]
    return np.unique(np.concatenate(hashes)) if hashes else np.zeros(0, np.uint64)


def contaminated_docs(arr: np.ndarray, targets: np.ndarray, n: int,
                      eos: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For one cluster's token array (documents one after another, each ending in `eos`), read in
    blocks: (the indices of the documents holding a target n-gram, the position of the first such
    n-gram in each, every document's length)."""
    ends, hits = [], []
    for a in range(0, len(arr), BLOCK):
        chunk = np.asarray(arr[a:min(len(arr), a + BLOCK + n - 1)])
        own = chunk[: min(BLOCK, len(arr) - a)]
        ends.append(a + np.flatnonzero(own == eos))
        if not len(targets):
            continue
        pos = np.flatnonzero(np.isin(ngram_hashes(chunk, n), targets))
        for p in pos:  # an n-gram holding a document's end is not a match
            if p < len(own) and not (chunk[p:p + n] == eos).any():
                hits.append(a + int(p))
    ends = np.concatenate(ends) if ends else np.zeros(0, np.int64)
    if len(arr) and int(arr[-1]) != eos:  # a document cut short (a capped store's share of a shard ends in it)
        ends = np.r_[ends, len(arr) - 1]
    lengths = np.diff(np.r_[-1, ends]).astype(np.int64)
    if not hits:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), lengths
    hits = np.asarray(hits, np.int64)
    doc = np.searchsorted(ends, hits)  # the first end at or after the hit: its document
    docs, first = np.unique(doc, return_index=True)
    return docs, hits[first], lengths


def scan_store(store, targets: np.ndarray, n: int, eos: int, tok, id_of, examples: int = 3,
               read: int = 0) -> dict:
    """Every cluster of a token store scanned (`contaminated_docs`): per cluster the documents
    and their tokens contaminated, and a few examples (the document's id, `id_of(cluster,
    indices)`, and the matching text). `read` > 0 scans what a model reading that many tokens of
    each cluster reads (TokenStore.head: the same from any store keeping as many, so the scan does
    not change with the store's cap); 0 what the store holds. A capped store (tokenize.cap), or a
    cluster larger than `read`, is scanned in a representative part: `cluster_docs` and
    `cluster_tokens` count what was scanned, so `tokens / cluster_tokens` is the contaminated share
    either way."""
    from proxies.token_store import apportion
    per = []
    first_docs = _first_docs(store)
    for c in range(store.n_clusters):
        arr = store.array(c)
        stored = int(store.stored[c])
        size = min(read, stored) if read else stored
        if size == store.tokens[c]:  # every document whole, in merge order
            docs, pos, lengths = contaminated_docs(arr, targets, n, eos)
            bad, scanned = int(lengths[docs].sum()) if len(docs) else 0, len(lengths)
        else:  # each shard's share: its first documents, the last one cut short
            pieces = store.pieces(c)
            shares = ([m for _, _, m, _ in pieces] if size == stored
                      else apportion(size, [full for _, _, _, full in pieces]))
            docs, pos, bad, scanned = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], 0, 0
            for (shard, a, _, _), m in zip(pieces, shares):
                if m:
                    d, p, ln = contaminated_docs(arr[a:a + m], targets, n, eos)
                    # the cluster's document order, as doc_ids counts
                    docs.append(d + first_docs.get(shard, {}).get(c, 0))
                    pos.append(p + a)
                    bad, scanned = bad + int(ln[d].sum()), scanned + len(ln)
            docs, pos = np.concatenate(docs), np.concatenate(pos)
        ids = id_of(c, docs[:examples]) if len(docs) else []
        per.append({"cluster": c, "docs": int(len(docs)), "cluster_docs": int(scanned),
                    "tokens": bad, "cluster_tokens": int(size),
                    "examples": [{"id": i, "text": tok.decode([int(t) for t in arr[p:p + n]])}
                                 for i, p in zip(ids, pos[:examples])]})
    return {"ngram": n, "target_ngrams": int(len(targets)), "clusters": per,
            "docs": sum(p["docs"] for p in per), "tokens": sum(p["tokens"] for p in per)}


def scanned(scan: dict) -> int:
    """The documents a scan read: all of each cluster, or the part the proxies read of a larger one."""
    return sum(int(c["cluster_docs"]) for c in scan["clusters"])


def _first_docs(store) -> dict:
    """{shard: {cluster: documents of the cluster in the shards before it}} (a shard's share of a
    cluster begins there in the cluster's document order, which `doc_ids` counts in), from the
    parts' done.json; {} for a store without per-shard records."""
    import json
    if "shard_tokens" not in store.index:
        return {}
    out, seen = {}, {}
    for shard in store.index["shards"]:
        out[shard] = dict(seen)
        done = store.path / "parts" / shard / "done.json"
        if not done.exists():
            continue
        for c, k in json.loads(done.read_text()).get("docs_per_cluster", {}).items():
            seen[int(c)] = seen.get(int(c), 0) + int(k)
    return out


def check(cfg, paths) -> dict | None:
    """The search's contamination check (`target.contamination`): the scan of the run's token store
    against its target, written to search/contamination.json; None where it is off or the target
    has no text of its own (a harness task's items are not read here)."""
    from climb.io.files import write_json
    from climb.runtime.proxy_runs import tokenizer_of
    from climb.runtime.targets import load_target
    from proxies.tokens import TokenStore
    from climb.io.files import InputError
    n = cfg.target.contamination
    if not n:
        return None
    try:
        target = load_target(cfg.target, paths.root)
    except InputError as e:  # an external trainer may read a target this machine does not hold
        log.info("contamination: the target cannot be read here (%s); not checked", e)
        return None
    if not target["texts"] and not target["tasks"]:
        return None
    tok = tokenizer_of(paths.tokenize.dir)
    targets = target_ngrams(target["texts"], target["tasks"], tok, n)
    store = TokenStore(paths.tokenize.store)
    # What the proxies read of each cluster: the search's figures do not change with the store's cap.
    scan = scan_store(store, targets, n, tok.eos_id, tok, lambda c, idx: doc_ids(paths, store, c, idx),
                      read=cfg.proxy.read_cap())
    write_json(paths.search.contamination, scan)
    log.info("contamination: %d of the %d documents the proxies read (%d tokens) share a %d-gram with the "
             "target", scan["docs"], scanned(scan), scan["tokens"], n)
    return scan


def doc_ids(paths, store, cluster: int, indices) -> list[str]:
    """The ids of a cluster's documents at these positions of its token file (shard order, then row
    order, as the store was merged)."""
    import json

    from climb.stages.cluster import load_assignments
    want = sorted(int(i) for i in indices)
    out, seen = {}, 0
    for shard in store.index["shards"]:
        t = load_assignments(paths, shard)
        keep = t["cluster"].to_numpy() == cluster
        done = paths.tokenize.store / "parts" / shard / "done.json"
        left_out = set(json.loads(done.read_text()).get("decontaminated", [])) if done.exists() else set()
        rows = [r for r in np.flatnonzero(keep) if int(r) not in left_out]
        ids = t["id"].to_pylist()
        for i in want:
            if seen <= i < seen + len(rows):
                out[i] = ids[rows[i - seen]]
        seen += len(rows)
        if len(out) == len(want):
            break
    return [out.get(int(i), str(int(i))) for i in indices]


def leaning(scan: dict, weights, natural) -> dict:
    """The contaminated share of the tokens a mixture draws (each cluster's contaminated tokens over
    its tokens, weighted), for the found mixture and the natural one."""
    frac = np.array([p["tokens"] / p["cluster_tokens"] if p["cluster_tokens"] else 0.0 for p in scan["clusters"]])
    w, nat = np.asarray(weights, float), np.asarray(natural, float)
    return {"found": float(w[: len(frac)] @ frac), "natural": float(nat[: len(frac)] @ frac)}


def warning(scan: dict, weights, natural) -> str | None:
    """A plain statement when the found mixture draws clearly more of its tokens from contaminated
    documents than the natural mixture does (twice as much, and at least 1%)."""
    share = leaning(scan, weights, natural)
    if share["found"] >= 0.01 and share["found"] > 2 * share["natural"]:
        return (f"contamination: the found mixture draws {100 * share['found']:.1f}% of its tokens from documents "
                f"that share a {scan['ngram']}-gram with the target, against {100 * share['natural']:.1f}% for the "
                "natural mixture, so part of its gain may be the test itself; see search/contamination.json, and "
                "set target.decontaminate = true to take those documents out before the search")
    return None


def doc_is_contaminated(ids_list: list[list[int]], targets: np.ndarray, n: int) -> np.ndarray:
    """For documents' ids (no EOS), whether each holds a target n-gram."""
    return np.array([bool(len(targets)) and bool(np.isin(ngram_hashes(np.asarray(ids, np.int64), n), targets).any())
                     for ids in ids_list], dtype=bool)
