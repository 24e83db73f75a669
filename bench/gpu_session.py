"""One call on a GPU machine: everything GPU-only, in priority order, inside one deadline (``bench/gpu_session.sh``).

Steps, each a subprocess with its own time budget (:data:`STEPS`), in priority
order: a step gets its own budget first, and what earlier steps left unused
when the later ones' budgets still fit; a deadline under the sum of the
budgets cuts the last steps, never the first.  The whole session ends within
``--deadline`` (default 510 s: a 10-minute job limit with its installs, and a
margin):

1. ``setup``: the device's name from the driver (``nvidia-smi``), the libraries' versions, wheels carried
   in ``.whl/`` installed into a scratch directory, ``.deps/site`` (``bench/gpu_deps.sh``) put on the path, and
   ``.deps/needed`` (scanweaver's own requirements) where this Python lacks them;
2. ``tests``: the CUDA tests (device arrays and call plans, Mamba-1 and the matrix-state operations on CUDA
   tensors with host copies refused, launch limits);
3. ``kernels``: the GPU kernels' tests (the matrix state's and the delta rule's forward and backward, recurrent
   and chunked: every decay kind, lengths around the chunk, packed sequences, groups) on ``cuda`` instead of
   PoCL (``SCANWEAVER_TEST_GPU_BACKEND=cuda``);
4. ``families``: every CUDA kernel family against its float64 host reference, forward and backward
   (``bench/gpu_families.py``: the vector scan, Mamba-1, the matrix states, the delta family where present);
5. ``chunked``: the chunked form beside the recurrence (GLA, simple GLA, Mamba-2, Gated DeltaNet), checked, then
   timed forward and forward + backward (``bench/gpu_chunked.py``);
6. ``gpu_check``: every vector-scan schedule against the host oracle, then the default path against the
   roofline (``bench/gpu_check.py``);
7. ``scoreboard``: the vector scan beside the GPU peers (accelerated-scan, ``torch.compile``'d
   associative_scan, JAX; ``scanweaver bench --suite gpu``);
8. ``models``: Mamba-1, Mamba-2, GLA and the gated delta rule beside mamba-ssm's and
   flash-linear-attention's Triton kernels (``bench/gpu_models.py``);
9. ``defaults``: the tuning that writes this GPU's shipped defaults (``bench/gpu_defaults.py``:
   ``<device>.json`` for ``python/scanweaver/tuning/devices/``);
10. ``training`` (only with time left): the vector scan's forward + backward beside the peers.

Each step's result is written when it finishes: ``summary.json`` (every step's status, seconds, exit code
and files) after every step, and each step's own files as it goes, so a cut call still reports what
finished.  Everything lands in ``$OUT`` (or ``--out``), at most eight files (what a GPU call brings back):
``session.log``, ``summary.json``, ``families.json``, ``gpu_chunked.json``, ``gpu_check.json``, ``gpu.json``,
``gpu_models.json``, ``<device>.json``, ``gpu_training.json``; a step whose file would be a ninth is skipped,
saying so.  Exit status 1 when a correctness check failed (a test, a family,
gpu_check, our scoreboard or model entries), else 0: time limits and skips are reported, not failures.

``--dry-run`` (or ``SCANWEAVER_GPU_DRY_RUN=1``) runs the same steps on the CPU with PoCL standing in for
the GPU, on tiny shapes (``test/test_gpu_session.py`` runs it): the flow, the budgets and the files.

Usage::

    bash bench/gpu_session.sh [--dry-run] [--out DIR] [--deadline SECONDS] [--steps "families models"]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
#: The CUDA test files the ``tests`` step runs (the rest of the suite runs in CI).
CUDA_TESTS = ("test/test_cuda_device_arrays.py", "test/test_device_plan.py", "test/test_mamba_cuda.py",
              "test/test_matrix_device.py", "test/test_launch_limits.py")
#: Prints the versions of the libraries the session uses (those installed).
VERSIONS = """import importlib.metadata as m
for n in ("cupy-cuda13x", "cupy-cuda12x", "torch", "jax", "triton", "numpy", "fla-core", "mamba-ssm",
          "accelerated-scan"):
    try:
        print(n, m.version(n))
    except m.PackageNotFoundError:
        pass
"""
#: What the dry run's ``tests`` step runs: a CUDA file (it skips without a GPU; the stand-in device tests run
#: in the suite itself).
DRY_TESTS = ("test/test_cuda_device_arrays.py",)
#: The GPU kernels' test files the ``kernels`` step runs on ``cuda`` (PoCL runs them in the suite); their
#: sm_90 compile checks ran where the suite ran and are left out.
KERNEL_TESTS = ("test/test_chunked_gpu.py", "test/test_chunked_gpu_backward.py", "test/test_gpu_delta.py",
                "test/test_gpu_delta_backward.py", "test/test_gpu_delta_chunked.py",
                "test/test_gpu_delta_chunked_backward.py")
#: Files a GPU call brings back from its output directory.
MAX_FILES = 8


@dataclass
class Step:
    """One step: its name, its time budget (seconds), the commands of a real and of a dry run
    (``None``: not run then, with ``note`` as the reason), the exit codes that mean a correctness failure,
    and the files it leaves in the output directory.  ``{out}``, ``{scratch}``, ``{budget}`` in a command are
    the output directory, a scratch directory and the step's time limit."""

    name: str
    budget: int
    real: list[str] | None
    dry: list[str] | None
    fails: tuple[int, ...] = (1,)
    files: tuple[str, ...] = ()
    copies: tuple[str, ...] = ()
    optional: bool = False
    note: str = ""
    env: dict = field(default_factory=dict)


STEPS = (
    Step("tests", 60, [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CUDA_TESTS,
                       "-k", "not the_record_is_current"],
         [PY, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *DRY_TESTS]),
    Step("kernels", 150, [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", *KERNEL_TESTS, "-k", "not sm90"],
         None, env={"SCANWEAVER_TEST_GPU_BACKEND": "cuda"}, note="the suite runs the GPU kernels' tests on PoCL"),
    Step("families", 70, [PY, "bench/gpu_families.py", "--out", "{out}/families.json", "--budget", "{budget_less_10}"],
         [PY, "bench/gpu_families.py", "--dry-run", "--out", "{out}/families.json"], files=("families.json",)),
    Step("chunked", 120, [PY, "bench/gpu_chunked.py", "--out", "{out}/gpu_chunked.json", "--budget",
                          "{budget_less_30}"],
         [PY, "bench/gpu_chunked.py", "--dry-run", "--out", "{out}/gpu_chunked.json"], files=("gpu_chunked.json",)),
    Step("gpu_check", 70, [PY, "bench/gpu_check.py", "--json", "--budget", "{budget_less_15}", "--out",
                           "{out}/gpu_check.json"],
         [PY, "bench/gpu_check.py", "--json", "--allow-no-gpu", "--out", "{out}/gpu_check.json"],
         files=("gpu_check.json",)),
    Step("scoreboard", 90, [PY, "-m", "scanweaver", "bench", "--suite", "gpu", "--models-budget=0", "--no-progress",
                             "--no-plots", "--budget", "{budget_less_30}", "--out", "{scratch}/scoreboard"],
         [PY, "-m", "scanweaver", "bench", "--suite", "gpu", "--quick", "--models-budget=5", "--no-progress",
          "--no-plots", "--out", "{scratch}/scoreboard"], copies=("scoreboard/gpu.json", "scoreboard/gpu_models.json")),
    Step("models", 110, [PY, "bench/gpu_models.py", "--out", "{scratch}/models", "--budget", "{budget_less_30}"],
         None, copies=("models/gpu_models.json",), note="the dry run's scoreboard step runs the model table"),
    Step("defaults", 60, [PY, "bench/gpu_defaults.py", "--out-dir", "{out}", "--budget", "{budget_less_15}"],
         [PY, "bench/gpu_defaults.py", "--dry-run", "--out-dir", "{out}", "--budget", "{budget_less_15}"], fails=()),
    Step("training", 90, [PY, "bench/gpu_training.py", "--skip-warp", "--out", "{out}/gpu_training.json"], None,
         fails=(), files=("gpu_training.json",), optional=True, note="the vector scan's training step needs a GPU"),
)


@dataclass
class Session:
    """The session's state: where it writes, its deadline and what each step did."""

    out: Path
    scratch: Path
    deadline_s: float
    dry: bool
    env: dict
    min_step: float = 30.0
    start: float = field(default_factory=time.time)
    summary: dict = field(default_factory=dict)
    log: object = None

    def left(self) -> float:
        return self.deadline_s - (time.time() - self.start)

    def say(self, text: str) -> None:
        print(text, flush=True)
        if self.log is not None:
            self.log.write(text + "\n")
            self.log.flush()

    def write_summary(self) -> None:
        self.summary["elapsed_s"] = round(time.time() - self.start, 1)
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1, default=str) + "\n")


def setup(s: Session) -> None:
    """The device's name from the driver, versions, carried wheels installed, ``.deps/site`` on the path."""
    t0 = time.time()
    paths = [str(ROOT / "python")]
    wheels = sorted((ROOT / ".whl").glob("*.whl"))
    note = []
    if wheels:
        site = s.scratch / "site"
        proc = subprocess.run([PY, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                               "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, wheels)],
                              capture_output=True, text=True, timeout=max(10, min(60, s.left() - 400)))
        note.append(f"{len(wheels)} wheels installed (exit {proc.returncode})")
        paths.append(str(site))
    if (ROOT / ".deps" / "site").is_dir():
        paths.append(str(ROOT / ".deps" / "site"))
    needed = ROOT / ".deps" / "needed"  # scanweaver's own requirements, where this Python lacks them
    if needed.is_dir() and any(importlib.util.find_spec(p.name) is None for p in needed.iterdir()
                               if p.is_dir() and not p.name.endswith(".dist-info")):
        paths.append(str(needed))
        note.append("scanweaver's requirements from .deps/needed")
    s.env["PYTHONPATH"] = os.pathsep.join(paths + ([s.env["PYTHONPATH"]] if s.env.get("PYTHONPATH") else []))
    sys.path[:0] = [str(ROOT / "bench"), *paths]
    from gpu_defaults import driver_name, file_name, match_of  # noqa: E402  (bench/ is on the path now)

    name = None if s.dry else driver_name()
    if name is None:
        probe = subprocess.run([PY, "-c", "from scanweaver.runtime import REGISTRY as R; a = R['"
                                + ("opencl" if s.dry else "cuda") + "'].availability(); print(a.device or a.reason)"],
                               capture_output=True, text=True, env=s.env, timeout=60)
        name = (probe.stdout.strip().splitlines() or ["unknown"])[-1].split(" (")[0]
    versions = subprocess.run([PY, "-c", VERSIONS], capture_output=True, text=True, env=s.env,
                              timeout=60).stdout.split("\n")
    s.summary.update(device=name, match=match_of(name), device_file=file_name(match_of(name)),
                     versions=[v for v in versions if v], dry_run=s.dry, deadline_s=s.deadline_s, steps=[])
    s.say(f"== setup: {name} (device file {file_name(match_of(name))}); {'; '.join(note) or 'no wheels carried'}")
    s.summary["steps"].append({"name": "setup", "status": "ok", "seconds": round(time.time() - t0, 1)})
    s.write_summary()


def run_step(s: Session, step: Step, reserve: float, wanted: set[str]) -> bool:
    """Runs ``step`` under its time limit; returns False when it found a correctness failure."""
    row = {"name": step.name, "budget_s": step.budget}
    s.summary["steps"].append(row)
    command = step.dry if s.dry else step.real
    # priority order: a step gets its own budget first (the time past the later steps' budgets when there is
    # more); later steps share what is left, so a deadline under the sum of the budgets cuts the last steps
    limit = int(min(s.left(), max(step.budget, s.left() - reserve)))
    if step.name not in wanted:
        row.update(status="skipped", note="not asked for (--steps)")
    elif command is None:
        row.update(status="skipped", note=step.note)
    elif len(have := {p.name for p in s.out.iterdir() if p.is_file()}
             | set(step.files) | {Path(c).name for c in step.copies}) > MAX_FILES:
        row.update(status="skipped", note=f"its files would make {len(have)}, past the {MAX_FILES} a GPU call brings "
                                          "back")
    elif limit < min(step.budget, s.min_step) or (step.optional and limit < step.budget):
        row.update(status="skipped", note=f"only {s.left():.0f} s left (its budget: {step.budget} s)")
    if "status" in row:
        s.say(f"== {step.name}: skipped ({row['note']})")
        s.write_summary()
        return True
    subs = {"{out}": str(s.out), "{scratch}": str(s.scratch), "{budget}": str(limit)}
    subs.update({f"{{budget_less_{n}}}": str(max(5, limit - n)) for n in (10, 15, 30)})
    argv = [functools.reduce(lambda text, kv: text.replace(*kv), subs.items(), a) for a in command]
    s.say(f"== {step.name} (up to {limit} s): {' '.join(argv)}")
    t0 = time.time()
    proc = subprocess.Popen(argv, cwd=ROOT, env={**s.env, **step.env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True,
                            start_new_session=True)
    killed = threading.Event()

    def stop() -> None:  # the step's own process group: it and its children
        killed.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    watchdog = threading.Timer(limit, stop)
    watchdog.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            s.say("   " + line.rstrip())
        proc.wait()
    finally:
        watchdog.cancel()
    timed_out = killed.is_set()
    rc = proc.returncode
    status = "timeout" if timed_out else "FAILED" if rc in step.fails else "ok" if rc == 0 else f"exit-{rc}"
    for rel in step.copies:
        src = s.scratch / rel
        if src.is_file():
            shutil.copy(src, s.out / src.name)
            if src.name.endswith(".json") and src.with_suffix(".md").is_file():
                s.say(src.with_suffix(".md").read_text())
    row.update(status=status, exit=rc, seconds=round(time.time() - t0, 1), limit_s=limit,
               files=sorted(p.name for p in s.out.iterdir() if p.is_file()))
    s.say(f"== {step.name}: {status} in {row['seconds']} s (exit {rc})")
    s.write_summary()
    return status != "FAILED"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "gpu-session"))
    ap.add_argument("--deadline", type=float, default=float(os.environ.get("DEADLINE_S", 510)))
    ap.add_argument("--dry-run", action="store_true", default=os.environ.get("SCANWEAVER_GPU_DRY_RUN") == "1")
    ap.add_argument("--steps", default=os.environ.get("STEPS", " ".join(st.name for st in STEPS)),
                    help="the steps to run, by name (the others are reported as skipped)")
    ap.add_argument("--warp-build", action="store_true", help="include accelerated-scan's warp kernel (70 s build)")
    ap.add_argument("--min-step", type=float, default=30.0, help="skip a step left fewer seconds than this")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    if not args.warp_build:
        env["SCANWEAVER_SKIP_WARP_BUILD"] = "1"
    with tempfile.TemporaryDirectory(prefix="sw-gpu-session-") as scratch, \
            open(args.out / "session.log", "w") as log:
        s = Session(args.out, Path(scratch), args.deadline, args.dry_run, env, args.min_step, log=log)
        setup(s)
        wanted = set(args.steps.split())
        ok = True
        for i, step in enumerate(STEPS):
            later = sum(st.budget for st in STEPS[i + 1:] if not st.optional and st.name in wanted
                        and (st.dry if s.dry else st.real) is not None)
            ok = run_step(s, step, later, wanted) and ok
        s.summary["correctness_failures"] = [r["name"] for r in s.summary["steps"] if r.get("status") == "FAILED"]
        s.write_summary()
        s.say(f"== done in {time.time() - s.start:.0f} s of {args.deadline:.0f}; files: "
              f"{' '.join(sorted(p.name for p in args.out.iterdir()))}")
        for r in s.summary["steps"]:
            s.say(f"{r['name']:11s} {r.get('status', '?'):9s} {r.get('seconds', 0):6} s  {r.get('note', '')}")
    return 1 if s.summary["correctness_failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
