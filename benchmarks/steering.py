"""A steered mixture, measured: the demo with its code source pinned; the bench's tasks re-picked.

The demo corpus has two sources (its `source` column): BBC news and Python code. A team that
wants "code stays at 10 %" sets `search.bounds = {"source:code" = 0.1}`. This benchmark runs the
demo's own search (pipelines/demo.toml) with and without that pin, from copies of one tokenised
base, the same search seeds for both, and reads for each run:

- the pick's code share (search/mixture.json `by_source`) and the export's realised code share
  (the export stage's `by_source`, counted from its plan: every copy of a document);
- where the rest of the pick goes: the held-out (tech) share of its non-code tokens, from the
  demo's labels (benchmarks/demo_answer.py), which the pipeline never reads;
- the search's proxy compute (tokens x parameters) and the found objective on the comparison seeds,
  paired with the unpinned run's.

    python benchmarks/steering.py pin --seeds 0 1 2 --json benchmarks/results/steering_pin.json

The bench preset (pipelines/bench.toml: PIQA, ARC-Easy and HellaSwag, the objective their gold
answers' mean loss per byte, equally weighted) is searched once; then each task alone is the
objective of a `climb repick` on the finished run: first without training anything (timed, and
its search proxies counted), then with `--compare`, which trains the task's own pick on the run's
comparison seeds, paired with the run's weighted pick and baselines on the same seeds:

    python benchmarks/steering.py tasks --json benchmarks/results/steering_tasks.json
    # where five seeds leave the weighted pick against a baseline unresolved: ten
    python benchmarks/steering.py more-seeds --json benchmarks/results/steering_tasks.json

Runs are `runs/g51pin_<free|pinned>_s<seed>` (copies of `runs/g49tech_base`, which
benchmarks/steady_pick.py builds), records `benchmarks/results/records/g51pin_*.json`; a run or a
record that exists is not made again, so a killed measurement goes on where it stopped.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from common import write_result  # noqa: E402
from steady_pick import RECORDS, _climb, common_args, names  # noqa: E402

PIN = 0.10
ARMS = {"free": ['corpus.source_column="source"'],
        "pinned": ['corpus.source_column="source"', f'search.bounds={{"source:code"={PIN}}}']}


def run_dir(arm: str, seed: int) -> Path:
    return REPO / "runs" / f"g51pin_{arm}_s{seed}"


def measure(run: Path) -> dict:
    """What one finished, exported run says about the pin."""
    import numpy as np

    from climb.io.files import read_json
    from climb.runtime.layout import RunPaths
    from demo_answer import cluster_label_shares
    from variant_pair import search_compute
    paths = RunPaths(run)
    mix = read_json(paths.search.mixture)
    w = np.asarray(mix["weights"])
    by = mix["by_source"]
    tech, code = cluster_label_shares(run, "tech"), cluster_label_shares(run, "python")
    export = paths.stats("export")["by_source"]
    comp = read_json(paths.search.comparison)
    seeds = sorted({k.split("/")[1] for k in comp if k.startswith("climb/")}, key=int)
    return {"pick_code_share": by["climb"][by["names"].index("code")],
            "export_code_share": export["realised_weights"][export["names"].index("code")],
            "export_code_asked": export.get("weights", [None] * len(export["names"]))[export["names"].index("code")],
            "pick_code_share_by_labels": float(w @ code),
            "held_out_share": float(w @ tech),
            "held_out_share_of_the_rest": float(w @ tech / (1.0 - w @ code)),
            "natural_held_out_share_of_the_rest": float(np.asarray(mix["natural"]) @ tech
                                                        / (1.0 - np.asarray(mix["natural"]) @ code)),
            "compute": search_compute(paths),
            "objective": {s: comp[f"climb/{s}"]["objective"] for s in seeds},
            "baselines": {n: {s: comp[f"{n}/{s}"]["objective"] for s in seeds}
                          for n in ("uniform", "natural") if f"{n}/{seeds[0]}" in comp},
            "weights": w.tolist()}


def pin(seeds: list[int], out: str | None) -> dict:
    import numpy as np

    from climb.optimize.quality import paired_comparison
    base = names("tech")
    if not (base / "tokenize" / "manifest.json").exists():
        _climb(["tokenize", "--run", str(base)] + common_args("tech"), base.with_suffix(".log"))
    recs: dict[str, dict[int, dict]] = {a: {} for a in ARMS}
    for seed in seeds:
        for arm, sets in ARMS.items():
            kept = RECORDS / f"g51pin_{arm}_s{seed}.json"
            if kept.exists():
                recs[arm][seed] = json.loads(kept.read_text())
                continue
            run = run_dir(arm, seed)
            if not run.exists():
                shutil.copytree(base, run, copy_function=shutil.copy2)
            sets = sets + [f"search.seed={seed}"]
            args = common_args("tech") + [a for s in sets for a in ("--set", s)]
            t = time.perf_counter()
            _climb(["search", "--run", str(run)] + args, run.with_suffix(".log"))
            _climb(["export", "--run", str(run)] + args, run.with_name(run.name + "_export.log"))
            rec = {"seed": seed, "arm": arm, "sets": sets, "wall_s": round(time.perf_counter() - t, 1),
                   **measure(run)}
            write_result(kept, rec, indent=1)
            recs[arm][seed] = rec
            print(f"{arm} s{seed}: code {rec['pick_code_share']:.4f} (export {rec['export_code_share']:.4f}), "
                  f"tech of the rest {rec['held_out_share_of_the_rest']:.3f}, "
                  f"found {np.mean(list(rec['objective'].values())):.4f}", flush=True)
    both = [s for s in seeds if s in recs["free"] and s in recs["pinned"]]
    P, F = [recs["pinned"][s] for s in both], [recs["free"][s] for s in both]
    found = {a: [float(np.mean(list(r["objective"].values()))) for r in rs] for a, rs in (("pinned", P), ("free", F))}
    # Paired by comparison seed within each search seed, then over search seeds.
    per_seed = [paired_comparison(list(p["objective"].values()), list(f["objective"].values()), "minimize")
                for p, f in zip(P, F)]
    over = paired_comparison(found["pinned"], found["free"], "minimize") if len(both) > 1 else None
    cp = sum(r["compute"]["token_params"] for r in P) / sum(r["compute"]["token_params"] for r in F)
    checks = {"pick_code_share": all(abs(r["pick_code_share"] - PIN) <= 0.005 for r in P),
              "export_code_share": all(abs(r["export_code_share"] - PIN) <= 0.005 for r in P),
              "held_out_share_of_the_rest": all(r["held_out_share_of_the_rest"] >= 0.6 for r in P),
              "same_compute": abs(cp - 1.0) < 1e-9}
    verdicts = {n: [paired_comparison(list(r["objective"].values()), list(r["baselines"][n].values()),
                                      "minimize")["verdict"] for r in P] for n in ("uniform", "natural")}
    obj = {"pin": PIN, "seeds": both, "per_seed": [
        {"seed": s, "pinned": {k: v for k, v in p.items() if k not in ("weights", "baselines")},
         "free": {k: f[k] for k in ("pick_code_share", "export_code_share", "held_out_share",
                                    "held_out_share_of_the_rest", "compute")},
         "found": {"pinned": fp, "free": ff}, "pinned_minus_free": {"diff": c["diff"], "ci95": c["ci95"],
                                                                   "verdict": c["verdict"]}}
        for s, p, f, fp, ff, c in zip(both, P, F, found["pinned"], found["free"], per_seed)],
        "pinned_minus_free_over_seeds": over and {"diff": over["diff"], "ci95": over["ci95"]},
        "compute_fraction": cp, "pinned_vs_baselines": verdicts, "checks": checks,
        "passes": all(checks.values())}
    print(json.dumps({k: v for k, v in obj.items() if k != "per_seed"}, indent=1))
    if out:
        write_result(out, obj)
    return obj


TASKS = ("piqa", "arc_easy", "hellaswag")
BENCH_SETS = ["corpus.max_shards=2", "search.eval_seeds=5", 'search.baselines=["uniform","natural"]',
              "search.seed=0"]


def _repick(run: Path, metric: str, compare: bool) -> dict:
    """`climb repick` with one task's metric as the objective: its record and wall seconds."""
    from climb.runtime.layout import RunPaths
    from climb.stages.search.repick import repicks
    paths = RunPaths(run)
    proxies = len(paths.search.results.read_text().splitlines())
    t = time.perf_counter()
    _climb(["repick", "--run", str(run), "--set", f'target.objective=["{metric}"]']
           + (["--compare"] if compare else []), run.with_name(f"{run.name}_repick_{metric.split('/')[0]}.log"))
    wall = time.perf_counter() - t
    got = [r for r in repicks(paths) if r["spec"]["objective"] == [metric]]
    return {**got[-1], "wall_s": round(wall, 2),
            "search_proxies_trained": len(paths.search.results.read_text().splitlines()) - proxies}


def tasks(out: str | None) -> dict:
    from climb.io.files import read_json
    from climb.runtime.layout import RunPaths
    run = REPO / "runs" / "g51bench"
    args = ["--config", "pipelines/bench.toml"] + [a for s in BENCH_SETS for a in ("--set", s)]
    paths = RunPaths(run)
    if not paths.manifest("search").exists():
        _climb(["search", "--run", str(run)] + args, run.with_suffix(".log"))
    quality = read_json(paths.search.quality)
    rows = {}
    for t in TASKS:
        metric = f"{t}/gold_loss_per_byte"
        dry = _repick(run, metric, compare=False)
        done = _repick(run, metric, compare=True)
        c = done["comparison"]["comparison"]["run's pick"]
        rows[t] = {"metric": metric, "repick_wall_s": dry["wall_s"], "repick_seconds": dry["seconds"],
                   "search_proxies_trained": dry["search_proxies_trained"] + done["search_proxies_trained"],
                   "comparison_proxies_trained": done["trained"],
                   "weights": done["weights"], "measured": done["comparison"]["metrics"],
                   "task_pick_minus_weighted_pick": {"diff": c["diff"], "ci95": c["ci95"], "verdict": c["verdict"]}}
        print(f"{t}: re-pick {dry['wall_s']:.1f} s ({dry['search_proxies_trained']} search proxies); on its own task "
              f"the task's pick - the weighted pick {c['diff']:+.4f} {c['ci95']} ({c['verdict']})", flush=True)
    weighted = {n: {"diff": v["diff"], "ci95": v["ci95"], "verdict": v["verdict"]}
                for n, v in quality["comparison"].items()}
    checks = {"each_task_pick_beats_the_weighted_pick_on_its_task":
              all(r["task_pick_minus_weighted_pick"]["verdict"] == "better" for r in rows.values()),
              "weighted_pick_beats_uniform_and_natural": all(v["verdict"] == "better" for v in weighted.values()),
              "repick_trains_no_search_proxy": all(r["search_proxies_trained"] == 0 for r in rows.values())}
    obj = {"run": str(run.relative_to(REPO)), "sets": BENCH_SETS, "tasks": rows, "weighted_pick_vs": weighted,
           "search_proxies": len([r for r in paths.search.results.read_text().splitlines() if r.strip()]),
           "checks": checks, "passes": all(checks.values())}
    print(json.dumps({k: v for k, v in obj.items() if k != "tasks"}, indent=1))
    if out:
        write_result(out, obj)
    return obj


def more_seeds(out: str, seeds: int = 10) -> dict:
    """The weighted pick against uniform and natural on more comparison seeds, where five left a
    verdict unresolved: the run's comparison records are copied beside it (not into its search
    folder) and the missing seeds, up to `seeds` (the bench preset's own ten), trained there."""
    from dataclasses import replace

    from climb.config import load_config
    from climb.io.files import read_json
    from climb.runtime.device import proxy_processes
    from climb.runtime.executor import make_executor
    from climb.runtime.layout import RunPaths
    from climb.stages.search.compare import compare, comparison_table
    run = REPO / "runs" / "g51bench"
    paths = RunPaths(run)
    cfg = load_config(paths.config)
    cfg = replace(cfg, search=replace(cfg.search, eval_seeds=seeds))
    kept = run / "more_seeds_comparison.json"
    if not kept.exists():
        shutil.copy2(paths.search.comparison, kept)
    mix = read_json(paths.search.mixture)
    with make_executor(cfg.executor, proxy_processes(cfg.proxy, cfg.executor)) as ex:
        runs = compare(cfg, paths, ex, {"climb": mix["weights"], "uniform": mix["uniform"],
                                        "natural": mix["natural"]}, out_file=kept)
    table, verdicts = comparison_table(cfg, runs)
    obj = json.loads(Path(out).read_text())
    obj["weighted_pick_vs_more_seeds"] = {n: {"diff": v["diff"], "ci95": v["ci95"], "verdict": v["verdict"],
                                               "seeds": seeds} for n, v in verdicts.items()}
    obj["checks"]["weighted_pick_beats_uniform_and_natural"] = all(
        v["verdict"] == "better" for v in obj["weighted_pick_vs_more_seeds"].values())
    obj["passes"] = all(obj["checks"].values())
    print(json.dumps(obj["weighted_pick_vs_more_seeds"], indent=1))
    write_result(out, obj)
    return obj


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("verb", choices=["pin", "tasks", "more-seeds"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.verb == "pin":
        pin(a.seeds, a.json)
    elif a.verb == "tasks":
        tasks(a.json)
    else:
        more_seeds(a.json or "benchmarks/results/steering_tasks.json")


if __name__ == "__main__":
    main()
