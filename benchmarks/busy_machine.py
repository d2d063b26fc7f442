"""The demo's search on an idle machine and beside one busy-looping process.

A run folder (e.g. after `make demo`) has its embed, cluster and tokenize
stages brought up to date, untimed, and is then searched twice from an empty search folder with the same config: once as
it is, once while another process spins on one core (a plain Python busy loop,
started before and stopped after). Reports both wall times and
ratio = idle / busy (1 means the other process cost nothing; the target is
>= 0.4, i.e. the busy search takes at most 2.5x the idle one), and checks that
both searches found the same mixture with the same results.

    python benchmarks/busy_machine.py --run runs/demo        # writes benchmarks/results/busy_machine.json
    python benchmarks/busy_machine.py --run runs/demo --set 'search.iterations=[4,4]' --set search.eval_seeds=2
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import RESULTS, load_avg, now, run_climb, run_paths, show, timer, write_result

OUT = RESULTS / "busy_machine.json"
BUSY = "while True:\n    pass\n"


def _climb(stage: str, run: Path, config: str, sets: list[str]) -> None:
    run_climb([stage, "--config", config, "--run", run], sets)


def _search(run: Path, config: str, sets: list[str]) -> tuple[float, dict]:
    paths = run_paths(run)
    for outputs in (paths.search, paths.validate, paths.export, paths.report):  # the search and what follows it
        shutil.rmtree(outputs.dir, ignore_errors=True)
    with timer() as t:
        _climb("search", run, config, sets)
    comparison = json.loads(paths.search.comparison.read_text())
    return t.seconds, {k: v["objective"] for k, v in sorted(comparison.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="a run folder with embed and cluster done")
    ap.add_argument("--config", default="pipelines/demo.toml")
    ap.add_argument("--set", action="append", default=[], dest="sets", help="config overrides for both searches")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    if not run_paths(a.run).manifest("cluster").exists():
        raise SystemExit(f"{a.run}: no finished cluster stage; run `climb run` (or make demo) first")
    # The stages before the search brought up to date first, untimed (a copied run folder's
    # corpus has moved, so it is embedded again): each timed run is the search alone.
    _climb("tokenize", a.run, a.config, a.sets)
    load_before = load_avg(None)
    idle, idle_res = _search(a.run, a.config, a.sets)
    print(f"idle: {idle:.1f} s", flush=True)
    busy_proc = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        time.sleep(2)
        busy, busy_res = _search(a.run, a.config, a.sets)
    finally:
        busy_proc.kill()
        busy_proc.wait()
    print(f"busy: {busy:.1f} s", flush=True)
    out = {"benchmark": "busy_machine", "date": now(), "run": str(a.run),
           "config": a.config, "sets": a.sets, "cpu_count": os.cpu_count(), "load_average_before": load_before,
           "idle_s": round(idle, 1), "busy_s": round(busy, 1), "ratio_idle_over_busy": round(idle / busy, 3),
           "target": ">= 0.4", "same_results": idle_res == busy_res, "comparison_idle": idle_res}
    write_result(a.out, out, indent=1)
    show(out, "idle_s", "busy_s", "ratio_idle_over_busy", "same_results")


if __name__ == "__main__":
    main()
