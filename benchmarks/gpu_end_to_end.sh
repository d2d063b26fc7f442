#!/usr/bin/env bash
# One whole `climb run` of the bench preset on one CUDA card, timed per stage
# (benchmarks/end_to_end.py): OUT_DIR/end_to_end_gpu_bench.json and its log.
#
#   benchmarks/gpu_end_to_end.sh OUT_DIR [WHEELS_DIR] [DATA_DIR]
#
# WHEELS_DIR: wheels for what the machine lacks (the embedding model's package,
# faiss-cpu, lightgbm, dask, distributed and their own missing dependencies),
# installed with --no-index. DATA_DIR: a folder laid out like the shared data
# (corpus/*.parquet, tasks/*.jsonl; default ../shared/data beside the repo).
# E2E_SHARDS (default 2) corpus shards; E2E_TIMEOUT (default 540) seconds;
# E2E_SET: more `--set` overrides, space-separated. CLIMB_BENCH_DEVICE=cpu runs
# it on the CPU, only to check the script.
set -euo pipefail
OUT=${1:?usage: benchmarks/gpu_end_to_end.sh OUT_DIR [WHEELS_DIR] [DATA_DIR]}
WHEELS=${2:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DATA=$(cd "${3:-$ROOT/../shared/data}" && pwd)
PY=${PYTHON:-python3}
source "$ROOT/benchmarks/gpu_env.sh"
"$PY" -c "import faiss, lightgbm, dask.distributed" \
    || { echo "faiss, lightgbm and dask must be importable: pass their wheels in WHEELS_DIR" >&2; exit 2; }
SETS=(--set "corpus.paths=[\"$DATA/corpus/*.parquet\"]" --set "corpus.max_shards=${E2E_SHARDS:-2}"
      --set "target.tasks={piqa=\"$DATA/tasks/piqa.jsonl\", arc_easy=\"$DATA/tasks/arc_easy.jsonl\", hellaswag=\"$DATA/tasks/hellaswag.jsonl\"}"
      --set "validate.tasks={lambada=\"$DATA/tasks/lambada_openai.jsonl\"}"
      --set "embed.device=\"$DEVICE\"" --set "proxy.device=\"$DEVICE\"")
for s in ${E2E_SET:-}; do SETS+=(--set "$s"); done
timeout "${E2E_TIMEOUT:-540}" "$PY" "$ROOT/benchmarks/end_to_end.py" --fresh --name gpu_bench \
    --config "$ROOT/pipelines/bench.toml" --run "$OUT/run" --out "$OUT/end_to_end_gpu_bench.json" "${SETS[@]}" \
    2>&1 | tee "$OUT/end_to_end.log"
