"""Stage 4, search: the CLIMB loop over cluster mixtures.

Proxies train on the tokenize stage's per-cluster token store.

Iteration 1 samples mixtures from a Dirichlet around the clusters' token
shares (temperature, several concentrations, epoch cap, minimum weight,
near-duplicates dropped). Each mixture trains one proxy and is scored on the
target. Later iterations fit the predictor on every result so far, score a
large candidate pool and train a batch chosen by the acquisition (expected
improvement by default; climb/optimize/strategy.py). The final mixture is, by
default, the best measured one (`search.final = "seen"`; or the measured mixture
the predictor rates best, or the predicted best / mean of the top k); it is then
compared with the uniform and natural mixtures by training fresh proxies with
seeds the search never used (`search.eval_seeds` per mixture).

Two settings spend less proxy compute on the same choice (README, "Spending less
on proxies"): `search.halving` trains every proxy of an iteration but the last to a
rung, scores it there and continues only the best (from a checkpoint), the rest
entering the predictor at the value the curve model predicts; `search.experts`
first trains one expert per cluster and lets the predictor fit a line in each
mixture's expert-ensemble objective.

Every proxy result is appended to `search/results.jsonl` as it arrives (see
climb/runtime/results.py) and the plan of each iteration is saved first, so a killed
search resumes at proxy granularity; a resumed search trains failed proxies
again (`search.retry_failed`). The swarm is also written as CSV (`swarm_weights.csv`,
`swarm_metrics.csv`) for other tools.

    climb search --config pipelines/demo.toml --run runs/demo
"""
from __future__ import annotations

import logging
import math

import numpy as np

from climb.config import RunConfig, digest, without
from climb.io.files import InputError, read_json, write_json
from climb.optimize.predictor import goal_sign
from climb.optimize.quality import (MIN_OOF_SPEARMAN, MIN_SNR, fmt_comparison, oof_spearman, paired_comparison,
                                    pooled_noise, snr, warnings)
from climb.runtime import results as results_log
from climb.runtime.device import proxy_processes
from climb.runtime.proxy_runs import ProxyTask, coef_path, stack_size, train_and_score, train_and_score_group
from climb.runtime.stage import RunPaths, execute, upstream_key
from climb.stages.tokenization import cluster_tokens

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


# ----------------------------------------------------------------- the loop
def read_results(paths: RunPaths) -> list[dict]:
    """Every complete proxy record, the last one per (mixture id, seed)."""
    return results_log.load(paths.search.results)


def _append(paths: RunPaths, rec: dict) -> None:
    results_log.append(paths.search.results, rec)


def candidate_pool(cfg: RunConfig, space: dict, n: int, seed: int) -> np.ndarray:
    """n distinct Dirichlet mixtures around the natural shares, as search.* configures them."""
    from climb.optimize.candidates import sample_candidates
    search_cfg = cfg.search
    k = len(space["natural"])
    return sample_candidates(space["natural"], n, np.random.default_rng(seed),
                             concentrations=tuple(c * k for c in search_cfg.concentrations),
                             temperature=search_cfg.temperature, min_weight=search_cfg.min_weight,
                             max_weight=space["max_weight"])


def fixed_candidates(cfg: RunConfig, space: dict) -> np.ndarray | None:
    """The rows of `search.candidates` (None when unset) the proxies can train on, in file order.

    Columns named cluster_<i> are matched by name, others taken in cluster order. Rows
    that put weight on a cluster too small for one proxy sequence and exact repeats are
    dropped, and said so.
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


def plan_iteration(cfg: RunConfig, paths: RunPaths, it: int, space: dict, seen: list[dict],
                   prior=None) -> dict:
    """The mixtures of iteration `it` (saved, so a resumed search trains the same ones);
    `prior`: the experts' feature the predictor fits a line in first (search.experts)."""
    from dataclasses import replace as dc_replace

    from climb.optimize.strategy import from_search_config
    from climb.optimize.strategy import plan as plan_indices
    plan_file = paths.search.plan(it)
    if plan_file.exists():
        return read_json(plan_file)
    search_cfg = cfg.search
    n = search_cfg.iterations[it]
    fixed = fixed_candidates(cfg, space)
    pool = fixed if fixed is not None else candidate_pool(cfg, space,
                                                       search_cfg.pool_size if it else max(n * 20, 1000),
                                                       search_cfg.seed + 1000 * it)
    ok = _ok_sorted(seen)
    X = np.array([r["weights"] for r in ok]).reshape(len(ok), pool.shape[1])
    y = np.array([r["objective"] for r in ok])
    # A drawn pool is in random order already; a fixed one is sampled from at random.
    idx, predicted = plan_indices(it, n, X, y, cfg.target.goal, pool,
                                  dc_replace(from_search_config(search_cfg), prior=prior), search_cfg.seed,
                                  shuffle=fixed is not None, last=it == len(search_cfg.iterations) - 1)
    plan = {"iteration": it, "mixtures": [{"mixture_id": f"it{it}-{j:03d}", "weights": pool[i].tolist(),
                                           "predicted": p} for j, (i, p) in enumerate(zip(idx, predicted))]}
    write_json(plan_file, plan)
    return plan


def proxy_task(cfg: RunConfig, paths: RunPaths, mixture_id: str, it: int, weights, seed: int,
               heldout=None) -> ProxyTask:
    """What one proxy run needs (plain data, so it runs in-process or on a Dask worker): the
    mixture, the seed, the run's token store, the proxy and target configs, and optionally
    held-out evaluations (a TargetConfig) scored beside the target."""
    return ProxyTask(mixture_id=mixture_id, iteration=it, weights=tuple(map(float, weights)), seed=seed,
                     tokens_dir=str(paths.tokenize.dir), run_dir=str(paths.root), proxy=cfg.proxy, target=cfg.target,
                     heldout=heldout)


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


def final_mixture(cfg: RunConfig, space: dict, results: list[dict], rule: str | None = None,
                  source: str = "search/results.jsonl", prior=None) -> dict:
    """The mixture the results point to, by `search.final` (or `rule`, e.g. "predicted").

    A pick among measured mixtures ("seen", "measured-predicted") is among proxies trained to
    the end: one stopped at a rung (search.halving) holds a predicted final value only."""
    from dataclasses import replace as dc_replace

    from climb.optimize.strategy import final_pick, from_search_config
    search_cfg = cfg.search
    ok = _ok_sorted(results)
    if (rule or search_cfg.final) != "predicted":
        ok = [r for r in ok if "stopped" not in r]
    if len(ok) < 2:
        raise RuntimeError(f"only {len(ok)} proxies succeeded; see {len(results)} records in {source}")
    X = np.array([r["weights"] for r in ok])
    y = np.array([r["objective"] for r in ok])
    fixed = fixed_candidates(cfg, space)
    pool = fixed if fixed is not None else candidate_pool(cfg, space, search_cfg.pool_size, search_cfg.seed + 99_991)
    strategy = dc_replace(from_search_config(search_cfg), prior=prior)
    if rule is not None:
        strategy = dc_replace(strategy, final=rule, final_top_k=1)
    pick = final_pick(X, y, cfg.target.goal, pool, strategy, search_cfg.seed)
    w = np.where(space["usable"], pick["weights"], 0.0)
    w /= w.sum()
    best_seen = ok[int(np.argmin(goal_sign(cfg.target.goal) * y))]
    return {"weights": w.tolist(), "predicted": pick["predicted"], "predictor": pick["predictor"],
            "best_seen": {"mixture_id": best_seen["mixture_id"], "objective": best_seen["objective"]}}


def key(cfg: RunConfig, paths: RunPaths) -> str:
    # A time limit, the retry rule or the curves recorded change how proxies run, not what they measure.
    return digest(upstream_key(paths, "tokenize"), without(cfg.proxy, "timeout_s", "curve_points", "curve_evals"),
                  cfg.target,
                  without(cfg.search, "retry_failed"), cfg.export.token_budget)


def run(cfg: RunConfig, paths: RunPaths) -> dict:
    # A damaged results file is repaired in place; an earlier search's results under another
    # config are moved aside, not deleted.
    return execute(paths, "search", key(cfg, paths), lambda folder, ex: _search(cfg, paths, ex),
                   executor=cfg.executor, processes=proxy_processes(cfg.proxy, cfg.executor),
                   keep=("results.jsonl",), keep_on_change=True, digest_files=("mixture.json",))


def _search(cfg: RunConfig, paths: RunPaths, ex) -> dict:
    search_cfg = cfg.search
    oof: list = []
    skill: list = []  # with experts: how the experts' ensemble loss ranks the measured mixtures
    results_log.repair(paths.search.results)
    space = mixture_space(cfg, cluster_tokens(paths))
    results = read_results(paths)
    done = {r["mixture_id"] for r in results if not results_log.retry(r, search_cfg.retry_failed)}
    prior = experts_feature(cfg, paths, ex, space)
    for it in range(len(search_cfg.iterations)):
        plan = plan_iteration(cfg, paths, it, space, [r for r in results if r["iteration"] < it], prior)
        todo = [m for m in plan["mixtures"] if m["mixture_id"] not in done]
        if todo:
            log.info("search iteration %d/%d: %d proxies (%d already done)", it + 1, len(search_cfg.iterations),
                     len(todo), len(plan["mixtures"]) - len(todo))
        if search_cfg.halving and it < len(search_cfg.iterations) - 1:
            halving(cfg, paths, ex, it, plan, done)
        else:
            tasks = [proxy_task(cfg, paths, m["mixture_id"], it, m["weights"], search_cfg.seed) for m in todo]
            run_proxies(cfg, ex, tasks, f"proxies it{it + 1}", lambda i, rec: _append(paths, rec))
        results = read_results(paths)  # the file is the record: CSVs, manifest and report agree with it
        results_log.require_successes(results, 1)
        _write_swarm_csv(paths, results)
        if it == 0:
            reps = replicates(cfg, paths, ex, results)
            q = _quality(cfg, results, reps, {}, [])
            log.info("noise after iteration 1: seed sd %s, paired sd %s, swarm sd %s, signal-to-noise %s",
                     *(_fmt(q[k]) for k in ("seed_sd", "paired_sd", "swarm_sd", "snr")))
            for w in warnings(q):
                log.warning("%s", w)
        # A resumed search's log already holds later iterations' records: each iteration's
        # figures are of the results up to it, as in an undisturbed run.
        so_far = [r for r in results if r["iteration"] <= it]
        oof.append(_oof(cfg, so_far))
        if prior is not None:
            skill.append(_experts_skill(cfg, prior, so_far))
        ok = [r for r in so_far if r["status"] == "ok"]
        if ok:
            best = min(ok, key=lambda r: goal_sign(cfg.target.goal) * r["objective"])
            log.info("after iteration %d: best %s = %.4f (%s); predictor out-of-fold Spearman %s%s",
                     it + 1, ",".join(cfg.target.objective), best["objective"], best["mixture_id"],
                     _fmt(oof[-1]), f"; experts' Spearman with the results {_fmt(skill[-1])}" if skill else "")
    results_log.require_successes(results, 2)
    final = final_mixture(cfg, space, results, prior=prior)
    write_json(paths.search.mixture, {**final, "natural": space["natural"].tolist(),
                                      "uniform": space["uniform"].tolist(), "max_weight": space["max_weight"].tolist(),
                                      "goal": cfg.target.goal, "objective": list(cfg.target.objective)})
    mixtures = {"climb": final["weights"], "uniform": space["uniform"], "natural": space["natural"]}
    if "one-shot" in search_cfg.baselines:
        mixtures["one-shot"] = one_shot(cfg, paths, ex, space, results)
    runs = compare(cfg, paths, ex, mixtures)
    if all(r["status"] != "ok" for per in runs.values() for r in per.values()):
        results_log.require_successes([r for per in runs.values() for r in per.values()], 1, "comparison proxies")
    table, verdicts = comparison_table(cfg, runs)
    quality = _quality(cfg, results, reps, runs, oof)
    if prior is not None:
        quality["experts_spearman"] = skill
    quality["comparison"] = verdicts
    quality["warnings"] = warnings(quality)
    write_json(paths.search.quality, quality)
    for w in quality["warnings"]:
        log.warning("%s", w)
    failed = sum(r["status"] != "ok" for r in results)
    stats = {"proxies": len(results), "failed": failed, "comparison": table, "verdicts": verdicts,
             "quality": {k: quality[k] for k in ("seed_sd", "paired_sd", "swarm_sd", "snr",
                                                 "predictor_oof_spearman")},
             "clusters": len(space["natural"]), "final_predicted": final["predicted"],
             "replicate_proxies": sum(len(v) - 1 for v in reps.values()),  # less the search's own run
             "comparison_proxies": sum(len(v) for v in runs.values()),
             "stopped_proxies": sum("stopped" in r for r in results),
             "expert_proxies": len(read_json(paths.search.experts)) if paths.search.experts.exists() else 0,
             "one_shot_proxies": len(read_json(paths.search.one_shot)) if paths.search.one_shot.exists() else 0}
    return stats


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _oof(cfg: RunConfig, results: list[dict]) -> float | None:
    ok = _ok_sorted(results)
    if len(ok) < 6:
        return None
    return oof_spearman([r["weights"] for r in ok], [r["objective"] for r in ok], cfg.search.predictor,
                        seed=cfg.search.seed)


def _experts_skill(cfg: RunConfig, prior, results: list[dict]) -> float | None:
    """Spearman between the experts' ensemble loss and the measured objective over the results
    so far, signed so that positive means the experts rank mixtures as the proxies do."""
    from scipy.stats import spearmanr
    ok = [r for r in _ok_sorted(results) if r.get("objective") is not None]
    if len(ok) < 3:
        return None
    f = np.asarray(prior(np.array([r["weights"] for r in ok], float)), float)
    y = goal_sign(cfg.target.goal) * np.array([r["objective"] for r in ok], float)
    if np.ptp(f) == 0 or np.ptp(y) == 0:
        return None
    return float(spearmanr(f, y).statistic)


# Target tokens the expert feature scores candidate pools on (a fixed random sample). On the
# demo (84,762 target tokens, 16 experts, a pool of 50,000) every token took 57 s a pool and
# 8,192 of them 2.3 s, ranking the pool alike (Spearman 0.9996; 2 cores, other runs going).
EXPERT_TOKENS = 8192


def experts_feature(cfg: RunConfig, paths: RunPaths, ex, space: dict):
    """With `search.experts`: train one expert per usable cluster (that fraction of the proxies'
    steps, on that cluster alone, the search's seed), keep its per-token log-probabilities of
    what the objective scores (target texts, tasks' gold continuations), and return the
    mixtures' expert-ensemble objective as a function of weights (climb.optimize.experts).
    None without experts."""
    from dataclasses import replace as dc_replace

    from climb.optimize.experts import ExpertFeature
    search_cfg = cfg.search
    if not search_cfg.experts:
        return None
    steps = max(1, round(search_cfg.experts * cfg.proxy.steps))
    proxy = dc_replace(cfg.proxy, steps=steps, warmup_steps=min(cfg.proxy.warmup_steps, steps - 1), curve_evals=0)
    clusters = [int(c) for c in np.flatnonzero(space["usable"])]
    out_file = paths.search.experts
    have = read_json(out_file) if out_file.exists() else {}
    k = len(space["usable"])
    todo = [c for c in clusters if results_log.retry(have.get(f"expert-{c:03d}"), search_cfg.retry_failed)
            or not coef_path(paths.search.expert_logprobs(c)).exists()]
    tasks = [dc_replace(proxy_task(cfg, paths, f"expert-{c:03d}", -3, np.eye(k)[c], search_cfg.seed), proxy=proxy,
                        logprobs=str(paths.search.expert_logprobs(c))) for c in todo]

    def keep(i: int, rec: dict) -> None:
        have[tasks[i].mixture_id] = rec
        write_json(out_file, have)
    if tasks:
        log.info("experts: %d proxies of %d steps, one per cluster", len(tasks), steps)
        ex.map(train_and_score, tasks, desc="experts", resources={"GPU": 1}, on_result=keep, parallel=True)
    bad = [c for c in clusters if have[f"expert-{c:03d}"]["status"] != "ok"]
    if bad:
        raise RuntimeError(f"the experts of clusters {bad} failed (see {out_file}); a rerun trains them again, "
                           "or set search.experts = 0")
    logp = np.stack([np.load(paths.search.expert_logprobs(c)) for c in clusters], 1)
    coef = np.load(coef_path(paths.search.expert_logprobs(clusters[0])))
    feature = ExpertFeature(logp, coef, max_tokens=EXPERT_TOKENS, seed=search_cfg.seed)
    cols = np.array(clusters)
    return lambda W: feature(np.asarray(W, float)[:, cols])


def halving(cfg: RunConfig, paths: RunPaths, ex, it: int, plan: dict, done: set) -> None:
    """One iteration by successive halving on the curves (search.halving; climb/optimize/halving.py).

    Every mixture of the plan trains to the rung and is scored there (kept in rungs_<it>.json,
    the run's state in checkpoints/); the continue set is chosen from all of them and the
    curve model of earlier iterations; those continue to the end and are logged with their
    rung value; then the rest are logged with the predicted final value, the curve model now
    including this iteration's. Every choice is a function of files on disk, so a resumed
    search makes the same ones.
    """
    from dataclasses import replace as dc_replace

    from climb.optimize.halving import continue_set, curve_shift, predicted_final
    search_cfg = cfg.search
    rung, keep_frac = search_cfg.halving
    steps = cfg.proxy.steps
    at = min(steps - 1, max(1, round(rung * steps)))
    tasks = {m["mixture_id"]: proxy_task(cfg, paths, m["mixture_id"], it, m["weights"], search_cfg.seed)
             for m in plan["mixtures"]}
    rung_file = paths.search.rungs(it)
    have = read_json(rung_file) if rung_file.exists() else {}
    todo = [dc_replace(t, stop_at=at, checkpoint=str(paths.search.checkpoint(m))) for m, t in tasks.items()
            if m not in done and results_log.retry(have.get(m), search_cfg.retry_failed)]

    def keep_rung(i: int, rec: dict) -> None:
        have[todo[i].mixture_id] = rec
        write_json(rung_file, have)
    if todo:
        ex.map(train_and_score, todo, desc=f"proxies it{it + 1} to step {at}/{steps}", resources={"GPU": 1},
               on_result=keep_rung, parallel=True)
    for m in tasks:  # a proxy that failed at the rung fails as a whole (and is retried on resume)
        if m not in done and have.get(m, {}).get("status") != "ok":
            _append(paths, have[m])
    values = {m: have[m]["objective"] for m in tasks if have.get(m, {}).get("status") == "ok"}
    go_on = continue_set(values, cfg.target.goal, keep_frac, curve_shift(_curve_pairs(paths, it)))
    log.info("iteration %d: %d of %d proxies continue past step %d/%d: %s", it + 1, len(go_on), len(values), at,
             steps, ", ".join(go_on))
    rest = [dc_replace(tasks[m], checkpoint=str(paths.search.checkpoint(m))) for m in go_on if m not in done]

    def finished(i: int, rec: dict) -> None:
        first = have[rest[i].mixture_id]
        rec["rung"] = {"step": at, "objective": first["objective"], "metrics": first["metrics"]}
        rec["seconds"] = round(rec.get("seconds", 0) + first.get("seconds", 0), 3)  # the whole proxy's time
        _append(paths, rec)
    if rest:
        ex.map(train_and_score, rest, desc=f"proxies it{it + 1} from step {at} to {steps}", resources={"GPU": 1},
               on_result=finished, parallel=True)
    shift = curve_shift(_curve_pairs(paths, it + 1))
    for m in values:
        if m in go_on or m in done:
            continue
        pred, sd = predicted_final(values[m], shift)
        _append(paths, {**have[m], "objective": pred,
                        "stopped": {"step": at, "steps": steps, "objective": values[m], "predicted_sd": sd,
                                    "curve_model_proxies": shift[2]}})
    for m in tasks:
        paths.search.checkpoint(m).unlink(missing_ok=True)


def _curve_pairs(paths: RunPaths, before: int) -> list[tuple[float, float]]:
    """(rung value, final value) of the proxies of iterations before `before` that continued
    past their rung (a resumed search's log may hold later ones: they are left out)."""
    return [(r["rung"]["objective"], r["objective"]) for r in read_results(paths)
            if r["status"] == "ok" and "rung" in r and r["iteration"] < before]


def replicates(cfg: RunConfig, paths: RunPaths, ex, results: list[dict]) -> dict:
    """Retrain the first `search.replicates` mixtures of iteration 1 with `replicate_seeds` more
    seeds; returns {mixture_id: {seed: objective}} including the search's own seed."""
    search_cfg = cfg.search
    out_file = paths.search.replicates
    have = read_json(out_file) if out_file.exists() else {}
    first = sorted((r for r in results if r["iteration"] == 0 and "stopped" not in r),
                   key=lambda r: r["mixture_id"])[: search_cfg.replicates]
    seeds = [search_cfg.seed + 1 + s for s in range(search_cfg.replicate_seeds)]
    todo = [(r, s) for r in first for s in seeds
            if results_log.retry(have.get(f"{r['mixture_id']}/{s}"), search_cfg.retry_failed)]
    tasks = [proxy_task(cfg, paths, f"{r['mixture_id']}-seed{s}", 0, r["weights"], s) for r, s in todo]

    def keep(i: int, rec: dict) -> None:
        have["{}/{}".format(todo[i][0]["mixture_id"], todo[i][1])] = rec
        write_json(out_file, have)
    if tasks:
        run_proxies(cfg, ex, tasks, "replicate seeds", keep)
    table = {}
    for r in first:
        row = {search_cfg.seed: r["objective"]}
        row.update({s: have[f"{r['mixture_id']}/{s}"]["objective"] for s in seeds})
        table[r["mixture_id"]] = row
    return table


def _quality(cfg: RunConfig, results: list[dict], reps: dict, runs: dict, oof: list) -> dict:
    """Noise (replicates and comparison runs pooled), signal (iteration 1's spread), SNR, predictor skill."""
    tables = [[list(row.values()) for row in reps.values()]] if reps else []
    if runs:
        tables.append([[rec["objective"] for rec in per.values()] for per in runs.values()])
    clean = [[[v if v is not None else np.nan for v in row] for row in t] for t in tables]
    n = pooled_noise(clean)
    swarm = [r["objective"] for r in results if r["iteration"] == 0 and r["status"] == "ok"]
    sd = float(np.std(swarm, ddof=1)) if len(swarm) > 2 else None
    return {"seed_sd": n["seed_sd"], "paired_sd": n["paired_sd"], "noise_df": n["df"], "swarm_sd": sd,
            "snr": snr(swarm, n["paired_sd"]), "predictor_oof_spearman": oof,
            "replicates": {k: {str(s): v for s, v in row.items()} for k, row in reps.items()},
            "thresholds": {"snr": MIN_SNR, "oof_spearman": MIN_OOF_SPEARMAN}}


def one_shot(cfg: RunConfig, paths: RunPaths, ex, space: dict, results: list[dict]) -> list[float]:
    """RegMix's way at the search's budget: sum(iterations) mixtures from the initial distribution
    (the first ones are iteration 1's, already trained), the predictor fitted once, and the best
    predicted mixture of a fresh pool taken, whatever `search.final` says for climb's own pick.
    With `search.candidates`, the mixtures and the pick come from the candidate set."""
    search_cfg = cfg.search
    total = sum(search_cfg.iterations)
    fixed = fixed_candidates(cfg, space)
    if fixed is None:
        pool = candidate_pool(cfg, space, max(total * 20, 1000), search_cfg.seed)[:total]
    else:  # iteration 1's random draw from the candidates (climb.optimize.strategy.plan, seed + 0), continued
        pool = fixed[np.random.default_rng(search_cfg.seed).permutation(len(fixed))[:total]]
    trained = {r["mixture_id"]: r for r in results if r["iteration"] == 0}
    out_file = paths.search.one_shot
    have = read_json(out_file) if out_file.exists() else {}
    todo = [j for j in range(len(pool))
            if f"it0-{j:03d}" not in trained
            and results_log.retry(have.get(f"oneshot-{j:03d}"), search_cfg.retry_failed)]
    tasks = [proxy_task(cfg, paths, f"oneshot-{j:03d}", -2, pool[j], search_cfg.seed) for j in todo]

    def keep(i: int, rec: dict) -> None:
        have[f"oneshot-{todo[i]:03d}"] = rec
        write_json(out_file, have)
    if tasks:
        log.info("one-shot baseline: %d more proxies from the initial distribution", len(tasks))
        run_proxies(cfg, ex, tasks, "one-shot proxies", keep)
    recs = [trained.get(f"it0-{j:03d}") or have[f"oneshot-{j:03d}"] for j in range(len(pool))]
    pick = final_mixture(cfg, space, recs, rule="predicted", source="search/one_shot.json")
    write_json(paths.search.one_shot_mixture,
               {"weights": pick["weights"], "predicted": pick["predicted"], "predictor": pick["predictor"],
                "proxies": len(recs), "succeeded": len(_ok_sorted(recs))})
    return pick["weights"]


def compare(cfg: RunConfig, paths: RunPaths, ex, mixtures: dict) -> dict:
    """Train every compared mixture with the same fresh seeds (paired; seeds the search never
    used). Returns {name: {seed: record}}; every run is kept in comparison.json."""
    out_file = paths.search.comparison
    have = read_json(out_file) if out_file.exists() else {}
    names = ["climb"] + [b for b in cfg.search.baselines if b in mixtures]
    seeds = [cfg.search.eval_seed + s for s in range(cfg.search.eval_seeds)]
    todo = [(n, seed) for n in names for seed in seeds
            if results_log.retry(have.get(f"{n}/{seed}"), cfg.search.retry_failed)]
    tasks = [proxy_task(cfg, paths, f"final-{n}-{seed}", -1, mixtures[n], seed) for n, seed in todo]

    def keep(i: int, rec: dict) -> None:
        have["{}/{}".format(*todo[i])] = rec
        write_json(out_file, have)
    run_proxies(cfg, ex, tasks, "final comparison", keep)
    return {n: {seed: have[f"{n}/{seed}"] for seed in seeds} for n in names}


def comparison_table(cfg: RunConfig, runs: dict) -> tuple[dict, dict]:
    """Mean objective per mixture, and climb against each baseline (paired by seed)."""
    table, verdicts = {}, {}
    for n, per in runs.items():
        vals = [r["objective"] for r in per.values() if r["objective"] is not None]
        table[n] = float(np.mean(vals)) if vals else None
    ours = runs["climb"]
    for n, per in runs.items():
        if n == "climb":
            continue
        seeds = sorted(per)
        pair = [(ours[s]["objective"], per[s]["objective"]) for s in seeds]
        a = [x if x is not None else np.nan for x, _ in pair]
        b = [y if y is not None else np.nan for _, y in pair]
        verdicts[n] = paired_comparison(a, b, cfg.target.goal)
    log.info("final comparison (%s, %s; %d paired seeds): %s", ",".join(cfg.target.objective), cfg.target.goal,
             cfg.search.eval_seeds, {k: round(v, 4) if v is not None else None for k, v in table.items()})
    for n, c in verdicts.items():
        log.info("climb vs %s: %s", n, fmt_comparison(n, c))
    return table, verdicts


def _write_swarm_csv(paths: RunPaths, results: list[dict]) -> None:
    from climb.io.swarm_csv import write_swarm
    ok = _ok_sorted(results)
    if not ok:
        return
    k = len(ok[0]["weights"])
    names = sorted({m for r in ok for m in r["metrics"]})
    metrics = {"objective": np.array([r["objective"] for r in ok]),
               "iteration": np.array([r["iteration"] for r in ok])}
    metrics.update({m: np.array([r["metrics"].get(m, np.nan) for r in ok]) for m in names})
    write_swarm(paths.search.swarm_weights, paths.search.swarm_metrics, [r["mixture_id"] for r in ok],
                [f"cluster_{c}" for c in range(k)], np.array([r["weights"] for r in ok]), metrics)
