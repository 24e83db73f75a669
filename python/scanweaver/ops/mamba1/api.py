"""The Mamba-1 selective scan (S6): the fused kernel by default, the scan lowering as the readable reference.

Gu & Dao (2023), "Mamba: Linear-Time Sequence Modeling with Selective State
Spaces", Algorithm 2.  Per batch element, channel ``d`` and state index ``n``:

    h_t[d, n] = exp(delta_t[d] * A[d, n]) * h_{t-1}[d, n] + delta_t[d] * B_t[n] * u_t[d]
    y_t[d]    = sum_n C_t[n] * h_t[d, n] + D[d] * u_t[d]        (then * silu(z_t[d]))

The layouts are those of the ``mamba_ssm`` reference (``selective_scan_ref``).

Two paths compute it:

* ``fused`` (the default wherever a backend renders it: ``cpu``, ``numpy``, and
  the GPU backends): the fused operation :mod:`scanweaver.fused.mamba1`, one
  kernel that keeps the N states of a channel in registers and reads each
  input once; memory is the inputs plus ``y``.  :func:`forward` and
  :func:`backward` are its NumPy-level entry points (the PyTorch and JAX
  wrappers call them).
* ``scan`` (``fused=False``, or any ``schedule=``): the step
  ``exp(delta*A) * h + delta*B*u`` traced as one ScanWeaver recurrence over
  ``batch * D * N`` lanes, which materialises the broadcast operands and the
  states (about ``5 * batch*D*N*L`` elements): the readable definition, and
  the path for complex A/B/C and ``log_space``.
"""

from __future__ import annotations

from ...calls.declare import operation
from ...core import fastpath
from ...errors import ScanInputError
from ...schedules.base import tunables_key
from .grad import INPUTS, finish, options
from .kernels import fused_backend, plan_forward
from .operands import API, prepare
from .scan_path import scan_path


def _tunables() -> set[str]:
    """Every tunable a call may pass: the fused kernels' (every target family), the scan path's schedules'
    and the log-space chunk."""
    from ...fused import REGISTRY as FUSED
    from ...schedules import REGISTRY as SCHEDULES

    names = {t.name for ts in FUSED.get("mamba1").tunables.values() for t in ts}
    names.update(t.name for s in SCHEDULES.values() for t in s.tunables)
    return names | {"chunk"}


@operation(arrays=INPUTS, pair="mamba1", options=options, finish=finish, tunables=_tunables,
           frameworks=("torch", "jax", "dask"))
def mamba_selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus: bool = False,
                         return_last_state: bool = False, *, h0=None, return_state: bool = False, cu_seqlens=None,
                         log_space: bool = False, backend: str = "auto", schedule: str = "auto",
                         fused: bool | None = None, **tunables):
    """The Mamba-1 selective scan with the semantics of ``mamba_ssm``'s ``selective_scan_ref``.

    By default the fused kernel runs (see the module docstring): no array of
    size ``batch*D*N*L`` is ever allocated, so real layer sizes such as
    ``(8, 1536, 16, 2048)`` run in the memory of their inputs and output.
    Tunables of the fused kernel: ``chunk``, ``width``, ``threads`` on ``cpu``;
    ``workgroup_size``, ``items_per_thread`` on GPUs (``scanweaver tune --op mamba1``
    stores the best per problem size; :data:`last` says what ran).

    Dtypes: float16/bfloat16 inputs accumulate in float32 and ``y`` comes back in
    ``u``'s dtype; the state stays in the accumulation dtype.  Complex ``A``/``B``/``C``
    run on the scan path and give a complex ``y`` (``mamba_ssm`` instead returns
    ``2 * y.real`` for its conjugate-pair convention).

    Args:
        u: input ``(batch, D, L)``.
        delta: step sizes ``(batch, D, L)``.
        A: ``(D, N)`` transition parameters (negative real parts decay).
        B: ``(batch, N, L)``, ``(batch, G, N, L)`` with G dividing D, or fixed ``(D, N)``.
        C: like ``B`` (its own G).
        D: skip ``(D,)`` or None.
        z: gate ``(batch, D, L)`` or None; y is multiplied by ``silu(z)``.
        delta_bias: ``(D,)`` added to ``delta`` before the softplus.
        delta_softplus: apply ``softplus`` to ``delta``.
        return_last_state: also return the final state ``(batch, D, N)`` (mamba-ssm's name and position).
        h0: initial state ``(batch, D, N)`` or None (zeros).
        return_state: the same as ``return_last_state``.
        cu_seqlens: offsets ``[0, ..., L]`` of sequences packed along L; each one
            after the first starts from a zero state.
        log_space: scan path with the exact log gate ``delta*A`` (:mod:`scanweaver.ops.log_scan`):
            more accurate for gates near 1, NumPy only.
        backend: ``auto`` or a backend name (see :func:`scanweaver.selective_scan`).
        schedule: a schedule name runs the scan path with that schedule.
        fused: ``None`` (fused wherever the backend has it), ``True`` (fused, or an error
            naming the backends that have it), ``False`` (the scan path).
        **tunables: tunables of the path that runs (``chunk=`` is the log-space chunk with ``log_space``).

    Returns:
        ``y`` of shape ``(batch, D, L)``, or ``(y, state)`` with ``return_last_state``.

    Example:
        >>> import numpy as np, scanweaver
        >>> rng = np.random.default_rng(0)
        >>> u, delta = rng.normal(size=(1, 2, 5)), rng.uniform(0.1, 1, (1, 2, 5))
        >>> A, B, C = -rng.uniform(0.5, 1, (2, 3)), rng.normal(size=(1, 3, 5)), rng.normal(size=(1, 3, 5))
        >>> y = scanweaver.mamba_selective_scan(u, delta, A, B, C, backend="numpy")
        >>> y.shape, scanweaver.mamba.last.part
        ((1, 2, 5), 'forward')
    """
    return_state = return_state or return_last_state
    key = None
    if cu_seqlens is None and not log_space and schedule == "auto" and fused is not False:
        key = fastpath.signature((u, delta, A, B, C, D, z, delta_bias, h0),
                                 _flags(delta_softplus, return_state, backend, fused, tunables))
        hit = _plans.get(key) if key is not None else None
        if hit is not None and hit[0].fresh():
            plan, layout = hit
            arrays = {"u": u, "delta": delta, "A": A, "B": B.reshape(layout[0]), "C": C.reshape(layout[1]), "D": D,
                      "z": z, "delta_bias": delta_bias, "h0": h0, "reset": None}
            try:
                y, h = plan.run(arrays, return_state)
                return (y, h) if return_state else y
            except (ValueError, BufferError):  # e.g. misaligned memory, checked before the kernel ran
                pass
    ops = prepare(u, delta, A, B, C, D, z, delta_bias, delta_softplus, h0, cu_seqlens)
    if fused and (log_space or schedule != "auto"):
        raise ScanInputError(f"{API}: fused=True has no schedules and no log_space; got schedule={schedule!r}, "
                             f"log_space={log_space}")
    use_fused = fused is not False and not log_space and schedule == "auto" and \
        (fused or fused_backend(backend, ops.dtype, features=ops.features()) is not None)
    if use_fused:
        plan = plan_forward(ops, backend=backend, **tunables)
        y, h = plan.run(ops.arrays(), return_state)
        if key is not None and _plannable((u, delta, A, B, C, D, z, delta_bias, h0), ops):
            _plans.put(key, (plan, (ops.B.shape, ops.C.shape)))
    else:
        y, h = scan_path(ops, cu_seqlens, log_space, backend, schedule, tunables)
    y = y.astype(ops.out_dtype, copy=False)
    return (y, h) if return_state else y


#: Resolved fused forwards per call signature, with the kernel layouts of B and C.
_plans = fastpath.PlanCache()


def _flags(softplus, return_state, backend, fused, tunables: dict) -> tuple | None:
    return fastpath.hashable((bool(softplus), bool(return_state), backend, fused, tunables_key(tunables)))


def _plannable(given: tuple, ops) -> bool:
    """True when every given array is already what the kernel reads (C-contiguous, aligned, the scan's dtype),
    so a repeated call may hand it over as it is."""
    return ops.out_dtype == ops.dtype and all(
        v is None or (v.dtype == ops.dtype and v.flags.c_contiguous and v.flags.aligned) for v in given)


__all__ = ["mamba_selective_scan"]
