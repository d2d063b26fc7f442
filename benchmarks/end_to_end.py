"""A whole run, timed per stage, with the peak memory of the process that ran it.

    HF_HUB_OFFLINE=1 python benchmarks/end_to_end.py --name demo --config pipelines/demo.toml --run runs/e2e-demo
    HF_HUB_OFFLINE=1 python benchmarks/end_to_end.py --name bench_2_shards --config pipelines/bench.toml \\
        --run runs/e2e-bench2 --set corpus.max_shards=2 --set 'corpus.id_column=""'

Runs `climb run` in a child process (`--fresh` deletes the run folder first, for a cold run) and
writes benchmarks/results/end_to_end_<name>.json: wall seconds, the child's
peak RSS, and each stage's seconds and headline figures from its manifest.
The shared corpus's shards 3 and 7 each hold one id twice (the same speech in
two collections), so runs over more than 3 shards set `corpus.id_column=""`
(ids become shard:row).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from common import RESULTS, ROOT, load_avg, peak_rss_mb, run_climb, run_paths, show, timer, today, write_result

STAGES = ("embed", "cluster", "tokenize", "search", "validate", "export", "report")
KEEP = {"embed": ("docs", "docs_per_s", "device"), "cluster": ("docs", "k", "clusters", "pruned"),
        "tokenize": ("tokens", "vocab_size"),
        "search": ("proxies", "failed", "clusters", "comparison"),
        "validate": ("models", "trained", "failed", "verdicts", "rank_spearman"), "export": ("docs", "tokens", "files"),
        "report": ("figures",)}


def collect(run: Path) -> dict:
    out = {}
    for stage in STAGES:
        m = run_paths(run).manifest(stage)
        if m.exists():
            stats = json.loads(m.read_text()).get("stats", {})
            out[stage] = {"seconds": stats.get("seconds"), **{k: stats[k] for k in KEEP[stage] if k in stats}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--fresh", action="store_true", help="delete the run folder first (a cold run)")
    ap.add_argument("--out", type=Path, default=None,
                    help="result file (default: benchmarks/results/end_to_end_<name>.json)")
    args = ap.parse_args()
    run = Path(args.run) if Path(args.run).is_absolute() else ROOT / args.run
    if args.fresh and run.exists():
        shutil.rmtree(run)
    with timer() as t:  # climb run in a child process, run folder relative to ROOT
        proc = run_climb(["run", "--config", args.config, "--run", args.run], args.set, check=False)
    peak_mb = peak_rss_mb(children=True)
    if proc.returncode != 0:
        sys.exit(f"climb run exited {proc.returncode}")
    result = {"name": f"end_to_end_{args.name}", "command": " ".join(proc.args[2:]),
              "wall_seconds": round(t.seconds, 1), "peak_rss_mb": round(peak_mb), "stages": collect(run),
              "cpus": os.cpu_count(), "load_avg_after": load_avg(), "date": today()}
    write_result(args.out or RESULTS / f"end_to_end_{args.name}.json", result)
    show(result, indent=2)


if __name__ == "__main__":
    main()
