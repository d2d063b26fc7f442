"""Stage 3, search: the CLIMB loop over cluster mixtures.

Preparation (once): a byte-level BPE tokenizer trained on the corpus (or a
given one) and per-cluster token stores, built per shard then merged.

Iteration 1 samples mixtures from a Dirichlet around the clusters' token
shares (temperature, several concentrations, epoch cap, minimum weight,
near-duplicates dropped). Each mixture trains one proxy and is scored on the
target. Later iterations fit the predictor on every result so far, score a
large candidate pool and train the most promising mixtures plus some
exploration. The final mixture is the predicted best (or the mean of the top
k); it is then compared with the uniform and natural mixtures by training
fresh proxies with seeds the search never used (`search.eval_seeds` per mixture).

Every proxy result is appended to `search/results.jsonl` as it arrives and
the plan of each iteration is saved first, so a killed search resumes at proxy
granularity. The swarm is also written as CSV (`swarm_weights.csv`,
`swarm_metrics.csv`) for other tools.

    climb search --config pipelines/demo.toml --run runs/demo
"""
from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import numpy as np

from .cluster import load_assignments
from .config import RunConfig
from .embed import shard_name
from .executor import make_executor
from .io import InputError, read_documents, read_json, write_json
from .predictor import goal_sign
from .proxy import swarm_size, train_and_score, train_and_score_group
from .stage import RunPaths, begin, finish, is_done, skipped, stage_key, upstream_hash

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- preparation
def _tokenize_shard(task: dict) -> dict:
    from proxies.tokenizer import load_tokenizer
    from proxies.tokens import write_shard_tokens
    tok = load_tokenizer(task["tokenizer"])
    assign = load_assignments(RunPaths(Path(task["run_dir"])), task["shard"])
    clusters = assign["cluster"].to_numpy()
    cc = task["corpus"]
    texts, cl, row = [], [], 0
    for b in read_documents(Path(task["path"]), cc.text_column, cc.id_column, batch_rows=cc.batch_rows):
        for t in b.texts:
            if clusters[row] >= 0:  # pruned documents never reach a proxy
                texts.append(t)
                cl.append(int(clusters[row]))
            row += 1
    if row != len(clusters):
        raise InputError(f"{task['path']} changed since it was clustered; re-run `climb embed cluster`")
    return write_shard_tokens(texts, np.asarray(cl, dtype=np.int64), tok, task["out"], task["shard"])


def _tokenizer_texts(cfg: RunConfig, files: list[Path]) -> list[str]:
    per_file = max(1, cfg.proxy.tokenizer_docs // max(1, len(files)))
    texts: list[str] = []
    for f in files:
        got = 0
        for b in read_documents(f, cfg.corpus.text_column, cfg.corpus.id_column, batch_rows=cfg.corpus.batch_rows):
            texts += b.texts[: per_file - got]
            got = min(per_file, got + len(b.texts))
            if got >= per_file:
                break
    return texts


def prepare(cfg: RunConfig, paths: RunPaths, ex) -> dict:
    from proxies.tokenizer import load_tokenizer, train_bpe
    from proxies.tokens import TokenStore, merge_token_stores
    sdir = paths.stage("search")
    tok_path = sdir / "tokenizer.json"
    if not tok_path.exists():
        if cfg.proxy.tokenizer:
            load_tokenizer(cfg.proxy.tokenizer).save(tok_path)
        else:
            files = paths.corpus_files(cfg)
            train_bpe(_tokenizer_texts(cfg, files), cfg.proxy.vocab_size, tok_path)
    if not (sdir / "tokens" / "index.json").exists():
        names = read_json(paths.manifest("cluster"))["stats"]["shards"]
        files = {shard_name(f): f for f in paths.corpus_files(cfg)}
        n_clusters = read_json(paths.root / "cluster" / "clusters.json")["n_clusters"]
        tasks = [{"tokenizer": str(tok_path), "run_dir": str(paths.root), "shard": s, "path": str(files[s]),
                  "corpus": cfg.corpus, "out": str(sdir / "tokens")} for s in names]
        ex.map(_tokenize_shard, tasks, desc="tokenize")
        merge_token_stores(sdir / "tokens", names, n_clusters)
    store = TokenStore(sdir / "tokens")
    return {"tokens": store.tokens.astype(np.int64), "bytes": np.asarray(store.bytes, dtype=np.int64)}


def mixture_space(cfg: RunConfig, tokens: np.ndarray) -> dict:
    """Prior (token shares), usable clusters and per-cluster caps from the epoch cap."""
    usable = tokens > cfg.proxy.seq_len + 1
    if usable.sum() == 0:
        raise InputError("no cluster has enough tokens for one proxy sequence; lower proxy.seq_len or add data")
    natural = np.where(usable, tokens, 0).astype(np.float64)
    natural /= natural.sum()
    budget = cfg.export.token_budget or int(tokens[usable].sum())
    cap = np.where(usable, np.minimum(1.0, cfg.search.epoch_cap * tokens / budget), 0.0)
    uniform = usable / usable.sum()
    return {"natural": natural, "uniform": uniform, "max_weight": cap, "usable": usable, "budget": budget}


# ----------------------------------------------------------------- the loop
def _results_path(paths: RunPaths) -> Path:
    return paths.root / "search" / "results.jsonl"


def read_results(paths: RunPaths) -> list[dict]:
    p = _results_path(paths)
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                log.warning("ignoring a truncated line in %s (the run was killed mid-write)", p)
    return out


def _append(paths: RunPaths, rec: dict) -> None:
    with open(_results_path(paths), "a") as fh:
        fh.write(json.dumps(rec) + "\n")
        fh.flush()


def _candidates(cfg: RunConfig, space: dict, n: int, seed: int) -> np.ndarray:
    from .predictor import sample_candidates
    sc = cfg.search
    k = len(space["natural"])
    return sample_candidates(space["natural"], n, np.random.default_rng(seed),
                             concentrations=tuple(c * k for c in sc.concentrations),
                             temperature=sc.temperature, min_weight=sc.min_weight,
                             max_weight=space["max_weight"])


def fixed_candidates(cfg: RunConfig, space: dict) -> np.ndarray | None:
    """The rows of `search.candidates` (None when unset) the proxies can train on, in file order.

    Columns named cluster_<i> are matched by name, others taken in cluster order. Rows
    that put weight on a cluster too small for one proxy sequence and exact repeats are
    dropped, and said so.
    """
    from .swarm import cluster_order, read_weights
    if not cfg.search.candidates:
        return None
    path, k = cfg.search.candidates, len(space["natural"])
    try:
        _, domains, W = read_weights(path, key=cfg.search.candidates_key)
    except ValueError as e:
        raise InputError(f"search.candidates: {e}") from None
    if len(domains) != k:
        raise InputError(f"search.candidates {path}: {len(domains)} weight columns, but the run has {k} clusters; "
                         f"give one column per cluster (cluster_0 .. cluster_{k - 1})")
    W = cluster_order(domains, W)
    keep = (W[:, ~space["usable"]] == 0).all(1)
    if not keep.all():
        log.warning("search.candidates: dropped %d of %d rows that weight clusters with too few tokens for a "
                    "proxy (clusters %s)", int((~keep).sum()), len(W), np.flatnonzero(~space["usable"]).tolist())
    W = W[keep]
    first = np.sort(np.unique(W, axis=0, return_index=True)[1])
    if len(first) < len(W):
        log.warning("search.candidates: dropped %d repeated rows", len(W) - len(first))
    if not len(first):
        raise InputError(f"search.candidates {path}: no usable candidate left")
    return W[first]


def _ok_sorted(results: list[dict]) -> list[dict]:
    """Successful results in mixture-id order: the predictor sees the same rows in
    the same order whatever order the proxies finished in (in-process, Dask, resumed)."""
    return sorted((r for r in results if r["status"] == "ok"), key=lambda r: r["mixture_id"])


def plan_iteration(cfg: RunConfig, paths: RunPaths, it: int, space: dict, seen: list[dict]) -> dict:
    """The mixtures of iteration `it` (saved, so a resumed search trains the same ones)."""
    from .strategy import from_search_config, plan as plan_indices
    plan_file = paths.root / "search" / f"plan_{it}.json"
    if plan_file.exists():
        return read_json(plan_file)
    sc = cfg.search
    n = sc.iterations[it]
    fixed = fixed_candidates(cfg, space)
    pool = fixed if fixed is not None else _candidates(cfg, space, sc.pool_size if it else max(n * 20, 1000),
                                                       sc.seed + 1000 * it)
    ok = _ok_sorted(seen)
    X = np.array([r["weights"] for r in ok]).reshape(len(ok), pool.shape[1])
    y = np.array([r["objective"] for r in ok])
    # A drawn pool is in random order already; a fixed one is sampled from at random.
    idx, predicted = plan_indices(it, n, X, y, cfg.target.goal, pool, from_search_config(sc), sc.seed,
                                  shuffle=fixed is not None, last=it == len(sc.iterations) - 1)
    plan = {"iteration": it, "mixtures": [{"mixture_id": f"it{it}-{j:03d}", "weights": pool[i].tolist(),
                                           "predicted": p} for j, (i, p) in enumerate(zip(idx, predicted))]}
    write_json(plan_file, plan)
    return plan


def _task(cfg: RunConfig, paths: RunPaths, mixture_id: str, it: int, weights, seed: int) -> dict:
    return {"mixture_id": mixture_id, "iteration": it, "weights": list(map(float, weights)), "seed": seed,
            "search_dir": str(paths.root / "search"), "run_dir": str(paths.root),
            "proxy": cfg.proxy, "target": cfg.target}


def run_proxies(cfg: RunConfig, ex, tasks: list[dict], desc: str, on_record) -> list[dict]:
    """Train and score proxies; on_record(i, record) is called for tasks[i] as its record arrives.

    Where `proxy.swarm` says stacking helps, tasks are grouped into stacked models of
    at most `swarm_size` proxies, and into at least as many groups as the executor runs
    tasks at once, so no worker idles.
    """
    size = swarm_size(cfg.proxy)
    if size <= 1 or len(tasks) < 2:
        return ex.map(train_and_score, tasks, desc=desc, resources={"GPU": 1}, on_result=on_record)
    per = max(1, min(size, math.ceil(len(tasks) / ex.slots({"GPU": 1}))))
    starts = list(range(0, len(tasks), per))
    out: list = [None] * len(tasks)

    def got(g: int, recs: list[dict]) -> None:
        for j, rec in enumerate(recs):
            out[starts[g] + j] = rec
            on_record(starts[g] + j, rec)
    ex.map(train_and_score_group, [tasks[i:i + per] for i in starts], desc=f"{desc} ({per} per stacked model)",
           resources={"GPU": 1}, on_result=got)
    return out


def final_mixture(cfg: RunConfig, space: dict, results: list[dict]) -> dict:
    from .strategy import final_pick, from_search_config
    sc = cfg.search
    ok = _ok_sorted(results)
    if len(ok) < 2:
        raise RuntimeError(f"only {len(ok)} proxies succeeded; see {len(results)} records in search/results.jsonl")
    X = np.array([r["weights"] for r in ok])
    y = np.array([r["objective"] for r in ok])
    fixed = fixed_candidates(cfg, space)
    pool = fixed if fixed is not None else _candidates(cfg, space, sc.pool_size, sc.seed + 99_991)
    pick = final_pick(X, y, cfg.target.goal, pool, from_search_config(sc), sc.seed)
    w = np.where(space["usable"], pick["weights"], 0.0)
    w /= w.sum()
    best_seen = ok[int(np.argmin(goal_sign(cfg.target.goal) * y))]
    return {"weights": w.tolist(), "predicted": pick["predicted"], "predictor": pick["predictor"],
            "best_seen": {"mixture_id": best_seen["mixture_id"], "objective": best_seen["objective"]}}


def stage_hash(cfg: RunConfig, paths: RunPaths) -> str:
    return stage_key(upstream_hash(paths, "cluster"), cfg.proxy, cfg.target, cfg.search,
                     cfg.export.token_budget)


def run(cfg: RunConfig, paths: RunPaths) -> dict:
    key = stage_hash(cfg, paths)
    if is_done(paths, "search", key):
        return skipped(paths, "search")
    t0 = time.time()
    sdir = begin(paths, "search", key, keep_on_change=True)
    sc = cfg.search
    with make_executor(cfg.executor) as ex:
        space = mixture_space(cfg, prepare(cfg, paths, ex)["tokens"])
        results = read_results(paths)
        done = {r["mixture_id"] for r in results}
        for it in range(len(sc.iterations)):
            plan = plan_iteration(cfg, paths, it, space, [r for r in results if r["iteration"] < it])
            todo = [m for m in plan["mixtures"] if m["mixture_id"] not in done]
            if todo:
                log.info("search iteration %d/%d: %d proxies (%d already done)", it + 1, len(sc.iterations),
                         len(todo), len(plan["mixtures"]) - len(todo))
            tasks = [_task(cfg, paths, m["mixture_id"], it, m["weights"], sc.seed) for m in todo]
            new = run_proxies(cfg, ex, tasks, f"proxies it{it + 1}", lambda i, rec: _append(paths, rec))
            results += new
            _write_swarm_csv(paths, results)
            ok = [r for r in results if r["status"] == "ok"]
            if ok:
                best = min(ok, key=lambda r: goal_sign(cfg.target.goal) * r["objective"])
                log.info("after iteration %d: best %s = %.4f (%s)", it + 1, ",".join(cfg.target.objective),
                         best["objective"], best["mixture_id"])
        final = final_mixture(cfg, space, results)
        write_json(sdir / "mixture.json", {**final, "natural": space["natural"].tolist(),
                                           "uniform": space["uniform"].tolist(),
                                           "max_weight": space["max_weight"].tolist(),
                                           "goal": cfg.target.goal, "objective": list(cfg.target.objective)})
        comparison = compare(cfg, paths, ex, {"climb": final["weights"], "uniform": space["uniform"],
                                              "natural": space["natural"]})
    failed = sum(r["status"] != "ok" for r in results)
    stats = {"proxies": len(results), "failed": failed, "comparison": comparison,
             "clusters": len(space["natural"]), "final_predicted": final["predicted"]}
    return finish(paths, "search", key, stats, t0)


def compare(cfg: RunConfig, paths: RunPaths, ex, mixtures: dict) -> dict:
    """Train fresh proxies (seeds the search never used) on each named mixture; mean per mixture.

    Proxy-to-proxy noise from the seed is of the order of the differences being
    measured, so each mixture is trained with `search.eval_seeds` seeds and the
    mean is reported (every run is kept in comparison.json).
    """
    out_file = paths.root / "search" / "comparison.json"
    have = read_json(out_file) if out_file.exists() else {}
    names = ["climb"] + [b for b in cfg.search.baselines if b in mixtures]
    runs = [(n, cfg.search.eval_seed + s) for n in names for s in range(cfg.search.eval_seeds)]
    todo = [(n, seed) for n, seed in runs if f"{n}/{seed}" not in have]
    tasks = [_task(cfg, paths, f"final-{n}-{seed}", -1, mixtures[n], seed) for n, seed in todo]

    def keep(i: int, rec: dict) -> None:
        have["{}/{}".format(*todo[i])] = rec
        write_json(out_file, have)
    run_proxies(cfg, ex, tasks, "final comparison", keep)
    table = {}
    for n in names:
        vals = [have[f"{n}/{seed}"]["objective"] for m, seed in runs if m == n]
        vals = [v for v in vals if v is not None]
        table[n] = float(np.mean(vals)) if vals else None
    log.info("final comparison (%s, %s; mean of %d seeds): %s", ",".join(cfg.target.objective), cfg.target.goal,
             cfg.search.eval_seeds, {k: round(v, 4) if v is not None else None for k, v in table.items()})
    return table


def _write_swarm_csv(paths: RunPaths, results: list[dict]) -> None:
    from .swarm import write_swarm
    ok = _ok_sorted(results)
    if not ok:
        return
    k = len(ok[0]["weights"])
    names = sorted({m for r in ok for m in r["metrics"]})
    metrics = {"objective": np.array([r["objective"] for r in ok]),
               "iteration": np.array([r["iteration"] for r in ok])}
    metrics.update({m: np.array([r["metrics"].get(m, np.nan) for r in ok]) for m in names})
    sdir = paths.root / "search"
    write_swarm(sdir / "swarm_weights.csv", sdir / "swarm_metrics.csv", [r["mixture_id"] for r in ok],
                [f"cluster_{c}" for c in range(k)], np.array([r["weights"] for r in ok]), metrics)
