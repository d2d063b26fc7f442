"""Re-pick: a finished search's mixture chosen again under another objective, training nothing.

Every proxy record keeps all the metrics its proxy reported, so a team that weighs its
metrics differently (`target.objective`, `target.weights`, `target.goals`, `target.goal`)
can see what the new weights pick, and what they trade away, without paying for proxies:

    climb repick --run runs/demo --set 'target.objective={bpb=1.0, "piqa/acc"={weight=0.5, goal="maximize"}}'
    climb repick --run runs/demo --set ... --compare   # and train the new pick's comparison proxies

Each proxy's objective is recomputed from its recorded metrics; the pick is made by the run's
own rule (`final_mixture`: search.final over the same pool); one predictor per metric
(climb.optimize.multi) gives every metric's predicted value at the pick, at the run's own pick,
at the mixture each metric alone prefers and at the one their aggregate prefers (a second
opinion beside the run's rule, from predictors that each fit one metric). All of it goes to
`search/repicks/<digest of the objective>.json`, and a small table is printed.

With `--compare`, the new pick alone is trained on the run's comparison seeds
(`search/repicks/<digest>.comparison.json`) and paired with the records already in
`search/comparison.json` (the baselines and the run's own pick, the same seeds and mixtures:
not trained again), each scored under the new objective from its metrics.

A re-pick reads the finished search and writes only under `search/repicks/` (not a search
output: climb.runtime.stage.NOT_OUTPUTS), so the search stays up to date and later stages
are not redone. The proxies stopped at a rung by successive halving are left out: their final
metrics are predicted, not measured. The experts' or merged models' feature of the run scores
its own objective, so a re-pick's predictors fit the proxies' results alone.
"""
from __future__ import annotations

import logging
import math
import time

import numpy as np

from climb.config import RunConfig, TargetConfig, digest, to_dict
from climb.config.objective import describe, metric_goal
from climb.io.errors import InputError
from climb.io.files import read_json, write_json
from climb.optimize.multi import aggregate, aggregate_pick, best_per_metric, fit_metrics, predict_metrics
from climb.runtime.layout import RunPaths
from climb.runtime.targets import objective
from climb.stages.search.common import final_mixture, final_pool, ok_sorted, read_results, replicate_noise

log = logging.getLogger(__name__)
# What a re-pick may change: the objective. [executor] and [track] say how proxies run and are logged.
STEERABLE = ("target.objective", "target.weights", "target.goals", "target.goal")
HOW = ("executor", "track")


def spec(cfg: RunConfig) -> dict:
    """The objective a re-pick optimises, as plain data (its digest names the re-pick's file)."""
    t = cfg.target
    return {"objective": list(t.objective), "weights": dict(t.weights), "goals": dict(t.goals), "goal": t.goal}


def spec_name(s: dict) -> str:
    """A re-pick's objective (its `spec`) as a short name (climb.config.objective.describe)."""
    return describe(TargetConfig(objective=tuple(s["objective"]), weights=s["weights"], goals=s["goals"],
                                 goal=s["goal"]))


def check_only_objective(run_cfg: RunConfig, cfg: RunConfig) -> None:
    """Refuse a re-pick whose config differs from the run's in anything but the objective."""
    def flat(c: RunConfig) -> dict:
        return {f"{s}.{k}": v for s, fields_ in to_dict(c).items() if isinstance(fields_, dict) and s not in HOW
                for k, v in fields_.items() if f"{s}.{k}" not in STEERABLE} | {"name": c.name}
    a, b = flat(run_cfg), flat(cfg)
    changed = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    if changed:
        raise InputError(f"climb repick changes the objective only ({', '.join(STEERABLE)}), but this config differs "
                         f"from the run's config.toml in {changed[:5]}; drop those settings, or run `climb search` "
                         "for a new search")


def check_finished(run_cfg: RunConfig, paths: RunPaths) -> None:
    """The run's search must have finished under its own config, and be intact."""
    from climb.stages.search import key
    m = paths.manifest("search")
    if not m.exists():
        raise InputError(f"{paths.root} has no finished search; run `climb search --run {paths.root}` first")
    manifest = read_json(m)
    if manifest.get("key", manifest.get("hash")) != key(run_cfg, paths):
        raise InputError(f"the search in {paths.root} is not up to date with its config.toml; run `climb search "
                         f"--run {paths.root}` first (it skips what is done), then re-pick")


def rescored(results: list[dict], cfg: RunConfig, where: str) -> list[dict]:
    """The successful proxies trained to the end, each with its objective recomputed from its
    recorded metrics under cfg's target. A metric no proxy recorded is refused; a proxy
    missing one (or holding no finite value for it) is left out, and said so."""
    ok = [r for r in ok_sorted(results) if "stopped" not in r]
    recorded = sorted({m for r in ok for m in r.get("metrics") or {}})
    never = [m for m in cfg.target.objective if m not in recorded]
    if never:
        raise InputError(f"target.objective names {never}, but the swarm in {where} never recorded "
                         f"{'it' if len(never) == 1 else 'them'}; it recorded {recorded}")
    out = []
    for r in ok:
        vals = r.get("metrics") or {}
        if all(isinstance(vals.get(m), (int, float)) and math.isfinite(vals[m]) for m in cfg.target.objective):
            out.append({**r, "objective": objective(vals, cfg.target)})
    if len(out) < len(ok):
        log.warning("re-pick: %d of %d proxies lack a finite value of a metric of the objective; left out",
                    len(ok) - len(out), len(ok))
    if len(out) < 2:
        raise InputError(f"only {len(out)} proxies in {where} hold every metric of {list(cfg.target.objective)}; "
                         "a pick needs at least 2")
    return out


def rescored_noise(cfg: RunConfig, paths: RunPaths, ok: list[dict]) -> float | None:
    """The run's replicate noise under cfg's objective (`replicate_noise`): its replicate proxies and
    the search's own proxies of those mixtures, rescored; None where it kept no replicates."""
    f = paths.search.replicates
    if cfg.search.final_noise != "measured" or not f.exists():
        return None
    # keyed "<mixture>/<seed>"; the record's own id names the seed too
    reps = [{**r, "mixture_id": k.split("/")[0]} for k, r in read_json(f).items() if r.get("status") == "ok"]
    own = {r["mixture_id"]: r for r in ok}
    table: dict = {}
    for r in rescored(reps, cfg, str(f)) if reps else []:
        if r["mixture_id"] in own:
            table.setdefault(r["mixture_id"], {cfg.search.seed: own[r["mixture_id"]]["objective"]})[r["seed"]] = \
                r["objective"]
    return replicate_noise(table)


def run_space(cfg: RunConfig, paths: RunPaths) -> dict:
    """The run's mixture space as its search saw it, with its bounds (search.bounds, search.kl_max:
    a re-pick holds them as the search's pick did) and its target affinity read back, not recomputed."""
    from climb.stages.search.common import run_space as search_space
    space = search_space(cfg, paths)
    if cfg.search.target_prior and paths.search.affinity.exists():
        space["target"] = np.asarray(read_json(paths.search.affinity)["share"])
    return space


def metric_view(cfg: RunConfig, space: dict, ok: list[dict], goals: dict[str, str], named: dict,
                aggregate: bool = False) -> dict:
    """One predictor per metric of `goals` (name -> goal), fitted on the proxies `ok`: each metric's
    predicted value at the `named` mixtures (name -> weights), and the mixture of the final pick's
    candidates (its pool and the measured mixtures) each metric alone prefers; `aggregate`: also
    the candidate whose aggregate of the predicted metrics (under cfg's target) is best."""
    X = np.array([r["weights"] for r in ok], float)
    models = fit_metrics(X, {m: [r["metrics"][m] for r in ok] for m in goals}, cfg.search.predictor,
                         seed=cfg.search.seed)
    C = np.vstack([final_pool(cfg, space), X])
    pred = predict_metrics(models, C)
    at = predict_metrics(models, np.array([named[n] for n in named], float)) if named else {}
    out = {"predicted": {n: {m: float(v[i]) for m, v in at.items()} for i, n in enumerate(named)},
           "best_for": {m: {"weights": b["weights"].tolist(), "predicted": b["metrics"]}
                        for m, b in best_per_metric(pred, goals, C).items()}}
    if aggregate:
        best = aggregate_pick(pred, cfg.target, C)
        out["by_metric_predictors"] = {"weights": best["weights"].tolist(), "predicted": best["metrics"]}
    return out


def repick(run_cfg: RunConfig, cfg: RunConfig, paths: RunPaths, train: bool = False) -> dict:
    """Pick the run's mixture again under cfg's objective; `train`: also train the new pick's
    comparison proxies. Writes search/repicks/<digest>.json and returns what it holds."""
    started = time.time()
    check_only_objective(run_cfg, cfg)
    check_finished(run_cfg, paths)
    ok = rescored(read_results(paths), cfg, str(paths.search.results))
    space = run_space(cfg, paths)
    try:
        pick = final_mixture(cfg, space, ok, source=str(paths.search.results), noise=rescored_noise(cfg, paths, ok))
    except RuntimeError as e:
        raise InputError(str(e)) from None
    goals = {m: metric_goal(m, cfg.target) for m in dict.fromkeys(cfg.target.objective)}
    run_pick = read_json(paths.search.mixture)["weights"]
    view = metric_view(cfg, space, ok, goals, {"re-pick": pick["weights"], "run's pick": run_pick}, aggregate=True)
    for row in (*view["predicted"].values(), *(b["predicted"] for b in view["best_for"].values()),
                view["by_metric_predictors"]["predicted"]):
        row["objective"] = float(aggregate(row, cfg.target))
    name = digest(spec(cfg))
    out = {"spec": spec(cfg), "digest": name, "rule": cfg.search.final, "proxies": len(ok),
           "weights": pick["weights"], "predicted_objective": pick["predicted"], "predictor": pick["predictor"],
           "best_seen": pick["best_seen"], "predicted": view["predicted"], "best_for": view["best_for"],
           "by_metric_predictors": view["by_metric_predictors"], "trained": 0}
    if "steadiness" in pick:  # the new pick made again on bootstrap resamples (search.steadiness_boot)
        out["steadiness"] = {k: v for k, v in pick["steadiness"].items() if k != "picks"}
    if train:
        out["comparison"] = _compare(cfg, paths, pick["weights"], name)
        out["trained"] = out["comparison"]["trained"]
    out["seconds"] = round(time.time() - started, 2)
    write_json(paths.search.repick(name), out)
    return out


def _compare(cfg: RunConfig, paths: RunPaths, weights: list, name: str) -> dict:
    """The new pick on the run's comparison seeds, paired with the run's comparison records (the
    baselines, and its own pick as "run's pick") under the new objective."""
    from climb.runtime.device import proxy_processes
    from climb.runtime.executor import make_executor
    from climb.stages.search.compare import compare, comparison_table
    out_file = paths.search.repick_comparison(name)
    before = len(read_json(out_file)) if out_file.exists() else 0
    with make_executor(cfg.executor, proxy_processes(cfg.proxy, cfg.executor)) as ex:
        ours = compare(cfg, paths, ex, {"climb": weights}, out_file=out_file)["climb"]
    trained = len(read_json(out_file)) - before
    have = read_json(paths.search.comparison) if paths.search.comparison.exists() else {}
    seeds = sorted(ours)
    runs = {"climb": {s: _scored(ours[s], cfg) for s in seeds}}
    for n, saved in (("run's pick", "climb"), *((b, b) for b in cfg.search.baselines)):
        recs = {s: have.get(f"{saved}/{s}") for s in seeds}
        if all(recs.values()):
            runs[n] = {s: _scored(r, cfg) for s, r in recs.items()}
    table, verdicts = comparison_table(cfg, runs)
    metrics = {n: {m: _mean([r.get("metrics", {}).get(m) for r in per.values()]) for m in cfg.target.objective}
               for n, per in runs.items()}
    return {"seeds": seeds, "results": table, "comparison": verdicts, "metrics": metrics, "trained": trained}


def _scored(rec: dict, cfg: RunConfig) -> dict:
    """A comparison record with its objective under cfg's target (None where it failed or lacks a metric)."""
    vals = rec.get("metrics") or {}
    ok = rec.get("status") == "ok" and all(isinstance(vals.get(m), (int, float)) for m in cfg.target.objective)
    return {**rec, "objective": objective(vals, cfg.target) if ok else None}


def _mean(vals: list) -> float | None:
    vals = [v for v in vals if isinstance(v, (int, float)) and math.isfinite(v)]
    return float(np.mean(vals)) if vals else None


def table(out: dict) -> str:
    """The re-pick as a few lines for the terminal: each metric's predicted value at the re-pick,
    the run's pick and each metric's best, the comparison where it ran, and the time taken."""
    s = out["spec"]
    terms = spec_name(s)
    metrics = list(dict.fromkeys(s["objective"]))
    rows = [("re-pick", out["predicted"]["re-pick"]), ("run's pick", out["predicted"]["run's pick"])]
    rows += [(f"best for {m}", b["predicted"]) for m, b in out["best_for"].items()]
    rows.append(("best of the metrics' predictors", out["by_metric_predictors"]["predicted"]))
    head = ["mixture (predicted)", *metrics, f"objective ({s['goal']})"]
    lines = [f"re-pick under {terms}, goal {s['goal']}, rule {out['rule']!r}, over {out['proxies']} proxies",
             "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join([n, *(f"{r[m]:.4f}" for m in metrics), f"{r['objective']:.4f}"]) + " |"
              for n, r in rows]
    comp = out.get("comparison")
    if comp:
        from climb.optimize.quality import fmt_comparison
        lines.append(f"measured on {len(comp['seeds'])} paired seeds: " + ", ".join(
            f"{n} {v:.4f}" for n, v in comp["results"].items() if v is not None))
        lines += [f"re-pick vs {n}: {fmt_comparison(n, c)}" for n, c in comp["comparison"].items()]
    heavy = np.argsort(out["weights"])[::-1][:5]
    lines.append("weights (heaviest clusters): " + ", ".join(f"{c}: {out['weights'][c]:.3f}" for c in heavy
                                                              if out["weights"][c] > 0))
    lines.append(f"{out['trained']} proxies trained; {out['seconds']:.1f} s")
    return "\n".join(lines)


def repicks(paths: RunPaths) -> list[dict]:
    """Every re-pick kept in the run folder (for the report)."""
    out = []
    for f in paths.search.repicks:
        try:
            out.append(read_json(f))
        except ValueError:
            log.warning("report: %s is not JSON; left out", f)
    return out

