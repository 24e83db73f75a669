#!/usr/bin/env bash
# One call on a lent GPU machine does everything GPU-only (under ~8 minutes on an H200):
#   1. the CUDA tests (device arrays, launch limits, nvcc compiles; the rest of the suite runs in CI);
#   2. bench/gpu_check.py --json (correctness of every schedule, default path against the roofline);
#   3. bench/gpu_defaults.py (this GPU's per-size-class defaults, as a device file);
#   4. bench/gpu_scoreboard.sh (ScanWeaver beside every GPU peer, with that device file in use);
#   5. bench/gpu_training.py when at least 2 minutes are left (forward + backward beside the GPU peers);
#   6. the iree backend's cuda modules (bench/mlir_gpu.py --run), when .deps/iree holds them and IREE's runtime
#      imports (prepare with bench/mlir_gpu.py --prepare .deps/iree and pip install --target .deps/site
#      iree-base-runtime); skipped otherwise.
# Everything lands in $OUT (or ./gpu-session): tests.log, gpu_check.json, h200.json, gpu.json, gpu.md,
# one PNG, gpu_training.json, session.log. Prepare .deps once beforehand with bench/gpu_deps.sh and carry it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR="${OUT:-$PWD/gpu-session}"
mkdir -p "$OUTDIR"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
[ -d .deps/site ] && export PYTHONPATH="$PYTHONPATH:$PWD/.deps/site"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
exec > >(tee "$OUTDIR/session.log") 2>&1
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
python3 -c "import cupy, torch; print('cupy', cupy.__version__, 'torch', torch.__version__)" || true

echo "== 1. CUDA tests"
timeout 120 python3 -m pytest -q -x -p no:cacheprovider test/test_cuda_device_arrays.py test/test_launch_limits.py \
  test/test_cuda_compile.py -k "not the_record_is_current" > "$OUTDIR/tests.log" 2>&1
echo "tests: exit $? ($(tail -n 1 "$OUTDIR/tests.log"))"

echo "== 2. gpu_check"
timeout 180 python3 bench/gpu_check.py --json --budget 130 --out "$OUTDIR/gpu_check.json" > /dev/null
echo "gpu_check: exit $?"
python3 - "$OUTDIR/gpu_check.json" <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1]))
print("status", r["status"], "| checks", sum(c["ok"] for c in r["checks"]), "/", len(r["checks"]))
for c in r["cases"]:
    d, b = c.get("default", {}), c.get("best", {})
    print(f'{c["case"]:14s} roofline {c.get("roofline_ms", 0):.4f} ms | default {d.get("schedule")} '
          f'{d.get("kernel_ms", float("nan")):.4f} ms = {d.get("fraction_of_roofline", float("nan")):.2f}, '
          f'wall {d.get("wall_ms", float("nan")):.4f} | best {b.get("schedule")} {b.get("config")} '
          f'{b.get("fraction_of_roofline", float("nan")):.2f} | target {c.get("target")}')
PY

echo "== 3. device defaults"
mkdir -p "$OUTDIR/devices"
timeout 120 python3 bench/gpu_defaults.py --budget 80 --match H200 --out "$OUTDIR/devices/h200.json"
echo "gpu_defaults: exit $?"
cp "$OUTDIR/devices/h200.json" "$OUTDIR/h200.json" 2>/dev/null || true

echo "== 4. scoreboard"
left=$(( 470 - ($(date +%s) - start) ))
SKIP=""
[ "$left" -lt 260 ] && SKIP="--skip-warp-build"
SCANWEAVER_DEVICE_CONFIGS="$OUTDIR/devices" timeout $(( left > 60 ? left : 60 )) \
  bash bench/gpu_scoreboard.sh "$OUTDIR/scoreboard" $SKIP
for f in gpu.json gpu.md; do cp "$OUTDIR/scoreboard/$f" "$OUTDIR/" 2>/dev/null || true; done
cp "$OUTDIR"/scoreboard/gpu_8x1536x4096.png "$OUTDIR/" 2>/dev/null || true
rm -rf "$OUTDIR/scoreboard" "$OUTDIR/devices"

echo "== 5. training (forward + backward against the GPU peers), if time is left"
left=$(( 560 - ($(date +%s) - start) ))
if [ "$left" -ge 120 ]; then
  timeout "$left" python3 bench/gpu_training.py --out "$OUTDIR/gpu_training.json"
  echo "gpu_training: exit $?"
else
  echo "gpu_training: skipped, ${left} s left (run it alone: python3 bench/gpu_training.py --out FILE)"
fi
echo "== 6. MLIR: the iree backend's cuda modules, if prepared"
if [ -f .deps/iree/manifest.json ] && python3 -c "import iree.runtime as r; r.Config('cuda')" 2>/dev/null; then
  timeout 120 python3 bench/mlir_gpu.py --run .deps/iree --json > "$OUTDIR/mlir_gpu.json"
  echo "mlir_gpu: exit $?"; head -c 2000 "$OUTDIR/mlir_gpu.json"
else
  echo "mlir_gpu: skipped (no .deps/iree modules, or IREE's runtime finds no cuda device)"
fi
echo "== done in $(( $(date +%s) - start )) s; files: $(ls "$OUTDIR" | tr '\n' ' ')"
[ -f "$OUTDIR/gpu.md" ] && sed -n '1,60p' "$OUTDIR/gpu.md"
