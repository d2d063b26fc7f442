# Sourced by benchmarks/gpu.sh and benchmarks/gpu_end_to_end.sh with OUT, WHEELS, ROOT and PY set:
# installs the given wheels (nothing is fetched) into a private folder, sets the offline
# environment, and checks that torch sees the device (CLIMB_BENCH_DEVICE, default cuda;
# "cpu" only to check the scripts themselves).
mkdir -p "$OUT"
if [ -n "$WHEELS" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    SITE=$(mktemp -d)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 HF_HOME="$OUT/.hf" PYTHONUNBUFFERED=1
DEVICE=${CLIMB_BENCH_DEVICE:-cuda}
if [ "$DEVICE" != cpu ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.csv" 2>&1 || true
    "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
fi
