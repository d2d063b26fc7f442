"""Judge a finished run's comparison again with more paired seeds.

Where a verdict comes out "not resolved", the run's report gives the number of
paired seeds that would resolve a difference of that size at the measured noise.
This trains the compared mixtures (climb's pick and the baselines, as the run
saved them) with seeds up to `--seeds`, reusing the run's own comparison seeds
(the first `search.eval_seeds`), and judges each baseline again. It works on a
copy of the run folder (`--work`), so the run itself is left as it was.

    python benchmarks/more_seeds.py --run runs/e2e-bench2 --seeds 10 --out benchmarks/results/more_seeds_bench.json
"""
from __future__ import annotations

import argparse
import dataclasses
import shutil
import time
from pathlib import Path

from common import run_paths, write_result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="a finished run (search done)")
    ap.add_argument("--seeds", type=int, required=True, help="paired seeds in all (at least the run's own)")
    ap.add_argument("--work", type=Path, default=None, help="the copy to train in (default: <run>-seeds<N>)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    from climb.config import load_config
    from climb.runtime.device import proxy_processes
    from climb.runtime.executor import make_executor
    from climb.io.files import read_json
    from climb.stages.search import compare, comparison_table

    cfg = load_config(a.run / "config.toml")
    if a.seeds < cfg.search.eval_seeds:
        raise SystemExit(f"--seeds {a.seeds} is fewer than the run's own {cfg.search.eval_seeds}")
    work = a.work or a.run.with_name(f"{a.run.name}-seeds{a.seeds}")
    run, kept = run_paths(a.run), run_paths(work)
    if not work.exists():
        shutil.copytree(run.search.dir, kept.search.dir)
        shutil.copy2(run.config, kept.config)
    cfg = dataclasses.replace(cfg, search=dataclasses.replace(cfg.search, eval_seeds=a.seeds))
    mix = read_json(kept.search.mixture)
    mixtures = {"climb": mix["weights"], "uniform": mix["uniform"], "natural": mix["natural"]}
    if kept.search.one_shot_mixture.exists():
        mixtures["one-shot"] = read_json(kept.search.one_shot_mixture)["weights"]
    t0 = time.time()
    with make_executor(cfg.executor, proxy_processes(cfg.proxy, cfg.executor)) as ex:
        runs = compare(cfg, kept, ex, mixtures)
    table, verdicts = comparison_table(cfg, runs)
    own = cfg.search.eval_seed + load_config(a.run / "config.toml").search.eval_seeds
    # the run's own seeds alone, judged from the same records
    _, first = comparison_table(cfg, {n: {s: r for s, r in per.items() if s < own} for n, per in runs.items()})
    out = {"run": str(a.run), "seeds": a.seeds, "seconds": round(time.time() - t0, 1), "means": table,
           "verdicts": verdicts, "verdicts_run_seeds": first,
           "per_seed": {n: {str(s): r["objective"] for s, r in per.items()} for n, per in runs.items()}}
    write_result(a.out, out, indent=1)
    for n, c in verdicts.items():
        print(f"climb vs {n}: {c['diff']:+.4f} [{c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}] {c['verdict']} "
              f"({c['seeds']} seeds; with the run's own: {first[n]['verdict']})")


if __name__ == "__main__":
    main()
