"""Stage 4, search: the CLIMB loop over cluster mixtures.

Reads: `<run>/tokenize/` (the token store the proxies train on), `<run>/cluster/clusters.json`,
the target, and the corpus's `corpus.source_column` alone (where set).
Writes: `<run>/search/`: `results.jsonl`, `plan_<i>.json`, `mixture.json`, `comparison.json`,
`quality.json`, `contamination.json`, `sources.json`, the swarm as CSV (and `reuse_plan.json`,
`reuse.json` with `search.reuse`).
Rooms: `common` (the pool, proxies, final mixture), `cheap` (experts, shared base, merged
models), `compare` (the paired comparison), `summary` (what a finished search found, for the
report and the export's card), `sources` (each source's share of each cluster, and the
mixture by source), `repick` (`climb repick`: a finished search picked again under another
objective, under `search/repicks/`), `reuse` (`search.reuse`: an earlier run's evidence, checked by a
confirmation round on this corpus first), `virtual` (`search.reuse` across other clusters: the earlier
found mixture as one fixed component, the search over it and the new clusters), `finalists`
(`search.finalists`: the last iteration spent measuring the best few mixtures again, paired); the pick
itself is climb/optimize/pick.py.

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

Two settings spend less proxy compute on the same choice (docs/spending-less.md):
`search.halving` trains every proxy of an iteration but the last to a rung, scores it
there and continues only the best (from a checkpoint), the rest
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

import numpy as np

from climb.config import RunConfig, digest, without
from climb.config.objective import describe
from climb.io.files import read_json, write_json
from climb.optimize.predictor import goal_sign
from climb.optimize.quality import MIN_OOF_SPEARMAN, MIN_SNR, oof_spearman, pooled_noise, snr, warnings
from climb.runtime import results as results_log
from climb.runtime.device import proxy_processes
from climb.runtime.stage import execute, older_key, upstream_key
from climb.runtime.layout import RunPaths
from climb.runtime.targets import target_files
from climb.stages.search.cheap import (experts_feature, experts_skill, halving, merged_feature, record_merge_scoring,
                                       shared_base)
from climb.stages.search.common import (append, source_bounds, candidate_pool, final_mixture, fixed_candidates, mixture_space,
                                        ok_sorted, pool_size, proxy_task, read_results, replicate_noise, rerun_figure,
                                        run_proxies, search_bounds)
from climb.stages.search.compare import compare, comparison_table, one_shot, replicates
from climb.stages.search.reuse import CONFIRMATION, confirm, evidence_key
from climb.stages.search import finalists, reuse, virtual
from climb.stages.search.sources import by_source, write_source_shares
from climb.stages.tokenize import cluster_tokens

log = logging.getLogger(__name__)

def plan_iteration(cfg: RunConfig, paths: RunPaths, it: int, space: dict, seen: list[dict],
                   prior=None, pool=None) -> dict:
    """The mixtures of iteration `it` (saved, so a resumed search trains the same ones);
    `prior`: the experts' feature the predictor fits a line in first (search.experts); `pool`:
    pool(n, seed), the candidates to propose from instead of the Dirichlet pool (search.reuse
    across other clusters: climb.stages.search.virtual), its first rows taken first when the
    iteration is a random one."""
    from dataclasses import replace as dc_replace

    from climb.optimize.strategy import from_search_config
    from climb.optimize.strategy import plan as plan_indices
    plan_file = paths.search.plan(it)
    if plan_file.exists():
        return read_json(plan_file)
    search_cfg = cfg.search
    n = search_cfg.iterations[it]
    fixed = fixed_candidates(cfg, space) if pool is None else None
    draw = pool or (lambda m, seed: candidate_pool(cfg, space, m, seed))
    pool = fixed if fixed is not None else draw(pool_size(cfg) if it else max(n * 20, 1000),
                                                search_cfg.seed + 1000 * it)
    ok = ok_sorted(seen)
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


def key(cfg: RunConfig, paths: RunPaths, legacy: bool = False) -> str:
    """The stage key: the token store as the proxies read it, the proxies, the target with its files
    by what they hold (`legacy`: without them, as older run folders keyed it), the search and the
    budget (its epoch caps). Not the store's cap: every proxy (experts and a shared base too) reads
    the first proxy.read_cap() tokens of a cluster, the same from any store that keeps as many, so a
    store sized for the validation model reruns no search (climb.stages.tokenize.short_of)."""
    from climb.stages.tokenize import short_of
    # A time limit, the retry rule or the curves recorded change how proxies run, not what they measure.
    parts = [upstream_key(paths, "tokenize"), *short_of(paths, cfg.proxy.read_cap()),
             without(cfg.proxy, "timeout_s", "curve_points", "curve_evals"),
             cfg.target, without(cfg.search, "retry_failed", "reuse"), cfg.export.token_budget]
    # Sources change what the search does only through a bound on a source; the views by source
    # are worked out again from the column (climb.stages.search.sources.load_source_shares).
    if cfg.corpus.source_column and source_bounds(cfg):
        parts.append({"source_column": cfg.corpus.source_column})
    if cfg.search.reuse:  # the earlier run's evidence by what it holds, not where it lies
        parts.append({"reuse": evidence_key(cfg)})
        # Across other clusters its found mixture is read through its documents: its clusters and
        # token store count too, as its own search's key holds them.
        if reuse.mode(reuse.earlier(cfg), paths) == "virtual":
            parts.append({"component_of": reuse.earlier_search_key(cfg)})
    return digest(*parts) if legacy else digest(*parts, target_files(cfg.target, paths.root, paths.digests))


def check_reuse(cfg: RunConfig, paths: RunPaths) -> None:
    """An earlier run named by search.reuse against this one (climb.stages.search.reuse.check)."""
    reuse.check(cfg, paths, key)


def run(cfg: RunConfig, paths: RunPaths) -> dict:
    # A damaged results file is repaired in place; an earlier search's results under another
    # config are moved aside, not deleted.
    check_reuse(cfg, paths)  # before anything is moved or trained
    return execute(paths, "search", key(cfg, paths), lambda folder, ex: _search(cfg, paths, ex),
                   legacy_key=older_key(paths, "search", lambda: key(cfg, paths, legacy=True)),
                   executor=cfg.executor, processes=proxy_processes(cfg.proxy, cfg.executor),
                   keep=("results.jsonl",), keep_on_change=True, digest_files=("mixture.json",))


def _search(cfg: RunConfig, paths: RunPaths, ex) -> dict:
    search_cfg = cfg.search
    oof: list = []
    skill: list = []  # with experts or merged models: how their feature ranks the measured mixtures
    feature_name = "merged models' objective" if search_cfg.merge else "experts' ensemble loss"
    results_log.repair(paths.search.results)
    space = mixture_space(cfg, cluster_tokens(paths))
    shares = write_source_shares(cfg, paths)
    space["sources"] = {"names": shares["names"], "share": np.asarray(shares["share"])}
    space["bounds"] = search_bounds(cfg, space)
    if search_cfg.target_prior and fixed_candidates(cfg, space) is None:
        from climb.stages.search.affinity import target_affinity
        aff = target_affinity(cfg, paths, space["usable"])
        space["target"] = np.asarray(aff["share"]) if aff else None
    from climb.stages.tokenize.contamination import check as contamination_check
    from climb.stages.tokenize.contamination import leaning
    from climb.stages.tokenize.contamination import warning as contamination_warning
    scan = contamination_check(cfg, paths)
    results = read_results(paths)
    done = {r["mixture_id"] for r in results if not results_log.retry(r, search_cfg.retry_failed)}
    base = shared_base(cfg, paths, ex, space)
    prior = experts_feature(cfg, paths, ex, space) or merged_feature(cfg, paths, ex, space, base)
    # search.reuse: a confirmation round decides where the search starts and what it leans on;
    # across other clusters, the earlier found mixture is one fixed component of a smaller search.
    reused = {"start": 0, "evidence": [], "plan_prior": prior, "pick_prior": prior, "summary": None}
    ep = reuse.earlier(cfg) if search_cfg.reuse else None
    if ep is not None and reuse.mode(ep, paths) == "virtual":
        # Under the same clusters, the component way is taken only where documents were just removed.
        reused = virtual.prepare(cfg, paths, space, ep, removed=reuse.same_clusters(ep, paths))
    elif ep is not None:
        reused = confirm(cfg, paths, ex, space, base)
        results = read_results(paths)
        done |= {r["mixture_id"] for r in results if not results_log.retry(r, search_cfg.retry_failed)}
    reps: dict = {}
    fin = None
    for it in range(reused["start"], len(search_cfg.iterations)):
        if search_cfg.finalists and it == len(search_cfg.iterations) - 1:
            # The last iteration measures the best few mixtures again, paired, instead of new ones.
            fin = finalists.run(cfg, paths, ex, results, reused["plan_prior"], space.get("bounds"), base)
            continue
        plan = plan_iteration(cfg, paths, it, space,
                              reused["evidence"] + [r for r in results if r["iteration"] < it], reused["plan_prior"],
                              pool=reused.get("pool"))
        todo = [m for m in plan["mixtures"] if m["mixture_id"] not in done]
        if todo:
            log.info("search iteration %d/%d: %d proxies (%d already done)", it + 1, len(search_cfg.iterations),
                     len(todo), len(plan["mixtures"]) - len(todo))
        if search_cfg.halving and it < len(search_cfg.iterations) - 1:
            halving(cfg, paths, ex, it, plan, done)
        else:
            tasks = [proxy_task(cfg, paths, m["mixture_id"], it, m["weights"], search_cfg.seed, base=base)
                     for m in todo]
            run_proxies(cfg, ex, tasks, f"proxies it{it + 1}", lambda i, rec: append(paths, rec))
        results = read_results(paths)  # the file is the record: CSVs, manifest and report agree with it
        results_log.require_successes(results, 1)
        _write_swarm_csv(paths, results)
        if it == reused["start"]:
            # A reuse whose evidence held (or drifted) takes the earlier run's replicate seeds instead.
            reps = reused.get("replicates") or replicates(cfg, paths, ex, results, base,
                                                          iteration=reused.get("first", 0))
            q = _quality(cfg, results, reps, {}, [], first=reused.get("first", 0))
            log.info("noise after iteration 1: seed sd %s, paired sd %s, swarm sd %s, signal-to-noise %s",
                     *(_fmt(q[k]) for k in ("seed_sd", "paired_sd", "swarm_sd", "snr")))
            for w in warnings(q):
                log.warning("%s", w)
        # A resumed search's log already holds later iterations' records: each iteration's
        # figures are of the results up to it, as in an undisturbed run.
        so_far = [r for r in results if r["iteration"] <= it]
        oof.append(_oof(cfg, so_far))
        if prior is not None:
            skill.append(experts_skill(cfg, prior, so_far))
            record_merge_scoring(paths, prior, search_cfg.seed)
        ok = [r for r in so_far if r["status"] == "ok"]
        if ok:
            best = min(ok, key=lambda r: goal_sign(cfg.target.goal) * r["objective"])
            log.info("after iteration %d: best %s = %.4f (%s); predictor out-of-fold Spearman %s%s",
                     it + 1, ",".join(cfg.target.objective), best["objective"], best["mixture_id"],
                     _fmt(oof[-1]), f"; the {feature_name}'s Spearman with the results {_fmt(skill[-1])}"
                     if skill else "")
    if "component" in reused and reused["start"] == len(search_cfg.iterations):
        # No cluster is new: nothing is left to choose, and the pick is the earlier mixture read over these clusters.
        final = virtual.component_pick(space, reused["component"])
        paths.search.results.touch()  # an empty log: this search trained no proxy, and a later reuse reads it
    else:
        results_log.require_successes(results, 2)
        final = final_mixture(cfg, space, results, prior=reused["pick_prior"],
                              pool=reused["pool"](pool_size(cfg), search_cfg.seed + 99_991)
                              if "pool" in reused else None, noise=replicate_noise(reps))
    if fin is not None:
        best, rows = finalists.pick(cfg, fin)
        w = np.where(space["usable"], best["weights"], 0.0)
        final = {**final, "weights": (w / w.sum()).tolist(),
                 "predicted": finalists.predicted(cfg, results, w / w.sum(), reused["pick_prior"]),
                 "finalists": [{k: r[k] for k in ("mixture_id", "values", "mean")} for r in rows]}
        log.info("finalists: %s; the pick is %s", ", ".join(f"{r['mixture_id']} {r['mean']:.4f} over "
                                                           f"{len(r['values'])} seeds" for r in rows), best["mixture_id"])
    if "component" in reused:
        reused["summary"] = virtual.finish(paths, reused["summary"], results)
    record_merge_scoring(paths, prior, search_cfg.seed)
    write_json(paths.search.mixture, {**final, "natural": space["natural"].tolist(),
                                      "uniform": space["uniform"].tolist(), "max_weight": space["max_weight"].tolist(),
                                      "goal": cfg.target.goal, "objective": list(cfg.target.objective),
                                      "by_source": by_source(shares, {"climb": final["weights"],
                                                                      "natural": space["natural"],
                                                                      "uniform": space["uniform"]})})
    mixtures = {"climb": final["weights"], "uniform": space["uniform"], "natural": space["natural"]}
    if "one-shot" in search_cfg.baselines:
        mixtures["one-shot"] = one_shot(cfg, paths, ex, space, results, base)
    runs = compare(cfg, paths, ex, mixtures)
    if all(r["status"] != "ok" for per in runs.values() for r in per.values()):
        results_log.require_successes([r for per in runs.values() for r in per.values()], 1, "comparison proxies")
    table, verdicts = comparison_table(cfg, runs)
    quality = _quality(cfg, results, reps, runs, oof, first=reused.get("first", 0))
    quality["trained_in"] = sorted({f"{r['device']} {r['precision']}" for r in results + [
        x for per in runs.values() for x in per.values()] if r.get("device") and r.get("status") == "ok"})
    if prior is not None:
        quality["merge_spearman" if search_cfg.merge else "experts_spearman"] = skill
    quality["comparison"] = verdicts
    if reused["summary"]:
        quality["reuse"] = reused["summary"]
    if "steadiness" in final:
        quality["steadiness"] = {k: v for k, v in final["steadiness"].items() if k != "picks"}
        # The simulated re-runs model the search's rounds and its pick, nothing else: not kept where a
        # feature steers the search (they read 6-8 x the measured seed-to-seed sd of the demo's experts
        # search) nor where the last iteration measures finalists again (0.29 x on tech's target-final
        # arm; docs/benchmarks/steady-answer.md).
        skipped = feature_name if prior is not None else ("finalists" if search_cfg.finalists else None)
        rerun = None if skipped else rerun_figure(cfg, space, results, quality["paired_sd"])
        if rerun is not None:
            quality["steadiness"].update(rerun)
        elif skipped:
            quality["steadiness"]["rerun_skipped"] = skipped
    quality["warnings"] = warnings(quality)
    if scan is not None:
        quality["contamination"] = {"docs": scan["docs"], "tokens": scan["tokens"],
                                    **leaning(scan, final["weights"], space["natural"])}
        lean = contamination_warning(scan, final["weights"], space["natural"])
        quality["warnings"] += [lean] if lean else []
    write_json(paths.search.quality, quality)
    for w in quality["warnings"]:
        log.warning("%s", w)
    from climb.stages.search.summary import verdict
    said = verdict({"results": {k: v for k, v in table.items() if v is not None}, "comparison": verdicts,
                    "target": {"name": describe(cfg.target), "goal": cfg.target.goal}})
    (log.info if said["kind"] == "better" else log.warning)("%s", said["sentence"])
    failed = sum(r["status"] != "ok" for r in results)
    stats = {"proxies": len(results), "failed": failed, "comparison": table, "verdicts": verdicts,
             "quality": {k: quality[k] for k in ("seed_sd", "paired_sd", "swarm_sd", "snr",
                                                 "predictor_oof_spearman")},
             "clusters": len(space["natural"]), "final_predicted": final["predicted"],
             # less the search's own run; none where a reuse took the earlier run's
             "replicate_proxies": 0 if reused.get("replicates") else sum(len(v) - 1 for v in reps.values()),
             "comparison_proxies": sum(len(v) for v in runs.values()),
             "stopped_proxies": sum("stopped" in r for r in results),
             "expert_proxies": len(read_json(paths.search.experts)) if paths.search.experts.exists() else 0,
             "base_proxies": int(bool(base)),
             "merge_proxies": sum(k != "merge-scoring" for k in read_json(paths.search.merge))
             if paths.search.merge.exists() else 0,
             "one_shot_proxies": len(read_json(paths.search.one_shot)) if paths.search.one_shot.exists() else 0}
    if reused["summary"]:
        stats["reuse"] = {k: reused["summary"][k] for k in ("mode", "decision", "confirmation_proxies", "new_clusters",
                                                            "proxies") if k in reused["summary"]}
    return stats


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _oof(cfg: RunConfig, results: list[dict]) -> float | None:
    ok = ok_sorted(results)
    if len(ok) < 6:
        return None
    return oof_spearman([r["weights"] for r in ok], [r["objective"] for r in ok], cfg.search.predictor,
                        seed=cfg.search.seed)


def _quality(cfg: RunConfig, results: list[dict], reps: dict, runs: dict, oof: list, first: int = 0) -> dict:
    """Noise (replicates and comparison runs pooled), signal (the first iteration's spread: iteration
    `first`, where a reuse across other clusters starts), SNR, predictor skill."""
    # In a fixed order (by mixture, then seed), so a resumed run's figures match an undisturbed one's
    # to the last bit, whatever order its proxies finished in.
    tables = [[[row[s] for s in sorted(row, key=str)] for _, row in sorted(reps.items())]] if reps else []
    if runs:
        tables.append([[per[s]["objective"] for s in sorted(per, key=str)] for _, per in sorted(runs.items())])
    clean = [[[v if v is not None else np.nan for v in row] for row in t] for t in tables]
    n = pooled_noise(clean)
    # A reused search's confirmation round is chosen, not drawn: no measure of the swarm's spread.
    swarm = [r["objective"] for r in sorted(results, key=lambda r: r["mixture_id"])
             if r["iteration"] == first and r["status"] == "ok" and not r["mixture_id"].startswith(CONFIRMATION)]
    sd = float(np.std(swarm, ddof=1)) if len(swarm) > 2 else None
    return {"seed_sd": n["seed_sd"], "paired_sd": n["paired_sd"], "noise_df": n["df"], "swarm_sd": sd,
            "snr": snr(swarm, n["paired_sd"]), "predictor_oof_spearman": oof,
            "replicates": {k: {str(s): v for s, v in row.items()} for k, row in reps.items()},
            "thresholds": {"snr": MIN_SNR, "oof_spearman": MIN_OOF_SPEARMAN}}


def _write_swarm_csv(paths: RunPaths, results: list[dict]) -> None:
    from climb.io.swarm_csv import write_swarm
    ok = ok_sorted(results)
    if not ok:
        return
    k = len(ok[0]["weights"])
    names = sorted({m for r in ok for m in r["metrics"]})
    metrics = {"objective": np.array([r["objective"] for r in ok]),
               "iteration": np.array([r["iteration"] for r in ok])}
    metrics.update({m: np.array([r["metrics"].get(m, np.nan) for r in ok]) for m in names})
    write_swarm(paths.search.swarm_weights, paths.search.swarm_metrics, [r["mixture_id"] for r in ok],
                [f"cluster_{c}" for c in range(k)], np.array([r["weights"] for r in ok]), metrics)
