"""The search against a known optimum: RegMix's released 1M swarm as a finite pool, proxies as look-ups.

Every mixture of the pool (the 512 train + 256 test runs of
`../shared/data/swarms/regmix`, 768 mixtures) has a measured result, so a search
over it can be run many times and judged exactly: the regret of its pick is the
pick's loss minus the pool's best. Each strategy below is a `climb.optimize.strategy.Strategy`
run by `climb.optimize.strategy.simulate`, i.e. the same initial sampling, predictor,
proposal, exploration and final pick that `climb search` runs with
`search.candidates` set (tests/test_search.py checks they choose the same mixtures).

Strategies, at equal budget (the total of the schedule, e.g. 32 + 16 + 8 = 56 proxies):
- random: the budget's mixtures drawn at random, the best of them;
- one-shot: the same random mixtures, plain LightGBM fitted once, the predicted best of the pool (RegMix);
- iterative-lightgbm: the schedule, plain LightGBM, best predicted + 25% far-away
  exploration, the predicted best of the pool (climb's loop with `search.predictor = "lightgbm"`
  and the settings it had before this benchmark existed);
- default: climb's defaults (`SearchConfig()`), whatever they are.

`--ablation` adds the variants the default was chosen among: the default predictor
with one or two things changed from the loop climb had before ("before": 25%
far-away exploration, the predicted best). Rule, fixed before the final run and
applied on Pile-CC only (100 repeats, the three budgets): a change is kept only if
its regret, paired by seed with "before" (the same seed draws the same first
batch), is lower with a 95% interval below zero at one budget at least, and its
mean regret is not above "before"'s by more than 0.0005 at any budget; among the
changes that pass, the lowest mean regret summed over the budgets wins. GitHub and
the mean of 13 losses are then run with that default, changing nothing.

`--splits` runs a few strategies on other schedules of the same total (a smaller
first round, finer later rounds). The schedule is the user's `search.iterations`,
never re-split behind their back; this part informs the presets' schedules.

`--noise SD` adds Gaussian noise to every look-up while regret is still judged on
the table: a check that a pick rule does not lean on noiseless measurements.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/search_oracle.py     # Pile-CC, 4 strategies, 3 budgets: ~10 min
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/search_oracle.py --targets github mean13 --jobs 2
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/search_oracle.py --ablation --splits --jobs 2  # ~50 min
    PYTHONPATH=. python benchmarks/search_oracle.py --repeats 5 --budgets 16,8,4       # a quick look
    python benchmarks/search_oracle.py --tables                                        # print what the JSON holds

Writes benchmarks/results/search_oracle.json (merged with what is there) and prints Markdown.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from common import REGMIX, RESULTS, shared_or_skip, write_result
from climb.config import SearchConfig
from climb.optimize.strategy import Strategy, from_search_config, simulate
from climb.io.swarm_csv import read_swarm, target_values

DATA = REGMIX
OUT = RESULTS / "search_oracle.json"
TARGETS = {"pile_cc": "metric/the_pile_pile_cc_val_loss", "github": "metric/the_pile_github_val_loss",
           "mean13": None}  # None: the mean of all 13 losses
BUDGETS = ((32, 16, 8), (16, 8, 4), (64, 32, 16))
GOAL = "minimize"

def given(budget):
    return tuple(budget)


def one_round(budget):
    return (sum(budget),)


def finer(budget):
    """The same first (random) round, each later round split in two: more, smaller adaptive steps."""
    return (budget[0],) + tuple(x for b in budget[1:] for x in (b - b // 2, b // 2))


def smaller_first(budget):
    """Half the first round moved to the adaptive rounds, in rounds the size of the second."""
    first, rest = budget[0] // 2, sum(budget) - budget[0] // 2
    return (first,) + (budget[1],) * (rest // budget[1]) + ((rest % budget[1],) if rest % budget[1] else ())


LGBM_ITERATIVE = Strategy(predictor="lightgbm", acquisition="explore", explore_frac=0.25, final="predicted",
                          exploit_last=False)
STRATEGIES = {  # name -> (strategy, schedule of a budget)
    "random": (Strategy(predictor="lightgbm", final="seen"), one_round),
    "one-shot": (Strategy(predictor="lightgbm", final="predicted"), one_round),
    "iterative-lightgbm": (LGBM_ITERATIVE, given),
    "default": (from_search_config(SearchConfig()), given),
}
# Each ablation variant is the default predictor with one or two things changed from the
# loop climb had before this benchmark ("before"); greedy = explore with explore_frac 0.
BEFORE = "before: explore 0.25, predicted"
_B = Strategy(predictor="default", acquisition="explore", explore_frac=0.25, final="predicted", exploit_last=False)
_MP = replace(_B, final="measured-predicted")
ABLATION = {
    BEFORE: (_B, given),
    "explore 0.25, seen": (replace(_B, final="seen"), given),
    "explore 0.25, measured-predicted": (_MP, given),
    "greedy, measured-predicted": (replace(_MP, explore_frac=0.0), given),
    "ei, measured-predicted": (replace(_MP, acquisition="ei"), given),
    "ucb, measured-predicted": (replace(_MP, acquisition="ucb"), given),
    "thompson, measured-predicted": (replace(_MP, acquisition="thompson"), given),
    "explore 0.25 + greedy last, measured-predicted": (replace(_MP, exploit_last=True), given),
    "ei + greedy last, measured-predicted": (replace(_MP, acquisition="ei", exploit_last=True), given),
    "ucb + greedy last, measured-predicted": (replace(_MP, acquisition="ucb", exploit_last=True), given),
    "thompson + greedy last, measured-predicted": (replace(_MP, acquisition="thompson", exploit_last=True), given),
    "ei + greedy last, predicted": (replace(_B, acquisition="ei", exploit_last=True), given),
    "ei + greedy last, seen": (replace(_B, acquisition="ei", exploit_last=True, final="seen"), given),
}
SPLITS = {  # the same strategies on other schedules of the same total
    "ei + greedy last, measured-predicted; finer": (replace(_MP, acquisition="ei", exploit_last=True), finer),
    "ei + greedy last, measured-predicted; smaller first": (replace(_MP, acquisition="ei", exploit_last=True),
                                                            smaller_first),
    "greedy, measured-predicted; smaller first": (replace(_MP, explore_frac=0.0), smaller_first),
    BEFORE + "; smaller first": (_B, smaller_first),
    "default; smaller first": (STRATEGIES["default"][0], smaller_first),
}
log = logging.getLogger("search_oracle")


def load_pool(target: str) -> tuple[np.ndarray, np.ndarray]:
    """The 768 1M mixtures (train then test) and their target values."""
    parts = [read_swarm(DATA / f"{s}_mixture_1m.csv", DATA / f"{s}_pile_loss_1m.csv") for s in ("train", "test")]
    X = np.vstack([p.weights for p in parts])
    col = TARGETS[target]
    y = np.concatenate([target_values(p, col) if col else p.metrics.mean(axis=1).to_numpy(float) for p in parts])
    return X, y


def _one(args) -> dict:
    X, y, schedule, strategy, seed, noise = args
    t0 = time.time()
    out = simulate(X, y, GOAL, schedule, strategy, seed=seed, noise=noise)
    return {"seed": seed, "regret": out["regret"], "rank": out["rank"], "seconds": round(time.time() - t0, 2)}


def summarise(runs: list[dict]) -> dict:
    reg, rank = np.array([r["regret"] for r in runs]), np.array([r["rank"] for r in runs])
    half = 1.96 * reg.std(ddof=1) / np.sqrt(len(reg)) if len(reg) > 1 else float("nan")
    return {"repeats": len(runs), "mean_regret": float(reg.mean()), "ci95": float(half),
            "median_rank": float(np.median(rank)), "top1": float(np.mean(rank == 1)),
            "top10": float(np.mean(rank <= 10)), "max_regret": float(reg.max()),
            "seconds_per_search": float(np.mean([r["seconds"] for r in runs]))}


def run_cell(pool, budget, strategy, schedule_of, repeats: int, noise: float, ex) -> dict:
    schedule = schedule_of(budget)
    tasks = [(*pool, schedule, strategy, seed, noise) for seed in range(repeats)]
    runs = list(ex.map(_one, tasks)) if ex else [_one(t) for t in tasks]
    # Per-seed results as columns (the paired comparisons need them), rounded: the file stays small.
    cols = {"seed": [r["seed"] for r in runs], "regret": [round(r["regret"], 6) for r in runs],
            "rank": [r["rank"] for r in runs]}
    return {**summarise(runs), "schedule": list(schedule), "strategy": asdict(strategy), "runs": cols}


def paired(c: dict, ref: dict | None):
    """Mean regret difference c - ref over the seeds both ran (same seed: same first random batch), 95% CI."""
    if ref is None or ref is c:
        return None
    a, b = (dict(zip(x["runs"]["seed"], x["runs"]["regret"])) for x in (c, ref))
    d = np.array([a[k] - b[k] for k in sorted(set(a) & set(b))])
    return (float(d.mean()), float(1.96 * d.std(ddof=1) / np.sqrt(len(d)))) if len(d) > 1 else None


def _find(cells, name, like):
    return next((r for r in cells if r["name"] == name and r["target"] == like["target"]
                 and r["budget"] == like["budget"] and r.get("noise", 0.0) == like.get("noise", 0.0)), None)


def markdown(cells: list[dict]) -> str:
    out = ["| target | budget | strategy | mean regret (95% CI) | Δ vs iterative-lightgbm | Δ vs before "
           "| median rank | top-1 | top-10 |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in cells:
        noise = f", noise sd {c['noise']}" if c.get("noise") else ""
        sched = "" if c["schedule"] == c["budget"] else f" (run as {' → '.join(map(str, c['schedule']))})"
        deltas = []
        for ref in ("iterative-lightgbm", BEFORE):
            d = paired(c, _find(cells, ref, c))
            deltas.append("" if d is None else f"{d[0]:+.4f} ± {d[1]:.4f}")
        out.append(f"| {c['target']}{noise} | {' → '.join(map(str, c['budget']))}{sched} | {c['name']} "
                   f"| {c['mean_regret']:.4f} ± {c['ci95']:.4f} | {deltas[0]} | {deltas[1]} | {c['median_rank']:g} "
                   f"| {c['top1']:.0%} | {c['top10']:.0%} |")
    return "\n".join(out)


def pivot(cells: list[dict], names, target: str = "pile_cc", noise: float = 0.0) -> str:
    """One row per strategy, one column per budget: mean regret ± CI, top-1, and the paired Δ vs "before"."""
    budgets = [list(b) for b in BUDGETS]
    out = ["| strategy | " + " | ".join(" → ".join(map(str, b)) for b in budgets) + " |",
           "| --- |" + " --- |" * len(budgets)]
    for name in names:
        row = []
        for b in budgets:
            c = next((x for x in cells if x["name"] == name and x["target"] == target and x["budget"] == b
                      and x.get("noise", 0.0) == noise), None)
            d = paired(c, _find(cells, BEFORE, c)) if c else None
            row.append("" if c is None else f"{c['mean_regret']:.4f} ± {c['ci95']:.4f}, {c['top1']:.0%}"
                       + ("" if d is None else f" (Δ {d[0]:+.4f} ± {d[1]:.4f})"))
        out.append(f"| {name} | " + " | ".join(row) + " |")
    return "\n".join(out)


def select(cells: list[dict], target: str = "pile_cc", tol: float = 0.0005) -> dict:
    """The module doc's rule over the ablation cells of `target` (noiseless, schedules as given)."""
    abl = [c for c in cells if c["target"] == target and not c.get("noise") and c["name"] in ABLATION]
    budgets = sorted({tuple(c["budget"]) for c in abl if c["name"] == BEFORE})
    verdict = {}
    for name in dict.fromkeys(c["name"] for c in abl):
        if name == BEFORE:
            continue
        rows = {b: next((c for c in abl if c["name"] == name and tuple(c["budget"]) == b), None) for b in budgets}
        if any(r is None for r in rows.values()):
            continue
        d = {b: paired(rows[b], _find(cells, BEFORE, rows[b])) for b in budgets}
        better = any(m + h < 0 for m, h in d.values())
        not_worse = all(m <= tol for m, _ in d.values())
        verdict[name] = {"passes": better and not_worse,
                         "sum_mean_regret": sum(r["mean_regret"] for r in rows.values()),
                         "paired_delta": {"→".join(map(str, b)): d[b] for b in budgets}}
    passing = [n for n, v in verdict.items() if v["passes"]]
    winner = min(passing, key=lambda n: verdict[n]["sum_mean_regret"]) if passing else BEFORE
    return {"budgets": [list(b) for b in budgets], "verdict": verdict, "winner": winner,
            "default_is_winner": ABLATION[winner][0] == STRATEGIES["default"][0]}


def goal_check(cells: list[dict]) -> list[str]:
    """The issue's goal for the default at 32 → 16 → 8, and 'no worse than iterative LightGBM' at every budget."""
    lines = []
    for c in cells:
        if c["name"] != "default":
            continue
        ref = next((r for r in cells if r["name"] == "iterative-lightgbm" and r["target"] == c["target"]
                    and r["budget"] == c["budget"] and r["noise"] == c["noise"]), None)
        tag = f"{c['target']} {'→'.join(map(str, c['budget']))}" + (f" noise {c['noise']}" if c["noise"] else "")
        if c["target"] == "pile_cc" and tuple(c["budget"]) == (32, 16, 8) and not c["noise"]:
            ok = c["top1"] >= 0.70 and c["top10"] >= 0.98 and c["mean_regret"] <= 0.010
            lines.append(f"{tag}: goal top-1 >= 70%, top-10 >= 98%, regret <= 0.010: "
                         f"{'MET' if ok else 'NOT MET'} ({c['top1']:.0%}, {c['top10']:.0%}, {c['mean_regret']:.4f})")
        if ref:
            ok = c["mean_regret"] <= ref["mean_regret"] and c["top1"] >= ref["top1"]
            lines.append(f"{tag}: default vs iterative-lightgbm: regret {c['mean_regret']:.4f} vs "
                         f"{ref['mean_regret']:.4f}, top-1 {c['top1']:.0%} vs {ref['top1']:.0%}: "
                         f"{'no worse' if ok else 'WORSE'}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", nargs="+", default=["pile_cc"], choices=list(TARGETS))
    ap.add_argument("--budgets", nargs="+", default=[",".join(map(str, b)) for b in BUDGETS])
    ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES | ABLATION | SPLITS))
    ap.add_argument("--ablation", action="store_true", help="also the variants the default was chosen among")
    ap.add_argument("--splits", action="store_true", help="also other schedules of the same budget")
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--noise", type=float, default=0.0, help="sd of Gaussian noise added to every look-up")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--tables", action="store_true", help="print the tables of what --out holds, run nothing")
    args = ap.parse_args()
    if args.tables:
        res = json.loads(args.out.read_text())
        print(markdown(res["cells"]), "", pivot(res["cells"], list(ABLATION) + list(SPLITS)), "",
              *goal_check(res["cells"]), json.dumps(res.get("select", {}).get("winner")), sep="\n")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    for noisy in ("climb", "climb.optimize.predictor", "climb.optimize.acquisition"):
        logging.getLogger(noisy).setLevel(logging.ERROR)  # per-fit lines, 100s of them
    if shared_or_skip(DATA, "search_oracle") is None:
        return 0
    res = json.loads(args.out.read_text()) if args.out.exists() else {"cells": []}
    variants = ({n: (STRATEGIES | ABLATION | SPLITS)[n] for n in args.strategies} | (ABLATION if args.ablation else {})
                | (SPLITS if args.splits else {}))
    t_all, new = time.time(), []
    with ProcessPoolExecutor(args.jobs) if args.jobs > 1 else _Nothing() as ex:
        for target in args.targets:
            pool = load_pool(target)
            for b in args.budgets:
                budget = [int(x) for x in b.split(",")]
                for name, (strategy, schedule_of) in variants.items():
                    t0 = time.time()
                    cell = {"target": target, "budget": budget, "name": name, "noise": args.noise,
                            **run_cell(pool, budget, strategy, schedule_of, args.repeats, args.noise, ex)}
                    new.append(cell)
                    log.info("%s %s %-40s regret %.4f ± %.4f, median rank %g, top-1 %.0f%%, top-10 %.0f%% (%.0f s)",
                             target, b, name, cell["mean_regret"], cell["ci95"], cell["median_rank"],
                             100 * cell["top1"], 100 * cell["top10"], time.time() - t0)
    same = {(c["target"], tuple(c["budget"]), c["name"], c["noise"]) for c in new}
    res["cells"] = [c for c in res.get("cells", []) if (c["target"], tuple(c["budget"]), c["name"],
                                                          c.get("noise", 0.0)) not in same] + new
    res["pool"] = {"files": "regmix {train,test}_mixture_1m.csv + *_pile_loss_1m.csv", "mixtures": len(pool[0])}
    res.setdefault("runs_wall_s", []).append({"args": sys.argv[1:], "seconds": round(time.time() - t_all, 1)})
    write_result(args.out, _dump(res))
    print(markdown(new))
    print("\n".join(goal_check(new)))
    if any(c["name"] in ABLATION for c in res["cells"]):
        res["select"] = sel = select(res["cells"])
        write_result(args.out, _dump(res))
        print(f"\nselection rule on pile_cc: winner {sel['winner']!r}; climb's default is "
              f"{'' if sel['default_is_winner'] else 'NOT '}that variant")
    print(f"\nwall time {time.time() - t_all:.0f} s")
    return 0


def _dump(res: dict) -> str:
    """One line per cell: readable in a diff, without a line per repeat."""
    cells = ",\n  ".join(json.dumps(c) for c in res["cells"])
    rest = json.dumps({k: v for k, v in res.items() if k != "cells"}, indent=1)
    return "{\n \"cells\": [\n  " + cells + "\n ],\n" + rest[2:]


class _Nothing:
    """Stands in for an executor when --jobs is 1 (run_cell then maps in-process)."""
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    sys.exit(main())
