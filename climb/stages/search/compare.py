"""The search's own noise and its comparison: replicate seeds of iteration 1's first mixtures,
RegMix's one-shot baseline, and the found mixture trained beside uniform and natural (and
one-shot) with the same fresh seeds, paired, with a verdict per baseline.
"""
from __future__ import annotations

import logging

import numpy as np

from climb.config import RunConfig
from climb.io.files import read_json, write_json
from climb.optimize.quality import fmt_comparison, paired_comparison
from climb.runtime import results as results_log
from climb.runtime.layout import RunPaths
from climb.stages.search.common import (candidate_pool, final_mixture, fixed_candidates, ok_sorted, proxy_task,
                                        run_proxies)

log = logging.getLogger(__name__)


def replicates(cfg: RunConfig, paths: RunPaths, ex, results: list[dict], base: str = "", iteration: int = 0) -> dict:
    """Retrain the first `search.replicates` mixtures of the first iteration (`iteration`: where a
    search that starts later begins) with `replicate_seeds` more seeds (continuing the search's
    shared base, when it has one: the noise its ranking sees); returns {mixture_id: {seed:
    objective}} including the search's own seed."""
    search_cfg = cfg.search
    out_file = paths.search.replicates
    have = read_json(out_file) if out_file.exists() else {}
    first = sorted((r for r in results if r["iteration"] == iteration and "stopped" not in r),
                   key=lambda r: r["mixture_id"])[: search_cfg.replicates]
    seeds = [search_cfg.seed + 1 + s for s in range(search_cfg.replicate_seeds)]
    todo = [(r, s) for r in first for s in seeds
            if results_log.retry(have.get(f"{r['mixture_id']}/{s}"), search_cfg.retry_failed)]
    tasks = [proxy_task(cfg, paths, f"{r['mixture_id']}-seed{s}", 0, r["weights"], s, base=base) for r, s in todo]

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


def one_shot(cfg: RunConfig, paths: RunPaths, ex, space: dict, results: list[dict], base: str = "") -> list[float]:
    """RegMix's way at the search's budget: sum(iterations) mixtures from the initial distribution
    (the first ones are iteration 1's, already trained), the predictor fitted once, and the best
    predicted mixture of a fresh pool taken, whatever `search.final` says for climb's own pick.
    Its proxies continue the search's shared base where it has one, as the search's own do.
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
    tasks = [proxy_task(cfg, paths, f"oneshot-{j:03d}", -2, pool[j], search_cfg.seed, base=base) for j in todo]

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
                "proxies": len(recs), "succeeded": len(ok_sorted(recs))})
    return pick["weights"]


def compare(cfg: RunConfig, paths: RunPaths, ex, mixtures: dict, out_file=None) -> dict:
    """Train every compared mixture with the same fresh seeds (paired; seeds the search never
    used). Returns {name: {seed: record}}; every run is kept in comparison.json (or `out_file`:
    a re-pick's own, climb/stages/search/repick.py)."""
    out_file = out_file or paths.search.comparison
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
