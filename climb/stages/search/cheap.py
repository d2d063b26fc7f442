"""Cheaper ways for a search to choose (docs/spending-less.md).

- experts (`search.experts`): one small model per cluster and the mixtures' expert-ensemble
  objective as the predictor's feature;
- successive halving (`search.halving`): proxies stopped at a rung unless their curve
  says they may be best;
- a shared base (`search.base`): one proxy trained part of the way on the natural mixture,
  once per run, which every search proxy and replicate continues on its own mixture;
- merged models (`search.merge`): the base continued on each cluster alone, and any
  mixture scored by the model whose weights are those continuations' mixed by its weights.
"""
from __future__ import annotations

import logging

import numpy as np

from climb.config import RunConfig, digest, without
from climb.io.files import read_json, write_json
from climb.optimize.predictor import goal_sign
from climb.runtime import results as results_log
from climb.runtime.proxy_runs import coef_path, train_and_score
from climb.runtime.stage import upstream_key
from climb.runtime.layout import RunPaths
from climb.stages.search.common import append, base_steps, ok_sorted, proxy_task, read_results

log = logging.getLogger(__name__)


def experts_skill(cfg: RunConfig, prior, results: list[dict]) -> float | None:
    """Spearman between the experts' ensemble loss and the measured objective over the results
    so far, signed so that positive means the experts rank mixtures as the proxies do."""
    from scipy.stats import spearmanr
    ok = [r for r in ok_sorted(results) if r.get("objective") is not None]
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
            append(paths, have[m])
    values = {m: have[m]["objective"] for m in tasks if have.get(m, {}).get("status") == "ok"}
    go_on = continue_set(values, cfg.target.goal, keep_frac, curve_shift(_curve_pairs(paths, it)))
    log.info("iteration %d: %d of %d proxies continue past step %d/%d: %s", it + 1, len(go_on), len(values), at,
             steps, ", ".join(go_on))
    rest = [dc_replace(tasks[m], checkpoint=str(paths.search.checkpoint(m))) for m in go_on if m not in done]

    def finished(i: int, rec: dict) -> None:
        first = have[rest[i].mixture_id]
        rec["rung"] = {"step": at, "objective": first["objective"], "metrics": first["metrics"]}
        rec["seconds"] = round(rec.get("seconds", 0) + first.get("seconds", 0), 3)  # the whole proxy's time
        append(paths, rec)
    if rest:
        ex.map(train_and_score, rest, desc=f"proxies it{it + 1} from step {at} to {steps}", resources={"GPU": 1},
               on_result=finished, parallel=True)
    shift = curve_shift(_curve_pairs(paths, it + 1))
    for m in values:
        if m in go_on or m in done:
            continue
        pred, sd = predicted_final(values[m], shift)
        append(paths, {**have[m], "objective": pred,
                        "stopped": {"step": at, "steps": steps, "objective": values[m], "predicted_sd": sd,
                                    "curve_model_proxies": shift[2]}})
    for m in tasks:
        paths.search.checkpoint(m).unlink(missing_ok=True)


def _curve_pairs(paths: RunPaths, before: int) -> list[tuple[float, float]]:
    """(rung value, final value) of the proxies of iterations before `before` that continued
    past their rung (a resumed search's log may hold later ones: they are left out)."""
    return [(r["rung"]["objective"], r["objective"]) for r in read_results(paths)
            if r["status"] == "ok" and "rung" in r and r["iteration"] < before]


def shared_base(cfg: RunConfig, paths: RunPaths, ex, space: dict) -> str:
    """With `search.base`: the shared base's checkpoint, trained first if it is not there yet
    (one proxy on the natural mixture with the search's seed, paused after base_steps(cfg)
    steps; "" without a base).

    It is trained once per run and kept with its key (the proxy settings, its steps, the
    seed, the natural mixture and the token store): a resumed search reuses it, and any
    change of those trains it again. Its record (in base.json) counts its tokens once in the
    compute account; the proxies that continue it count only their own steps.
    """
    from dataclasses import replace as dc_replace
    at = base_steps(cfg)
    if not at:
        return ""
    ckpt, rec_file = paths.search.base_checkpoint, paths.search.base
    from climb.stages.tokenize import short_of
    key = digest(upstream_key(paths, "tokenize"), *short_of(paths, cfg.proxy.read_cap()),
                 without(cfg.proxy, "timeout_s", "curve_points", "curve_evals"), at,
                 cfg.search.seed, [round(float(w), 12) for w in space["natural"]])
    have = read_json(rec_file) if rec_file.exists() else {}
    if have.get("key") == key and have.get("base", {}).get("status") == "ok" and ckpt.exists():
        return str(ckpt)
    log.info("shared base: one proxy on the natural mixture for %d of its %d steps", at, cfg.proxy.steps)
    task = dc_replace(proxy_task(cfg, paths, "base", -4, space["natural"], cfg.search.seed), stop_at=at,
                      checkpoint=str(ckpt))
    rec = ex.map(train_and_score, [task], desc="shared base", resources={"GPU": 1})[0]
    if rec["status"] == "ok" and not ckpt.exists():
        rec = {**rec, "status": "failed", "error": f"no checkpoint was written to {ckpt}"}
    if rec["status"] != "ok":
        write_json(rec_file, {"base": rec, "key": key})
        raise RuntimeError(f"the shared base failed ({rec.get('error')}; see {rec_file}); a rerun trains it again, "
                           "or set search.base = 0")
    write_json(rec_file, {"base": {**rec, "base_of": cfg.proxy.steps}, "key": key})
    return str(ckpt)


def merged_feature(cfg: RunConfig, paths: RunPaths, ex, space: dict, base: str):
    """With `search.merge`: continue the shared base on each usable cluster alone (kept in
    merge/, resumed cluster by cluster) and return each mixture's merged-model objective
    as a function of weights (climb.runtime.merged.MergedFeature); None without merge."""
    from dataclasses import replace as dc_replace

    from climb.runtime.merged import MergedFeature
    from climb.runtime.proxy_runs import tokenizer_of
    if not cfg.search.merge:
        return None
    clusters = [int(c) for c in np.flatnonzero(space["usable"])]
    out_file, k = paths.search.merge, len(space["usable"])
    have = read_json(out_file) if out_file.exists() else {}
    todo = [c for c in clusters if results_log.retry(have.get(f"merge-{c:03d}"), cfg.search.retry_failed)
            or not paths.search.merge_model(c).exists()]
    tasks = [dc_replace(proxy_task(cfg, paths, f"merge-{c:03d}", -5, np.eye(k)[c], cfg.search.seed, base=base),
                        save_model=str(paths.search.merge_model(c))) for c in todo]

    def keep(i: int, rec: dict) -> None:
        have[tasks[i].mixture_id] = rec
        write_json(out_file, have)
    if tasks:
        log.info("merged models: the base continued on each of %d clusters alone", len(tasks))
        ex.map(train_and_score, tasks, desc="merged models", resources={"GPU": 1}, on_result=keep, parallel=True)
    bad = [c for c in clusters if have[f"merge-{c:03d}"]["status"] != "ok"]
    if bad:
        raise RuntimeError(f"the base's continuations on clusters {bad} failed (see {out_file}); a rerun trains "
                           "them again, or set search.merge = false")
    feature = MergedFeature([str(paths.search.merge_model(c)) for c in clusters], cfg.proxy, cfg.target,
                            tokenizer_of(paths.tokenize.dir), paths.root, max_tokens=cfg.search.merge_tokens,
                            seed=cfg.search.seed)
    cols = np.array(clusters)

    def score(W):
        return feature(np.asarray(W, float)[:, cols])
    score.feature = feature
    score.before = have.get("merge-scoring")  # what a search killed earlier spent scoring
    return score


def record_merge_scoring(paths: RunPaths, prior, seed: int) -> None:
    """Put the merged models' scoring so far into the compute account (merge.json)."""
    feature = getattr(prior, "feature", None)
    if feature is None or not hasattr(feature, "record"):
        return
    rec, before = feature.record(seed), getattr(prior, "before", None) or {}
    for k in ("tokens", "seconds", "forward_tokens", "mixtures_scored"):
        rec[k] = rec[k] + before.get(k, 0)
    have = read_json(paths.search.merge)
    have["merge-scoring"] = rec
    write_json(paths.search.merge, have)
