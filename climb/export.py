"""Stage 4, export: the optimised dataset as Parquet shards plus blend files.

Documents are chosen per cluster in proportion to the final weights up to a
token budget (proxy-tokenizer tokens, EOS included): each cluster's documents
are taken in a seeded random order without replacement until the cluster runs
dry, then again in the same order (epoch 2, 3, ...) up to `search.epoch_cap`
epochs. A cluster whose share would need more is capped, and the shortfall is
reported. With `export.token_budget = 0` the budget is the largest one at which
no cluster exceeds its cap.

Output, under `<run>/export/`:
- `data/cluster_XXXXX/part-<shard>.parquet`: id, text, cluster, epoch
- `mixture.json`: weights per cluster, realised tokens, files
- `megatron_blend.txt`: `w1 prefix1 w2 prefix2 ...` for `--data-path`
- `interleave.json`: file lists and probabilities for `datasets.interleave_datasets`

    climb export --config pipelines/demo.toml --run runs/demo
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from .cluster import load_assignments
from .config import RunConfig
from .embed import shard_name
from .executor import make_executor
from .io import InputError, read_documents, read_json, write_json, write_parquet
from .stage import RunPaths, begin, finish, is_done, skipped, stage_key, upstream_hash

log = logging.getLogger(__name__)


def check_weights(w, n_clusters: int, where: str, tol: float = 1e-6) -> np.ndarray:
    w = np.asarray(w, dtype=np.float64)
    if w.shape != (n_clusters,):
        raise InputError(f"{where}: {w.size} weights for {n_clusters} clusters; give one weight per cluster")
    if not np.all(np.isfinite(w)) or (w < 0).any():
        raise InputError(f"{where}: weights must be finite and non-negative")
    if abs(w.sum() - 1.0) > tol:
        raise InputError(f"{where}: weights sum to {w.sum():.6f}, not 1; normalise them (w / w.sum())")
    return w


def budget_for(weights: np.ndarray, cluster_tokens: np.ndarray, cap: float, budget: int) -> int:
    if budget:
        return int(budget)
    pos = weights > 0
    return int(np.floor(np.min(cap * cluster_tokens[pos] / weights[pos])))


def select(doc_cluster: np.ndarray, doc_tokens: np.ndarray, weights: np.ndarray, budget: int,
           cap: float, seed: int) -> tuple[np.ndarray, dict]:
    """How many times each document is exported (0, 1, 2, ...) and per-cluster stats.

    Within a cluster documents are visited in one seeded order; pass e takes them
    again in that order, so repeats are even: no document is taken k+1 times
    while another of its cluster is taken fewer than k times.
    """
    rng = np.random.default_rng(seed)
    copies = np.zeros(len(doc_cluster), dtype=np.int64)
    per = []
    for c, w in enumerate(weights):
        members = np.flatnonzero(doc_cluster == c)
        have = int(doc_tokens[members].sum())
        want = w * budget
        limit = cap * have
        goal = min(want, limit)
        taken = 0
        if goal > 0 and len(members):
            order = members[rng.permutation(len(members))]
            cum = np.cumsum(doc_tokens[order])
            full, rest = divmod(goal, have)
            full = int(full)
            copies[order] += full
            taken = full * have
            # Part of a pass: documents until the cluster's share is reached.
            n_more = int(np.searchsorted(cum, rest, side="left")) + (1 if rest > 0 else 0)
            n_more = min(n_more, len(order))
            copies[order[:n_more]] += 1
            taken += int(cum[n_more - 1]) if n_more else 0
        per.append({"cluster": c, "weight": float(w), "tokens_wanted": int(round(want)),
                    "tokens": taken, "tokens_available": have, "capped": bool(want > limit + 0.5),
                    "epochs": round(taken / have, 4) if have else 0.0})
    return copies, {"clusters": per}


def _shard_docs(paths: RunPaths, shard: str) -> tuple[np.ndarray, np.ndarray]:
    """Cluster and token count of each kept document of a shard, in corpus order."""
    clusters = load_assignments(paths, shard)["cluster"].to_numpy()
    kept = clusters >= 0
    tokens = np.zeros(len(clusters), dtype=np.int64)
    tokens[kept] = np.load(paths.root / "search" / "tokens" / "parts" / shard / "doc_tokens.npy")
    return clusters, tokens


def write_shard(task: dict) -> dict:
    """Write the chosen documents of one corpus shard, grouped by cluster."""
    copies = np.load(task["copies"])
    clusters = np.load(task["clusters"])
    cc = task["corpus"]
    rows: dict[int, dict[str, list]] = {}
    row = 0
    for b in read_documents(Path(task["path"]), cc.text_column, cc.id_column, batch_rows=cc.batch_rows):
        for doc_id, text in zip(b.ids, b.texts):
            for e in range(int(copies[row])):
                r = rows.setdefault(int(clusters[row]), {"id": [], "text": [], "epoch": []})
                r["id"].append(doc_id)
                r["text"].append(text)
                r["epoch"].append(e)
            row += 1
    files = {}
    rng = np.random.default_rng(task["seed"])
    schema = pa.schema([("id", pa.string()), ("text", pa.string()), ("cluster", pa.int32()), ("epoch", pa.int32())])
    for c, r in sorted(rows.items()):
        order = rng.permutation(len(r["id"]))
        n = len(order)
        for part, s in enumerate(range(0, n, task["rows_per_shard"])):
            idx = order[s:s + task["rows_per_shard"]]
            table = pa.table({"id": [r["id"][i] for i in idx], "text": [r["text"][i] for i in idx],
                              "cluster": np.full(len(idx), c, np.int32), "epoch": [r["epoch"][i] for i in idx]},
                             schema=schema)
            out = Path(task["out_dir"]) / f"cluster_{c:05d}" / f"part-{task['shard']}-{part:03d}.parquet"
            write_parquet(out, table)
            files.setdefault(c, []).append(str(out.relative_to(task["export_dir"])))
    return {"shard": task["shard"], "files": files, "rows": int(copies.sum())}


def stage_hash(cfg: RunConfig, paths: RunPaths) -> str:
    return stage_key(upstream_hash(paths, "search"), cfg.export, cfg.search.epoch_cap)


def run(cfg: RunConfig, paths: RunPaths, weights: list[float] | None = None) -> dict:
    mix_file = paths.root / "search" / "mixture.json"
    key = stage_key(stage_hash(cfg, paths), weights)
    if is_done(paths, "export", key):
        return skipped(paths, "export")
    t0 = time.time()
    edir = begin(paths, "export", key)
    names = read_json(paths.manifest("cluster"))["stats"]["shards"]
    n_clusters = read_json(paths.root / "cluster" / "clusters.json")["n_clusters"]
    w = check_weights(weights if weights is not None else read_json(mix_file)["weights"], n_clusters,
                      "weights given" if weights is not None else str(mix_file))
    per_shard = [_shard_docs(paths, s) for s in names]
    doc_cluster = np.concatenate([p[0] for p in per_shard])
    doc_tokens = np.concatenate([p[1] for p in per_shard])
    cluster_tokens = np.bincount(doc_cluster[doc_cluster >= 0], weights=doc_tokens[doc_cluster >= 0],
                                 minlength=n_clusters)
    budget = budget_for(w, cluster_tokens, cfg.search.epoch_cap, cfg.export.token_budget)
    copies, sel = select(doc_cluster, doc_tokens, w, budget, cfg.search.epoch_cap, cfg.export.seed)
    files = {shard_name(f): f for f in paths.corpus_files(cfg)}
    tasks, start = [], 0
    for i, (s, (cl, _)) in enumerate(zip(names, per_shard)):
        cfile = edir / "plan" / f"{s}.npy"
        cfile.parent.mkdir(parents=True, exist_ok=True)
        np.save(cfile, copies[start:start + len(cl)])
        np.save(edir / "plan" / f"{s}.clusters.npy", cl)
        tasks.append({"shard": s, "path": str(files[s]), "copies": str(cfile),
                      "clusters": str(edir / "plan" / f"{s}.clusters.npy"),
                      "corpus": cfg.corpus, "out_dir": str(edir / "data"), "export_dir": str(edir),
                      "rows_per_shard": cfg.export.rows_per_shard, "seed": cfg.export.seed + i})
        start += len(cl)
    with make_executor(cfg.executor) as ex:
        parts = ex.map(write_shard, tasks, desc="export")
    by_cluster: dict[int, list[str]] = {}
    for p in parts:
        for c, fs in p["files"].items():
            by_cluster.setdefault(int(c), []).extend(fs)
    realised = np.array([c["tokens"] for c in sel["clusters"]], dtype=np.float64)
    total = realised.sum()
    if total == 0:
        raise InputError("the export selected no documents; check the weights and export.token_budget")
    real_w = realised / total
    write_json(edir / "mixture.json", {"weights": w.tolist(), "realised_weights": real_w.tolist(),
                                       "token_budget": budget, "tokens": int(total), **sel,
                                       "files": {str(c): fs for c, fs in sorted(by_cluster.items())}})
    blend = " ".join(f"{real_w[c]:.6f} {fs[0].rsplit('/', 1)[0]}" for c, fs in sorted(by_cluster.items()))
    (edir / "megatron_blend.txt").write_text(blend + "\n")
    write_json(edir / "interleave.json", {
        "data_files": [fs for _, fs in sorted(by_cluster.items())],
        "probabilities": [float(real_w[c]) for c in sorted(by_cluster)],
        "usage": "datasets.interleave_datasets([load_dataset('parquet', data_files=f, split='train') "
                 "for f in data_files], probabilities=probabilities, seed=0)"})
    capped = [c["cluster"] for c in sel["clusters"] if c["capped"]]
    stats = {"docs": int((copies > 0).sum()), "rows": int(copies.sum()), "tokens": int(total), "budget": budget,
             "capped_clusters": capped, "max_abs_weight_error": float(np.abs(real_w - w).max()),
             "files": sum(len(v) for v in by_cluster.values())}
    if capped:
        log.warning("export: clusters %s hit the epoch cap (%.1f); their realised weight is below the target",
                    capped, cfg.search.epoch_cap)
    log.info("export: %d rows (%d distinct docs), %d tokens, %d files", stats["rows"], stats["docs"], total,
             stats["files"])
    return finish(paths, "export", key, stats, t0)


