"""Proxies in worker processes against the in-process default, on a finished run.

The same N proxies (the mixtures of the run's first search iteration, one seed)
are trained three ways, each in a fresh Python process so that thread settings
do not leak from one to the next:

- ``inprocess``: one after another in one process with torch's default thread
  count (one OpenMP thread per core): how climb ran proxies on a CPU before
  `executor.processes`; the baseline;
- ``serial``: one after another in one process with one torch thread: the
  reference the worker processes must reproduce bit for bit;
- ``processes``: `LocalExecutor(processes=P)` (P = the cores this process may
  use, the CPU default): P spawned workers with one torch thread each, each
  loading the token store (memory-mapped), tokenizer and target once.

Reports proxies per minute for each, the ratio processes / inprocess, and
whether the records of ``processes`` equal those of ``serial`` exactly. Beside
the ratio it reports what bounds it: P one-thread processes can at best run P
times as fast as ``serial``, so the ratio's ceiling is P x serial / inprocess,
which is low when the default's threads already scale well.

    python benchmarks/swarm_processes.py --run runs/demo            # writes benchmarks/results/swarm_processes.json
    python benchmarks/swarm_processes.py --run runs/demo --set proxy.steps=200 --out other.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from common import RESULTS, load_avg, now, run_paths, show, timer, write_result

OUT = RESULTS / "swarm_processes.json"


def _tasks(run: Path, n: int, overrides: list[str]) -> list:
    from climb.config import load_config
    from climb.stages.search import proxy_task
    cfg = load_config(run / "config.toml", overrides)
    paths = run_paths(run)
    plan = json.loads(paths.search.plan(0).read_text())
    mixtures = plan["mixtures"][:n]
    if len(mixtures) < n:
        raise SystemExit(f"{run}: plan_0.json holds {len(mixtures)} mixtures, fewer than --proxies {n}")
    return [proxy_task(cfg, paths, f"bench-{j}", 0, m["weights"], cfg.search.seed) for j, m in enumerate(mixtures)]


def _child(mode: str, run: Path, n: int, processes: int, out: Path, overrides: list[str]) -> None:
    """Train the proxies one way in this (fresh) process and write their records and the wall time."""
    import torch
    if mode == "serial":
        torch.set_num_threads(1)
    from climb.runtime.executor import LocalExecutor
    from climb.runtime.proxy_runs import train_and_score
    tasks = _tasks(run, n, overrides)
    with timer() as t:
        with LocalExecutor(processes if mode == "processes" else 1) as ex:
            recs = ex.map(train_and_score, tasks, desc=mode, parallel=True)
    keep = [{k: r[k] for k in ("mixture_id", "status", "objective", "metrics", "tokens")} for r in recs]
    out.write_text(json.dumps({"mode": mode, "wall_s": t.seconds, "torch_threads": torch.get_num_threads(),
                               "records": keep}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="a finished run folder (search done)")
    ap.add_argument("--proxies", type=int, default=8)
    ap.add_argument("--processes", type=int, default=0, help="worker processes (0: the cores available)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override the run's config for these proxies (e.g. proxy.steps=200)")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "FILE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    from climb.runtime.workers import cpu_slots
    procs = a.processes or cpu_slots()
    if a.child:
        _child(a.child[0], a.run, a.proxies, procs, Path(a.child[1]), a.set)
        return
    load_before = load_avg(None)
    res = {}
    for mode in ("inprocess", "serial", "processes"):
        f = a.out.with_suffix(f".{mode}.tmp")
        subprocess.run([sys.executable, __file__, "--run", str(a.run), "--proxies", str(a.proxies),
                        "--processes", str(procs), "--child", mode, str(f)]
                       + [f"--set={kv}" for kv in a.set], check=True)
        res[mode] = json.loads(f.read_text())
        f.unlink()
        print(f"{mode}: {res[mode]['wall_s']:.1f} s for {a.proxies} proxies", flush=True)
    rate = {m: 60 * a.proxies / r["wall_s"] for m, r in res.items()}
    same = res["processes"]["records"] == res["serial"]["records"]
    obj = {m: [r["objective"] for r in res[m]["records"]] for m in res}
    diff_inproc = max(abs(x - y) for x, y in zip(obj["processes"], obj["inprocess"]))
    out = {
        "benchmark": "swarm_processes", "date": now(), "run": str(a.run),
        "proxies": a.proxies, "overrides": a.set, "processes": procs, "cpu_count": os.cpu_count(), "machine": platform.machine(),
        "load_average_before": load_before, "load_average_after": load_avg(None),
        "proxies_per_min": {m: round(v, 3) for m, v in rate.items()},
        "wall_s": {m: round(r["wall_s"], 2) for m, r in res.items()},
        "torch_threads": {m: r["torch_threads"] for m, r in res.items()},
        "ratio_processes_vs_inprocess": round(rate["processes"] / rate["inprocess"], 3),
        # What limits the ratio: the default already spreads one proxy over the cores
        # (intra-op threads), and P one-thread processes can at best run P times one thread.
        "inprocess_threads_speedup": round(rate["inprocess"] / rate["serial"], 3),
        "ceiling_processes_vs_inprocess": round(procs * rate["serial"] / rate["inprocess"], 3),
        "share_of_ceiling": round(rate["processes"] / (procs * rate["serial"]), 3),
        "processes_equal_serial_bit_for_bit": same,
        "max_abs_objective_diff_vs_inprocess": diff_inproc,
        "objectives": obj,
    }
    write_result(a.out, out, indent=1)
    show(out, "proxies_per_min", "ratio_processes_vs_inprocess", "ceiling_processes_vs_inprocess", "share_of_ceiling",
         "processes_equal_serial_bit_for_bit", "max_abs_objective_diff_vs_inprocess", "load_average_after", indent=1)
    if not same:
        raise SystemExit("the worker processes' records differ from the serial run's")


if __name__ == "__main__":
    main()
