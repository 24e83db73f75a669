#!/usr/bin/env bash
# One call on a GPU machine does everything GPU-only, in priority order, inside one deadline (default 510 s, so
# a 10-minute job limit holds it with its installs): the CUDA tests, every kernel family against its host
# reference, gpu_check, the scoreboard beside the GPU peers, the model scans beside mamba-ssm and
# flash-linear-attention, the tuning that writes this GPU's device file; each step's result written as it
# finishes. bench/gpu_session.py says what each step does and writes; --dry-run runs it all on the CPU with
# PoCL standing in (tiny shapes). Prepare .deps once with bench/gpu_deps.sh and carry it.
#   [PYTHON=python3] bash bench/gpu_session.sh [--dry-run] [--out DIR] [--deadline SECONDS] [--steps "families models"]
cd "$(dirname "$0")/.." || exit 2
exec "${PYTHON:-python3}" bench/gpu_session.py "$@"
