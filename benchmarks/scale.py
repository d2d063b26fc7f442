"""The whole pipeline at 100k, 1M and 10M documents: per stage seconds, documents/s,
peak memory and disk written, and how each grows with N.

    make bench-scale                       # builds the corpus if needed, then all sizes
    python benchmarks/scale.py [--sizes 100000 1000000 10000000] [--config pipelines/scale.toml]

The corpus is benchmarks/scale_corpus.py's (runs/scale-corpus, 50,000 documents a
shard; the first N/50,000 shards are the N-document corpus). Each size runs in its
own run folder (runs/scale-<N>), fresh, one `climb <stage>` process per stage, so a
stage's peak RSS is its own process tree's (`os.wait4`: the largest process of it,
proxy workers included). Seconds are the stage's own (its manifest), wall seconds
include the process start. Disk is what the stage's folder holds when it is done.

Then, per stage, least-squares fits of seconds and of peak RSS against N, and the
ratios of the largest size to a tenth of it (to the smallest where that was not run): with 10x the documents, a linear stage
takes 8-12x the time; the search, whose cost is its proxies', should not change.
Results: benchmarks/results/scale.json (per N: `docs`, and per stage `seconds`,
`docs_per_s`, `peak_rss_mb`, `disk_mb`; then `fits`, `ratios` and `static_speedup`,
the static embedding's speed-up over the torch default from embed_static.json) and a
plot beside it, scale.png (`--plot-only` redraws it).

`--redo STAGE ...` measures those stages again in the kept run folders after a change
to them (the other stages' figures are taken from --out, the row names what was
redone): each stage's folder is moved aside, the stage runs, and its outputs are
compared with the earlier ones as scale_kill.py compares them (`same_outputs`: byte for
byte, or apart from what times a run).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from common import RESULTS, ROOT, load_avg, machine, offline_env, run_paths, show, timer, write_result

STAGES = ("embed", "cluster", "tokenize", "search", "export", "report")
ROWS_PER_SHARD = 50_000


def du_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20 if path.exists() else 0.0


def corpus_sets(corpus: Path, n: int, more: list[str] = ()) -> list[str]:
    """The overrides of an N-document run: the first N/50,000 shards of `corpus`, then `more`."""
    return [f'corpus.paths=["{corpus}/part-*.parquet"]', f"corpus.max_shards={n // ROWS_PER_SHARD}", *more]


def stage_command(stage: str, config: str, run: Path, sets: list[str]) -> list[str]:
    """`python -m climb.cli STAGE --config ... --run ... --set ...`, to run at ROOT."""
    cmd = [sys.executable, "-m", "climb.cli", stage, "--config", config, "--run", str(run)]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def run_stage(stage: str, config: str, run: Path, sets: list[str], log) -> dict:
    cmd = stage_command(stage, config, run, sets)
    with timer() as t:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=offline_env(), stdout=log, stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"scale: `{' '.join(cmd[2:])}` failed; see {log.name}")
    manifest = json.loads(run_paths(run).manifest(stage).read_text())
    stats = manifest.get("stats", {})
    return {"seconds": stats.get("seconds"), "wall_seconds": round(t.seconds, 1),
            "peak_rss_mb": round(ru.ru_maxrss / 1024), "disk_mb": round(du_mb(run / stage), 1)}


def fit(n: list[int], y: list[float]) -> dict:
    """y ~ a + b * N (least squares) and the share of y's variance it leaves."""
    n_, y_ = np.asarray(n, float), np.asarray(y, float)
    b, a = np.polyfit(n_, y_, 1)
    resid = y_ - (a + b * n_)
    r2 = 1 - (resid @ resid) / max(((y_ - y_.mean()) ** 2).sum(), 1e-12)
    return {"intercept": round(float(a), 3), "per_million": round(float(b) * 1e6, 3), "r2": round(float(r2), 4)}


def plot(res: dict, path: Path) -> None:
    """Seconds and peak RSS per stage against N, one panel each."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ns = sorted(int(n) for n in res["sizes"])
    rows = [res["sizes"][str(n)] for n in ns]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for s in STAGES:
        a.plot(ns, [r[s]["seconds"] for r in rows], marker="o", label=s)
        b.plot(ns, [r[s]["peak_rss_mb"] for r in rows], marker="o", label=s)
    a.set(xscale="log", yscale="log", xlabel="documents", ylabel="seconds", title="time per stage")
    b.set(xscale="log", xlabel="documents", ylabel="peak RSS (MB)", title="peak memory per stage")
    b.set_ylim(0, max(r["peak_rss_mb"] for r in rows) * 1.2)
    a.legend(fontsize=8)
    fig.suptitle(f"climb on {res['config']}, 2 CPU cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    ap.add_argument("--config", default="pipelines/scale.toml")
    ap.add_argument("--corpus", type=Path, default=ROOT / "runs" / "scale-corpus")
    ap.add_argument("--set", action="append", default=[], help="more config overrides for every size")
    ap.add_argument("--keep", action="store_true", help="keep finished stages of an earlier run (default: fresh)")
    ap.add_argument("--out", type=Path, default=RESULTS / "scale.json")
    ap.add_argument("--redo", nargs="+", choices=STAGES, default=[],
                    help="measure these stages again in the kept run folders; the others' figures come from --out")
    ap.add_argument("--plot-only", action="store_true", help="redraw the plot from --out and stop")
    a = ap.parse_args(argv)
    if a.plot_only:
        plot(json.loads(a.out.read_text()), a.out.with_suffix(".png"))
        return 0
    need = max(a.sizes)
    have = len(list(a.corpus.glob("part-*.parquet"))) * ROWS_PER_SHARD
    if have < need:
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scale_corpus.py"), "--out", str(a.corpus),
                        "--docs", str(need)], check=True, cwd=ROOT)
        if not list(a.corpus.glob("part-*.parquet")):
            return 0  # no shared corpus: scale_corpus said so
    res = {"name": "scale", "config": a.config, "sets": a.set, "sizes": {},
           "environment": machine("python", "torch", "cpus", "date")}
    earlier = None
    if a.redo:
        if not a.out.exists():
            raise SystemExit(f"scale: --redo measures stages again beside {a.out}'s figures; run without it first")
        earlier = json.loads(a.out.read_text())
        res["sets"] = earlier.get("sets", a.set)
        res["sizes"] = dict(earlier["sizes"])  # a size not redone keeps its row
        a.keep = True
    for n in sorted(a.sizes):
        if n % ROWS_PER_SHARD:
            raise SystemExit(f"scale: sizes are multiples of {ROWS_PER_SHARD:,}; got {n:,}")
        run = ROOT / "runs" / f"scale-{n}"
        if run.exists() and not a.keep:
            shutil.rmtree(run)
        sets = corpus_sets(a.corpus, n, res["sets"])  # --redo: the earlier run's
        row = {"docs": n, "load_avg_before": load_avg()}
        if earlier is not None:
            row = {**earlier["sizes"][str(n)], "redone": {"stages": a.redo, "load_avg_before": row["load_avg_before"],
                                                          "date": res["environment"]["date"]}}
        run.mkdir(parents=True, exist_ok=True)
        with open(run.parent / f"scale-{n}.log", "a" if a.redo else "w") as log:
            for stage in STAGES:
                if a.redo and stage not in a.redo:
                    continue
                before = run / f"{stage}.before"
                if a.redo:
                    shutil.rmtree(before, ignore_errors=True)
                    (run / stage).rename(before)
                r = run_stage(stage, a.config, run, sets, log)
                if a.redo:
                    from scale_kill import compare_folders
                    cmp = compare_folders(before, run / stage)
                    r["same_outputs"] = cmp["identical"]
                    if cmp["identical"]:
                        shutil.rmtree(before)
                    else:
                        r["differing_files"] = cmp["differing"][:20]
                r["docs_per_s"] = round(n / r["seconds"], 1) if r["seconds"] else None
                row[stage] = r
                print(f"scale: {n:,} documents, {stage}: {json.dumps(r)}", flush=True)
        row["peak_rss_mb"] = max(row[s]["peak_rss_mb"] for s in STAGES)
        res["sizes"][str(n)] = row
        write_result(a.out, res)  # after every size: a long run keeps what it measured
    ns = sorted(a.sizes)
    rows = [res["sizes"][str(n)] for n in ns]
    if len(ns) >= 2:
        res["fits"] = {s: {"seconds": fit(ns, [r[s]["seconds"] for r in rows]),
                           "peak_rss_mb": fit(ns, [r[s]["peak_rss_mb"] for r in rows])} for s in STAGES}
        # The targets speak of 10x the documents: the largest size against a tenth of it where run.
        lo, hi = res["sizes"].get(str(ns[-1] // 10), rows[0]), rows[-1]
        res["ratios"] = {"docs": hi["docs"] / lo["docs"],
                         "seconds": {s: round(hi[s]["seconds"] / lo[s]["seconds"], 2) for s in STAGES},
                         "peak_rss": {s: round(hi[s]["peak_rss_mb"] / lo[s]["peak_rss_mb"], 2) for s in STAGES},
                         "peak_rss_all": round(hi["peak_rss_mb"] / lo["peak_rss_mb"], 2)}
    static = RESULTS / "embed_static.json"
    if static.exists():
        res["static_speedup"] = json.loads(static.read_text()).get("static_speedup")
    write_result(a.out, res)
    plot(res, a.out.with_suffix(".png"))
    show(res.get("ratios", res["sizes"]), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
