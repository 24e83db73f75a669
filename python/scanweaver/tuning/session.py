"""Driving ``kernel_tuner.tune_kernel``: skip failing configurations, resume, replay.

Kernel Tuner stops a whole tune when one configuration fails to compile
(other than for too much shared memory), raises while running, or fails
verification.  :class:`KernelTunerSession` keeps the tune going: it knows
which configuration Kernel Tuner is building (a ``defines`` callback is
called with each configuration's parameters just before it is compiled),
and when ``tune_kernel`` raises it appends that configuration to Kernel
Tuner's cache file as a failed entry with the reason (``sw_skip_reason``),
then calls ``tune_kernel`` again on the same cache.  Kernel Tuner serves
every configuration already in the cache without running it, so the tune
continues where it stopped, and the failure stays on record for replays.

Kernel Tuner writes temporary sources and libraries into the working
directory; the session runs it inside its own work directory.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import random
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from ..errors import ScanInputError, ScanWeaverError
from .langs.base import KernelSpec
from .space import SearchSpace

log = logging.getLogger("scanweaver.tuning")

#: the result field that carries why ScanWeaver skipped a configuration
SKIP_REASON = "sw_skip_reason"


def require_kernel_tuner():
    """Imports Kernel Tuner, or says how to install it."""
    try:
        import kernel_tuner
    except ImportError as exc:
        raise ScanWeaverError(
            f"tune: Kernel Tuner is not installed ({exc}); install the tuning extra: pip install scanweaver[tune]"
        ) from None
    return kernel_tuner


@contextlib.contextmanager
def working_directory(path: Path):
    """Runs the block with ``path`` as the working directory."""
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


@contextlib.contextmanager
def _removed(path: Path):
    """Deletes ``path`` (Kernel Tuner's temporary files) when the block ends."""
    try:
        yield
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def seeded(seed: int | None):
    """Seeds NumPy's and Python's global generators (Kernel Tuner's strategies use them), then restores them."""
    if seed is None:
        yield
        return
    np_state, py_state = np.random.get_state(), random.getstate()
    np.random.seed(seed)
    random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)


def kt_restriction(space: SearchSpace):
    """``space.valid`` as Kernel Tuner calls restrictions (a params dict, or the value when there is one tunable)."""
    names = list(space.params)

    def restriction(*args):
        params = args[0] if len(args) == 1 and isinstance(args[0], dict) else dict(zip(names, args, strict=True))
        return space.valid(params)

    return restriction


def kernel_tuner_inputs(lang: str, tune_params: dict, strategy_options: dict | None) -> tuple:
    """``tune_params`` and ``strategy_options`` in the form Kernel Tuner wants for ``lang``.

    For ``lang="julia"`` Kernel Tuner's ``tune_kernel`` refuses a dict of
    tunables (it converts a list of ``(name, values)`` pairs, whose order is the
    kernels' ``Val`` order) and unpacks ``strategy_options`` as pairs too; every
    other language takes the dicts as they are.

    Example:
        >>> kernel_tuner_inputs("julia", {"workgroup_size": [32, 64]}, {"max_fevals": 4})
        ([('workgroup_size', [32, 64])], [('max_fevals', 4)])
    """
    if lang.upper() != "JULIA":
        return tune_params, strategy_options
    options = None if strategy_options is None else list(strategy_options.items())
    return list(tune_params.items()), options


def read_cached(cachefile: Path) -> list[dict]:
    """Every configuration in a Kernel Tuner cache file."""
    from kernel_tuner import util

    if not Path(cachefile).exists():
        return []
    return list(util.read_cache(str(cachefile), open_cache=False)["cache"].values())


def reused_cache_notes(cachefile: Path) -> list[str]:
    """What a tune on ``cachefile`` will reuse instead of measuring (``[]`` for a new or empty cache)."""
    try:
        entries = read_cached(cachefile)
    except Exception as exc:  # an unreadable cache: Kernel Tuner will say so when it opens it
        return [f"Kernel Tuner's cache {cachefile} could not be read ({type(exc).__name__}); it is not reused"]
    if not entries:
        return []
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(Path(cachefile).stat().st_mtime))
    return [f"reused {len(entries)} configuration(s) measured before from Kernel Tuner's cache {cachefile} "
            f"(last written {when}); they were not measured again: pass --fresh (fresh=True) to re-measure"]


def reason_of(exc: BaseException) -> str:
    """A one-line reason for a configuration's failure (compiler stderr when there is one)."""
    stderr = getattr(exc, "stderr", None)
    text = stderr if isinstance(stderr, str) and stderr.strip() else str(exc)
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    first = (errors or lines or [type(exc).__name__])[0]
    kind = "compile failed" if stderr is not None else f"{type(exc).__name__}"
    return f"{kind}: {first}"[:300]


def result_time(r: dict) -> float | None:
    """A configuration's time in ms: median of its repeated runs, else Kernel Tuner's ``time``; ``None`` if failed."""
    if "__error__" in r or r.get(SKIP_REASON):
        return None
    times = r.get("times")
    if isinstance(times, (list, tuple)) and times and all(isinstance(t, (int, float)) for t in times):
        return float(np.median(times)) if min(times) >= 0 else None  # a C kernel returns -1 when it fails
    t = r.get("time")
    return float(t) if isinstance(t, (int, float)) and np.isfinite(t) and t >= 0 else None


def failure_of(r: dict) -> str | None:
    """Why a result failed, or ``None`` when it has a time."""
    if r.get(SKIP_REASON):
        return str(r[SKIP_REASON])
    err = r.get("__error__")
    if err is not None:
        return {"InvalidConfig": "invalid configuration", "CompilationFailedConfig": "compile failed",
                "RuntimeFailedConfig": "launch failed (resources)"}.get(str(err), str(err))
    return None if result_time(r) is not None else "the kernel reported a failure (negative time)"



def check_budget(max_fevals, time_limit) -> None:
    """The budget of a tune, checked before anything is built: ``max_fevals`` an int >= 1, ``time_limit`` a number
    of seconds > 0 (NaN ran without a limit, a negative one measured nothing), each or ``None``.

    Raises:
        ScanInputError: naming the argument and what it got.
    """
    if max_fevals is not None and (isinstance(max_fevals, bool) or not isinstance(max_fevals, (int, np.integer))
                                   or max_fevals < 1):
        raise ScanInputError(f"tune: max_fevals must be an int >= 1 or None, got {max_fevals!r}")
    if time_limit is not None and (isinstance(time_limit, bool) or not isinstance(time_limit, (int, float, np.number))
                                   or math.isnan(time_limit) or time_limit <= 0):
        raise ScanInputError(f"tune: time_limit must be a number of seconds > 0 (or None: no limit), got "
                             f"{time_limit!r}")


class KernelTunerSession:
    """One Kernel Tuner cache file and the kernel it times.

    Args:
        spec: the kernel, arguments and geometry.
        space: the search space.
        cachefile: Kernel Tuner cache file (created or resumed).
        check: ``check(y) -> reason | None`` compares the output with the oracle.
        progress: show a tqdm progress bar.
        iterations: timed runs per configuration.
    """

    def __init__(self, spec: KernelSpec, space: SearchSpace, cachefile: Path, check=None, progress: bool = False,
                 iterations: int = 7, answer=None):
        self.spec, self.space, self.cachefile = spec, space, Path(cachefile)
        self.check, self.progress, self.iterations = check, progress, iterations
        self.answer = answer
        self.current: dict | None = None
        self.wrong: dict[str, str] = {}
        self.output = io.StringIO()
        self.notes: list[str] = []
        self._bar = None
        self._seen: set[str] = set()

    # -- hooks Kernel Tuner calls ------------------------------------------------
    def _observe(self, params: dict) -> None:
        self.current = dict(params)
        key = self.space.key(params)
        if self._bar is not None and key not in self._seen:
            self._seen.add(key)
            self._bar.update(1)

    def _defines(self) -> dict:
        names = [k for k, vs in self.space.params.items() if all(isinstance(v, (int, np.integer)) for v in vs)]
        defines: dict = {}
        if self.spec.define_tunables:
            for name in names:
                defines[name] = (lambda p, n=name: p[n])
        defines.update(self.spec.defines)
        first = next(iter(defines), None)
        hook = defines.get(first)

        def observed(p, hook=hook):
            self._observe(p)
            return hook(p) if callable(hook) else hook

        if first is None:
            return {"sw_tuning": lambda p: (self._observe(p), 1)[1]}
        defines[first] = observed
        return defines

    def _verify(self, answer, result_host, atol=None):
        why = self.check(result_host[self.spec.output]) if self.check else None
        if why and self.current is not None:
            self.wrong[self.space.key(self.current)] = why
        return why is None

    # -- running -----------------------------------------------------------------
    def _record_failure(self, params: dict, reason: str) -> None:
        from kernel_tuner import util

        entry = {**params, "time": util.RuntimeFailedConfig(), SKIP_REASON: reason,
                 "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S")}
        util.store_cache(self.space.key(params), entry, str(self.cachefile), {})
        log.info("tune: skipped %s: %s", params, reason)

    def run(self, *, strategy: str = "brute_force", max_fevals: int | None = None, time_limit: float | None = None,
            seed: int | None = 0, only: dict | None = None, total: int | None = None) -> list[dict]:
        """Tunes until the strategy is done; failed configurations are recorded and skipped.

        Args:
            strategy: a Kernel Tuner strategy name.
            max_fevals: evaluation budget.
            time_limit: seconds for the whole tune (restarts included); Kernel Tuner's
                ``brute_force`` takes no time limit, so there it is checked between restarts only.
            seed: seeds the strategies' random generators.
            only: evaluate just this configuration (e.g. the default one).
            total: progress bar length.

        Returns:
            Kernel Tuner's results (one dict per configuration visited).
        """
        kernel_tuner = require_kernel_tuner()
        start = time.monotonic()
        failed: set[str] = set()
        if strategy == "brute_force" and max_fevals is not None and max_fevals < self.space.size and only is None:
            strategy = "random_sample"  # Kernel Tuner's brute force takes no budget: sample within it instead
            self.notes.append(f"brute_force takes no budget: a random sample of {max_fevals} of the "
                              f"{self.space.size} configurations was searched instead")
        with self.progress_bar(total):
            while True:
                opts = {}
                if max_fevals is not None and strategy != "brute_force":
                    opts["max_fevals"] = int(max_fevals)
                if time_limit is not None:
                    left = time_limit - (time.monotonic() - start)
                    if left <= 0:
                        return self.cached_results()
                    if strategy != "brute_force" and only is None:
                        opts["time_limit"] = left
                self.current = None
                try:
                    return self._tune_once(kernel_tuner, strategy, opts, seed, only)
                except Exception as exc:
                    params = self.current
                    if params is None or self.space.key(params) in failed:
                        raise ScanWeaverError(f"tune: Kernel Tuner failed: {type(exc).__name__}: {exc}\n"
                                              f"{self.output.getvalue()[-2000:]}") from exc
                    key = self.space.key(params)
                    failed.add(key)
                    self._record_failure(params, self.wrong.get(key) or reason_of(exc))

    def _tune_once(self, kernel_tuner, strategy, opts, seed, only):
        spec = self.spec
        tune_params = {k: list(v) for k, v in self.space.params.items()}
        restriction = kt_restriction(self.space)
        if only is not None:
            tune_params = {k: [only[k]] for k in self.space.params}
            restriction = None
        answer = [None] * len(spec.arguments)
        answer[spec.output] = self.answer if self.answer is not None else spec.arguments[spec.output]
        self.cachefile.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix="run-", dir=self.cachefile.parent))
        params, options = kernel_tuner_inputs(spec.lang, tune_params, opts or None)
        with working_directory(scratch), seeded(seed), warnings.catch_warnings(), \
                contextlib.redirect_stdout(self.output), _removed(scratch), spec.exclusive():
            warnings.simplefilter("ignore")
            results, _env = kernel_tuner.tune_kernel(
                spec.kernel_name, spec.kernel_source, spec.problem_size, spec.arguments, params,
                grid_div_x=spec.grid_div_x, grid_div_y=spec.grid_div_y, restrictions=restriction,
                answer=answer if self.check else None, verify=self._verify if self.check else None,
                lang=spec.lang, compiler=spec.compiler, compiler_options=spec.compiler_options,
                defines=self._defines(), block_size_names=spec.block_size_names, iterations=self.iterations,
                strategy=strategy if only is None else "brute_force", strategy_options=options,
                cache=str(self.cachefile), quiet=True, verbose=False, **spec.device_options,
            )
        return results

    def cached_results(self) -> list[dict]:
        """Every configuration in the cache file (what a replay sees)."""
        return read_cached(self.cachefile)

    def search(self, *, strategy: str = "brute_force", max_fevals: int | None = None,
               time_limit: float | None = None, seed: int | None = 0, default: dict | None = None) -> list[dict]:
        """Runs the strategy within the budget and measures ``default`` too: the results of both.

        ``max_fevals`` bounds the configurations measured, the default's included: with a budget smaller
        than the space, the default is measured first, as one of them (with a budget of one, not at all);
        without one, after the strategy when it did not visit it. One progress bar, its total the budget,
        counts the configurations measured (those Kernel Tuner's cache served are not measured again).
        """
        size = self.space.size
        budget = min(max_fevals, size) if max_fevals is not None else None
        bounded = budget is not None and budget < size
        outside = default is not None and not self.space.contains(default)
        out: list[dict] = []
        with self.progress_bar(budget if bounded else size + int(outside)):
            if default is not None and bounded and budget >= 2:
                out += [r for r in self.run(only=default, seed=seed) if r]
                budget -= 1
                self.notes.append(f"the default configuration counts in the budget of {max_fevals}: measured "
                                  f"first, then {budget} by {strategy}")
            out += [r for r in self.run(strategy=strategy, max_fevals=budget, time_limit=time_limit, seed=seed)
                    if r]
            if default is not None and not bounded and all(self.space.key(default) != self.space.key(r)
                                                           for r in out):
                out += [r for r in self.run(only=default, seed=seed) if r]
        if default is not None and bounded and max_fevals == 1:
            self.notes.append("a budget of one configuration leaves none for the default: its time was not measured")
        return out

    @contextlib.contextmanager
    def progress_bar(self, total: int | None):
        """A tqdm bar of ``total`` configurations for the runs inside the block (one bar however many runs;
        none without tqdm, with ``progress=False`` or ``total=None``)."""
        if not self.progress or total is None or self._bar is not None:
            yield
            return
        try:
            from tqdm.auto import tqdm
        except ImportError:
            yield
            return
        self._bar = tqdm(total=total, desc=f"tuning {self.space.backend}", unit="config", leave=False)
        try:
            yield
        finally:
            self._bar.close()
            self._bar = None


def replay(cachefile: Path, space: SearchSpace, *, strategy: str = "brute_force", max_fevals: int | None = None,
           seed: int | None = 0, kernel_name: str | None = None) -> list[dict]:
    """Re-runs a strategy over a Kernel Tuner cache file in simulation mode (nothing is compiled).

    Args:
        cachefile: a Kernel Tuner cache file that covers ``space``.
        space: the search space (its params must match the cache's keys and order).
        strategy, max_fevals, seed: as in :meth:`KernelTunerSession.run`.
        kernel_name: defaults to the cache's.

    Returns:
        Kernel Tuner's results, as a real tune would have returned them.
    """
    kernel_tuner = require_kernel_tuner()
    from kernel_tuner import util

    header = util.read_cache(str(cachefile), open_cache=False)
    opts = {"max_fevals": int(max_fevals)} if max_fevals is not None and strategy != "brute_force" else None
    with seeded(seed), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        results, _env = kernel_tuner.tune_kernel(
            kernel_name or header["kernel_name"], "", header["problem_size"], [],
            {k: list(v) for k, v in space.params.items()}, restrictions=kt_restriction(space), lang="C",
            strategy=strategy, strategy_options=opts, cache=str(cachefile), simulation_mode=True, quiet=True,
        )
    return results
