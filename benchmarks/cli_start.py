"""How long the `climb` command takes to answer without running anything: `climb --help`,
and a one-line refusal of a bad config, against the same work after importing the
pipeline first (what the command did before it parsed its arguments first).

    python benchmarks/cli_start.py [--repeats 7] [--out benchmarks/results/cli_start.json]

Each command runs `--repeats` times in a fresh interpreter; the median wall time is
kept. `python -c pass` is the floor: the interpreter's own start.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

from common import RESULTS, ROOT, load_avg, machine, offline_env, show, timer, write_result

BAD = ["run", "--set", "search.acquisition=bogus"]
PIPELINE_FIRST = "import climb.pipeline, sys; from climb.cli import main; sys.exit(main(sys.argv[1:]))"


def median_seconds(cmd: list[str], repeats: int, want_rc: int) -> float:
    times = []
    for _ in range(repeats):
        with timer() as t:
            rc = subprocess.run(cmd, cwd=ROOT, env=offline_env(), capture_output=True).returncode
        if rc != want_rc:
            raise SystemExit(f"cli_start: `{' '.join(cmd)}` exited {rc}, not {want_rc}")
        times.append(t.seconds)
    return round(statistics.median(times), 3)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=str(RESULTS / "cli_start.json"))
    a = ap.parse_args(argv)
    py = sys.executable
    res = {"name": "cli_start", "repeats": a.repeats, "load_avg_before": load_avg(),
           "python_pass": median_seconds([py, "-c", "pass"], a.repeats, 0)}
    for name, args, rc in (("help", ["--help"], 0), ("config_error", BAD, 2)):
        ours = median_seconds([py, "-m", "climb.cli", *args], a.repeats, rc)
        base = median_seconds([py, "-c", PIPELINE_FIRST, *args], a.repeats, rc)
        res[name] = {"ours_s": ours, "pipeline_first_s": base, "ratio": round(base / ours, 2), "target_s": 0.5}
    res["environment"] = machine("python", "cpus", "date")
    write_result(a.out, res)
    show(res, "python_pass", "help", "config_error")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
