#!/usr/bin/env bash
# Run HERE (a machine with PyPI), once, before a GPU session: unpacks the GPU peers that the GPU
# machine lacks into .deps/site (ignored by git), which the GPU scripts put on PYTHONPATH.
# accelerated-scan 0.3.1 is pure Python (Triton kernels; CUDA C++ that PyTorch builds at import).
# The device call must then name .deps in `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/wheels .deps/site
python3 -m pip download -q --no-deps --only-binary=:all: -d .deps/wheels "accelerated-scan==0.3.1"
for w in .deps/wheels/*.whl; do python3 -m zipfile -e "$w" .deps/site; done
ls .deps/site
