"""What the search's parts share: the mixture space, the candidates, the results log, one
proxy's task, training a batch of proxies, and the final pick.

The search loop (climb/stages/search/__init__.py), its comparison with baselines
(search_compare.py) and its cheaper ways to choose (search_cheap.py) all build on
these; none of them imports another.
"""
from __future__ import annotations

import logging
import math

import numpy as np

from climb.config import RunConfig
from climb.io.files import InputError
from climb.optimize.predictor import goal_sign
from climb.runtime import results as results_log
from climb.runtime.proxy_runs import ProxyTask, stack_size, train_and_score, train_and_score_group
from climb.runtime.layout import RunPaths

log = logging.getLogger(__name__)


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


def search_bounds(cfg: RunConfig, space: dict):
    """The bounds every candidate and the pick obey (climb.optimize.bounds.Bounds): search.bounds and
    search.kl_max over the space's caps (search.epoch_cap), search.min_weight and, for source bounds,
    `space["sources"]`. None when neither is set. A bound the space cannot hold, or bounds no mixture
    meets together, raise InputError (one line naming them)."""
    from climb.optimize.bounds import from_config, infeasible
    search_cfg = cfg.search
    if not search_cfg.bounds and not search_cfg.kl_max:
        return None
    budget = (f"export.token_budget = {cfg.export.token_budget:,}" if cfg.export.token_budget
              else f"the corpus's {space['budget']:,} tokens")
    b = from_config(search_cfg.bounds, space, search_cfg.min_weight, search_cfg.kl_max,
                    caps_note=f"the epoch cap (search.epoch_cap = {search_cfg.epoch_cap:g} at {budget})")
    why = infeasible(b)
    if why:
        raise InputError(why)
    return b


def run_space(cfg: RunConfig, paths) -> dict:
    """The search's mixture space from the run's token store, with its bounds (`space["bounds"]`),
    as the search builds it: for the checks before the search and for the export."""
    from climb.stages.tokenize import cluster_tokens
    space = mixture_space(cfg, cluster_tokens(paths))
    if source_bounds(cfg):
        from climb.stages.search.sources import load_source_shares
        shares = load_source_shares(cfg, paths)
        if shares:
            space["sources"] = {"names": shares["names"], "share": np.asarray(shares["share"])}
    space["bounds"] = search_bounds(cfg, space)
    return space


def source_bounds(cfg: RunConfig) -> bool:
    """Whether search.bounds names a source (so the search depends on corpus.source_column)."""
    return any(str(key).startswith("source:") for key in cfg.search.bounds)


def check_bounds(cfg: RunConfig, paths) -> None:
    """Before the search trains anything: search.bounds and search.kl_max against the clusters, their
    caps and sources (InputError, one line, where they cannot be met). Nothing without bounds."""
    if (cfg.search.bounds or cfg.search.kl_max) and (paths.tokenize.store / "index.json").exists():
        run_space(cfg, paths)


# ----------------------------------------------------------------- the loop
def read_results(paths: RunPaths) -> list[dict]:
    """Every complete proxy record, the last one per (mixture id, seed)."""
    return results_log.load(paths.search.results)


def append(paths: RunPaths, rec: dict) -> None:
    results_log.append(paths.search.results, rec)


def candidate_pool(cfg: RunConfig, space: dict, n: int, seed: int) -> np.ndarray:
    """n distinct Dirichlet mixtures around the natural shares, as search.* configures them.

    With `search.target_prior` > 0 and the target's affinity in `space["target"]`
    (climb/stages/search/affinity.py), that share of them is drawn around the affinity blended
    with the natural shares instead; the two parts are shuffled together."""
    from climb.optimize.candidates import dedupe, sample_candidates
    from climb.stages.search.affinity import pool_prior
    search_cfg = cfg.search
    k = len(space["natural"])
    rng = np.random.default_rng(seed)

    def draw(prior, m: int, temperature: float) -> np.ndarray:
        return sample_candidates(prior, m, rng, concentrations=tuple(c * k for c in search_cfg.concentrations),
                                 temperature=temperature, min_weight=search_cfg.min_weight,
                                 max_weight=space["max_weight"], bounds=space.get("bounds"))
    share = space.get("target")
    frac = search_cfg.target_prior if share is not None else 0.0
    if not frac:
        return draw(space["natural"], n, search_cfg.temperature)
    n_t = int(round(frac * n))
    parts = [draw(pool_prior(space["natural"], search_cfg.temperature, np.asarray(share)), n_t, 1.0),
             draw(space["natural"], n - n_t, search_cfg.temperature)]
    W = np.vstack([p for p in parts if len(p)])
    return dedupe(W[rng.permutation(len(W))], 1e-3)[:n]


def fixed_candidates(cfg: RunConfig, space: dict) -> np.ndarray | None:
    """The rows of `search.candidates` (None when unset) the proxies can train on, in file order.

    Columns named cluster_<i> are matched by name, others taken in cluster order. Rows
    that put weight on a cluster too small for one proxy sequence, rows outside search.bounds
    or search.kl_max, and exact repeats are dropped, and said so.
    """
    from climb.io.swarm_csv import cluster_order, read_weights
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
    if space.get("bounds") is not None:
        from climb.optimize.bounds import satisfied
        inside = satisfied(W, space["bounds"], caps=False)
        if not inside.any():
            raise InputError(f"search.candidates {path}: none of its {len(W)} usable rows holds search.bounds / "
                             "search.kl_max; loosen them or give candidates inside them")
        if not inside.all():
            log.warning("search.candidates: dropped %d of %d rows outside search.bounds / search.kl_max",
                        int((~inside).sum()), len(W))
        W = W[inside]
    first = np.sort(np.unique(W, axis=0, return_index=True)[1])
    if len(first) < len(W):
        log.warning("search.candidates: dropped %d repeated rows", len(W) - len(first))
    if not len(first):
        raise InputError(f"search.candidates {path}: no usable candidate left")
    return W[first]


def ok_sorted(results: list[dict]) -> list[dict]:
    """Successful results in mixture-id order: the predictor sees the same rows in
    the same order whatever order the proxies finished in (in-process, Dask, resumed)."""
    return sorted((r for r in results if r["status"] == "ok"), key=lambda r: r["mixture_id"])


def proxy_task(cfg: RunConfig, paths: RunPaths, mixture_id: str, it: int, weights, seed: int,
               heldout=None, base: str = "") -> ProxyTask:
    """What one proxy run needs (plain data, so it runs in-process or on a Dask worker): the
    mixture, the seed, the run's token store, the proxy and target configs, and optionally
    held-out evaluations (a TargetConfig) scored beside the target, and the shared base it
    continues (a checkpoint path; "" trains from scratch). Its windows come from each cluster's
    first cfg.proxy.read_cap() tokens, also where the task's own proxy trains fewer steps (an expert)."""
    return ProxyTask(mixture_id=mixture_id, iteration=it, weights=tuple(map(float, weights)), seed=seed,
                     tokens_dir=str(paths.tokenize.dir), run_dir=str(paths.root), proxy=cfg.proxy, target=cfg.target,
                     heldout=heldout, base=base, base_steps=base_steps(cfg) if base else 0,
                     read_cap=cfg.proxy.read_cap())


def pool_size(cfg: RunConfig) -> int:
    """Candidates a later iteration (and the final pick) scores: search.pool_size, or with
    merged models, whose feature is an evaluation per candidate, search.merge_pool."""
    return cfg.search.merge_pool if cfg.search.merge else cfg.search.pool_size


def base_steps(cfg: RunConfig) -> int:
    """The shared base's steps: search.base of the proxies' steps (0 without a base)."""
    if not cfg.search.base:
        return 0
    return min(cfg.proxy.steps - 1, max(1, round(cfg.search.base * cfg.proxy.steps)))


def run_proxies(cfg: RunConfig, ex, tasks: list[ProxyTask], desc: str, on_record) -> list[dict]:
    """Train and score proxies; on_record(i, record) is called for tasks[i] as its record arrives.

    Where `proxy.swarm` says stacking helps, tasks are grouped into stacked models of
    at most `swarm_size` proxies, and into at least as many groups as the executor runs
    tasks at once, so no worker idles.
    """
    size = stack_size(cfg.proxy)
    if size <= 1 or len(tasks) < 2:
        return ex.map(train_and_score, tasks, desc=desc, resources={"GPU": 1}, on_result=on_record, parallel=True)
    per = max(1, min(size, math.ceil(len(tasks) / ex.slots({"GPU": 1}))))
    starts = list(range(0, len(tasks), per))
    out: list = [None] * len(tasks)

    def got(g: int, recs: list[dict]) -> None:
        for j, rec in enumerate(recs):
            out[starts[g] + j] = rec
            on_record(starts[g] + j, rec)
    ex.map(train_and_score_group, [tasks[i:i + per] for i in starts], desc=f"{desc} ({per} per stacked model)",
           resources={"GPU": 1}, on_result=got, parallel=True)
    return out


def final_pool(cfg: RunConfig, space: dict) -> np.ndarray:
    """The unmeasured candidates the final pick (and a re-pick) scores: search.candidates, or a
    pool drawn with its own seed."""
    fixed = fixed_candidates(cfg, space)
    return fixed if fixed is not None else candidate_pool(cfg, space, pool_size(cfg), cfg.search.seed + 99_991)


# The pool the simulated re-runs of `rerun_figure` search (as measured in
# docs/benchmarks/steady-answer.md: 1,000 candidates drawn as the run draws its own).
RERUN_POOL = 1000


def rerun_figure(cfg: RunConfig, space: dict, results: list[dict], noise: float | None,
                 truth: str = "trend", prior=None) -> dict | None:
    """How far another search seed's answer may fall (climb.optimize.rerun.rerun_spread): the
    run's search simulated on what its measured mixtures say (a trend in the weights and their
    neighbourhood around it), with its paired seed noise `noise`. `prior`: the feature the run's
    predictor fits a line in first (the experts' ensemble loss, the merged models'), which every
    simulated search then uses as the run did. None with fewer than four finished proxies."""
    from dataclasses import replace as dc_replace

    from climb.optimize.rerun import rerun_spread
    from climb.optimize.strategy import from_search_config
    ok = [r for r in ok_sorted(results) if "stopped" not in r]
    pool = candidate_pool(cfg, space, RERUN_POOL, cfg.search.seed + 7)
    return rerun_spread([r["weights"] for r in ok], [r["objective"] for r in ok], cfg.target.goal, pool,
                        cfg.search.iterations, dc_replace(from_search_config(cfg.search), prior=prior),
                        noise or 0.0, truth=truth)


def replicate_noise(table: dict) -> float | None:
    """The noise sd one measurement carries by the run's replicates (`{mixture: {seed: value}}`): the
    larger of the seed sd and the paired sd (`climb.optimize.quality.noise`). Two mixtures on three
    seeds leave the paired sd two degrees of freedom and the seed sd four, so the larger of the two
    is the floor that errs toward smoothing; None where the replicates cannot tell."""
    from climb.optimize.quality import noise
    rows = [[row[s] for s in sorted(row, key=str)] for _, row in sorted(table.items())]
    if len(rows) < 2 or len({len(r) for r in rows}) != 1 or any(v is None for r in rows for v in r):
        return None
    n = noise(rows)
    got = [v for v in (n["seed_sd"], n["paired_sd"]) if v is not None]
    return max(got) if got else None


def final_mixture(cfg: RunConfig, space: dict, results: list[dict], rule: str | None = None,
                  source: str = "search/results.jsonl", prior=None, pool: np.ndarray | None = None,
                  noise: float | None = None) -> dict:
    """The mixture the results point to, by `search.final` (or `rule`, e.g. "predicted"), among the
    measured mixtures and the unmeasured candidates `pool` (None: `final_pool`).

    A pick among measured mixtures ("seen", "measured-predicted") is among proxies trained to
    the end: one stopped at a rung (search.halving) holds a predicted final value only.
    `noise`: the run's measured noise (`replicate_noise`), which `search.final_noise = "measured"`
    makes the least noise the pick's predictor allows each measurement."""
    from dataclasses import replace as dc_replace

    from climb.optimize.strategy import final_pick, from_search_config
    search_cfg = cfg.search
    ok = ok_sorted(results)
    if (rule or search_cfg.final) != "predicted":
        ok = [r for r in ok if "stopped" not in r]
    if len(ok) < 2:
        raise RuntimeError(f"only {len(ok)} proxies succeeded; see {len(results)} records in {source}")
    X = np.array([r["weights"] for r in ok])
    y = np.array([r["objective"] for r in ok])
    pool = final_pool(cfg, space) if pool is None else pool
    strategy = dc_replace(from_search_config(search_cfg), prior=prior)
    if rule is not None:
        strategy = dc_replace(strategy, final=rule, final_top_k=1)
    elif search_cfg.final_noise == "measured":
        if noise is None:  # 0 is a measurement (a trainer the seed does not move): the evidence alone then
            raise InputError("search.final_noise = \"measured\" needs the run's measured seed noise, and its "
                             "replicates gave none (search.replicates >= 2 and search.replicate_seeds >= 1 measure it)")
        strategy = dc_replace(strategy, final_noise=float(noise))
    bounds = space.get("bounds")
    pick = final_pick(X, y, cfg.target.goal, pool, strategy, search_cfg.seed,
                      bounds=bounds if bounds is not None else (space["max_weight"], search_cfg.min_weight),
                      natural=space["natural"],
                      steadiness=search_cfg.steadiness_boot)
    w = np.where(space["usable"], pick["weights"], 0.0)
    w /= w.sum()
    best_seen = ok[int(np.argmin(goal_sign(cfg.target.goal) * y))]
    out = {"weights": w.tolist(), "predicted": pick["predicted"], "predictor": pick["predictor"],
           "best_seen": {"mixture_id": best_seen["mixture_id"], "objective": best_seen["objective"]}}
    if strategy.final_noise:  # search.final_noise = "measured": the least noise the pick's predictor allowed
        out["noise_floor"] = strategy.final_noise
        log.info("final pick: the predictor allows each measurement at least the measured seed noise %.4f; "
                 "it rates %s best (measured best: %s %.4f)", strategy.final_noise,
                 "a measured mixture" if strategy.final == "measured-predicted" else "a mixture",
                 best_seen["mixture_id"], best_seen["objective"])
    if "steadiness" in pick:
        st = pick["steadiness"]
        out["steadiness"] = {k: v for k, v in st.items() if k != "picks"}
        out["steadiness"]["picks"] = np.round(st["picks"], 6).tolist()
    return out
