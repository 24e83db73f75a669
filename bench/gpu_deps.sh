#!/usr/bin/env bash
# Run HERE (a machine with PyPI), once, before a GPU session: unpacks the GPU peers that the GPU
# machine lacks into .deps/site (ignored by git, never committed), which the GPU scripts put on PYTHONPATH.
#   accelerated-scan 0.3.1: pure Python (Triton kernels; CUDA C++ that PyTorch builds at import);
#   fla-core + flash-linear-attention 0.6.0: pure Python over Triton (chunk_gla);
#   packaging: imported by fla and by mamba-ssm's Triton path;
#   mamba-ssm 2.3.2.post1: only an sdist is published; its Python and Triton files are taken from it
#     (selective_scan_ref, mamba_chunk_scan_combined); its CUDA extension is not built.
# The device call must then name .deps in `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
MAMBA=2.3.2.post1
mkdir -p .deps/wheels .deps/sdist .deps/site
python3 -m pip download -q --no-deps --only-binary=:all: -d .deps/wheels \
  "accelerated-scan==0.3.1" "fla-core==0.6.0" "flash-linear-attention==0.6.0" "packaging==24.2"
for w in .deps/wheels/*.whl; do python3 -m zipfile -e "$w" .deps/site; done
# scanweaver's own pure-Python requirements that a GPU machine may lack (platformdirs: the cache and tuned-store
# locations), in .deps/needed: the session puts it on the path only where its Python cannot import them
rm -rf .deps/needed .deps/wheels_needed && mkdir -p .deps/needed .deps/wheels_needed
python3 -m pip download -q --no-deps --only-binary=:all: -d .deps/wheels_needed "platformdirs>=3"
for w in .deps/wheels_needed/*.whl; do python3 -m zipfile -e "$w" .deps/needed; done
# the sdist (its setup.py runs for metadata only: no CUDA build, no build isolation)
MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE python3 -m pip download -q --no-deps --no-binary=:all: \
  --no-build-isolation -d .deps/sdist "mamba-ssm==$MAMBA"
python3 - "$MAMBA" <<'PY'
import sys, tarfile
from pathlib import Path

name = f"mamba_ssm-{sys.argv[1]}"
archive = next(Path(".deps/sdist").glob(f"{name}.tar.gz"))
site = Path(".deps/site")
with tarfile.open(archive) as tar:
    for m in tar.getmembers():
        parts = Path(m.name).parts
        if m.isfile() and len(parts) > 2 and parts[1] == "mamba_ssm" and m.name.endswith(".py"):
            out = site.joinpath(*parts[1:])
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(tar.extractfile(m).read())
print("mamba_ssm:", sum(1 for _ in (site / "mamba_ssm").rglob("*.py")), "Python files")
PY
ls .deps/site
