#!/usr/bin/env bash
# The GPU scoreboard (issue 17), for a machine with an NVIDIA GPU: ScanWeaver's default path (with and
# without the device file), its cuda schedules, the GPU roofline, and every GPU peer (PyTorch loop,
# torch.compile'd associative_scan, JAX associative_scan under jit, accelerated-scan's Triton and warp
# kernels) on (1,256,1024), (8,1536,4096), (8,1536,65536), operands made on the GPU and every entry
# checked there against a float64 oracle before it is timed. Writes gpu.json, gpu.md and PNG plots.
#
#   bash bench/gpu_scoreboard.sh [OUTDIR] [--skip-warp-build] [--quick] [--models-budget=SECONDS]
#
# Then the model scans (Mamba-1, Mamba-2, GLA beside mamba-ssm and flash-linear-attention; gpu_models.json,
# gpu_models.md) for up to --models-budget seconds (default 240; 0 skips them: bench/gpu_models.py runs them
# alone).
# About 4 minutes on an H200, plus about 70 s when accelerated-scan's warp kernel is built
# (--skip-warp-build skips that peer). The peers come from .deps/site (bench/gpu_deps.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR="${1:-${OUT:-bench-results}/scoreboard}"
shift || true
QUICK=""
MODELS="--models-budget=240"
for arg in "$@"; do
  case "$arg" in
    --skip-warp-build) export SCANWEAVER_SKIP_WARP_BUILD=1 ;;
    --quick) QUICK="--quick" ;;
    --models-budget=*) MODELS="$arg" ;;
    *) echo "gpu_scoreboard.sh: unknown flag $arg" >&2; exit 2 ;;
  esac
done
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
[ -d .deps/site ] && export PYTHONPATH="$PYTHONPATH:$PWD/.deps/site"
export XLA_PYTHON_CLIENT_PREALLOCATE=false      # JAX shares the GPU with CuPy and PyTorch
export PYTHONUNBUFFERED=1
mkdir -p "$OUTDIR"
timeout 480 python3 -m scanweaver bench --suite gpu $QUICK $MODELS --out "$OUTDIR" --no-progress
rc=$?
echo "gpu_scoreboard.sh: exit $rc; files in $OUTDIR: $(ls "$OUTDIR" | tr '\n' ' ')"
exit $rc
