#!/usr/bin/env bash
# One call on a lent GPU machine does everything GPU-only, inside one deadline (DEADLINE_S, default 465 s,
# so the call stays under 8 minutes); each step runs only when its minimum time is left and is cut at
# what is left, so a slow step shortens or skips the later ones (said in the summary), never the call:
#   1. the CUDA tests (device arrays and their call plans, launch limits, nvcc compiles, the fused Mamba-1
#      kernels on CUDA tensors; the rest of the suite runs in CI);
#   2. bench/gpu_check.py --json (correctness of every schedule, default path against the roofline);
#   3. bench/gpu_defaults.py (this GPU's per-size-class defaults, as a device file);
#   4. bench/gpu_scoreboard.sh (ScanWeaver beside every GPU scan peer, with that device file in use);
#   5. bench/gpu_models.py (Mamba-1, Mamba-2, GLA beside mamba-ssm and flash-linear-attention);
#   6. bench/gpu_training.py (forward + backward beside the GPU peers);
#   7. the iree backend's cuda modules (bench/mlir_gpu.py --run), when .deps/iree holds them and IREE's runtime
#      imports (prepare with bench/mlir_gpu.py --prepare .deps/iree and pip install --target .deps/site
#      iree-base-runtime); skipped otherwise.
# Everything lands in $OUT (or ./gpu-session): tests.log, gpu_check.json, h200.json, gpu.json, gpu.md,
# one PNG, gpu_models.json/.md, gpu_training.json, summary.txt, session.log. Prepare .deps once beforehand
# with bench/gpu_deps.sh and carry it. STEPS="models training" (names as in the summary) runs only those,
# e.g. for a second call when the first one's deadline cut them. Exit status: 1 when a correctness check failed (a test, gpu_check,
# our scoreboard or model entries), else 0 (timeouts and skips are reported, not failures).
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR="${OUT:-$PWD/gpu-session}"
DEADLINE_S="${DEADLINE_S:-465}"
STEPS="${STEPS:-tests gpu_check defaults scoreboard models training mlir}"
mkdir -p "$OUTDIR"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
[ -d .deps/site ] && export PYTHONPATH="$PYTHONPATH:$PWD/.deps/site"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
exec > >(tee "$OUTDIR/session.log") 2>&1
start=$(date +%s)
FAILED=0
SUMMARY="$OUTDIR/summary.txt"
printf '%-12s %-8s %6s  %s\n' step status secs note > "$SUMMARY"
left() { echo $(( DEADLINE_S - ($(date +%s) - start) )); }

# step NAME MIN_S MAX_S FAIL_CODES -- command...: runs the command under timeout min(MAX_S, time left) when
# at least MIN_S are left; an exit code listed in FAIL_CODES (comma separated) is a correctness failure.
step() {
  local name=$1 min=$2 max=$3 fails=$4; shift 5
  local l t0 rc status
  case " $STEPS " in *" $name "*) ;; *)
    printf '%-12s %-8s %6s  %s\n' "$name" skipped 0 "not in STEPS" >> "$SUMMARY"; return 0 ;; esac
  l=$(left)
  if [ "$l" -lt "$min" ]; then
    printf '%-12s %-8s %6s  %s\n' "$name" skipped 0 "${l} s left, needs ${min} s" >> "$SUMMARY"
    echo "== $name: skipped (${l} s left, needs ${min} s)"
    return 0
  fi
  [ "$l" -lt "$max" ] && max=$l
  echo "== $name (up to ${max} s)"
  t0=$(date +%s)
  STEP_LIMIT=$max timeout "$max" "$@"
  rc=$?
  status=ok
  case ",$fails," in *",$rc,"*) status=FAILED; FAILED=1 ;; esac
  [ "$rc" -eq 124 ] && status=timeout
  [ "$status" = ok ] && [ "$rc" -ne 0 ] && status="exit-$rc"
  printf '%-12s %-8s %6s  %s\n' "$name" "$status" $(( $(date +%s) - t0 )) "exit $rc" >> "$SUMMARY"
  echo "$name: exit $rc ($status)"
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
python3 -c "import cupy, torch; print('cupy', cupy.__version__, 'torch', torch.__version__)" || true

step tests 40 130 1 -- bash -c "python3 -m pytest -q -x -p no:cacheprovider test/test_cuda_device_arrays.py \
  test/test_device_plan.py test/test_mamba_cuda.py test/test_launch_limits.py test/test_cuda_compile.py \
  -k 'not the_record_is_current' > '$OUTDIR/tests.log' 2>&1; rc=\$?; tail -n 1 '$OUTDIR/tests.log'; exit \$rc"

step gpu_check 60 170 1 -- bash -c 'python3 bench/gpu_check.py --json --budget $(( STEP_LIMIT - 40 )) \
  --out "$0/gpu_check.json" > /dev/null' "$OUTDIR"
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

mkdir -p "$OUTDIR/devices"
step defaults 40 100 "" -- bash -c 'python3 bench/gpu_defaults.py --budget $(( STEP_LIMIT - 25 )) --match H200 \
  --out "$0/devices/h200.json"' "$OUTDIR"
cp "$OUTDIR/devices/h200.json" "$OUTDIR/h200.json" 2>/dev/null || true

SKIP=""
[ "$(left)" -lt 330 ] && SKIP="--skip-warp-build"
step scoreboard 90 250 1 -- env SCANWEAVER_DEVICE_CONFIGS="$OUTDIR/devices" \
  bash bench/gpu_scoreboard.sh "$OUTDIR/scoreboard" $SKIP --models-budget=0
for f in gpu.json gpu.md; do cp "$OUTDIR/scoreboard/$f" "$OUTDIR/" 2>/dev/null || true; done
cp "$OUTDIR"/scoreboard/gpu_8x1536x4096.png "$OUTDIR/" 2>/dev/null || true
rm -rf "$OUTDIR/scoreboard" "$OUTDIR/devices"

step models 60 200 1 -- bash -c 'python3 bench/gpu_models.py --out "$0" --budget $(( STEP_LIMIT - 45 ))' "$OUTDIR"

step training 90 150 "" -- python3 bench/gpu_training.py --out "$OUTDIR/gpu_training.json"

step mlir 30 120 "" -- bash -c 'if [ -f .deps/iree/manifest.json ] && python3 -c "import iree.runtime as r; r.Config(\"cuda\")" 2>/dev/null; then
  python3 bench/mlir_gpu.py --run .deps/iree --json > "$0/mlir_gpu.json"; else
  echo "mlir_gpu: skipped (no .deps/iree modules, or IREE runtime finds no cuda device)"; fi' "$OUTDIR"

echo "== done in $(( $(date +%s) - start )) s; files: $(ls "$OUTDIR" | tr '\n' ' ')"
[ -f "$OUTDIR/gpu.md" ] && sed -n '1,60p' "$OUTDIR/gpu.md"
[ -f "$OUTDIR/gpu_models.md" ] && cat "$OUTDIR/gpu_models.md"
echo "== summary (correctness failures: $FAILED)"
cat "$SUMMARY"
exit "$FAILED"
