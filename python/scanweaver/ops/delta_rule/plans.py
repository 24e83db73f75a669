"""Repeated delta-rule forwards at the speed of the kernel: a plan per call signature.

A serving loop calls a delta-rule operation with one token at a time (decode, ``T = 1``), so the work
around the kernel (checking and packing the operands, picking the backend and its tunables, passing each
array's address) costs more than the kernel.  :func:`forward` runs the full path the first time a
*signature* is seen (the family; the arrays' shapes, strides and dtypes; which optional ones are given;
the options: scale, flags, backend, tunables) and keeps a :class:`ForwardPlan` of what it resolved, in a
:class:`scanweaver.core.fastpath.PlanCache`.  A later call with the same signature does only what
depends on the data: the outputs (from the host pool, as the full path takes them), fla's
``use_beta_sigmoid_in_kernel`` and a ``state_v_first`` initial state's transpose, the kernel through the
backend's checked direct call (:class:`scanweaver.calls.runner.FusedPlan`), and the scale; its result is
the full path's, bit for bit, and :data:`scanweaver.matrix.last` says what ran, as after every call.
The NumPy entry points (:func:`call`) find the same plans by the call's own arguments (every one beside the
arrays by type and value), so a repeated call skips even the checks of those arguments; the steps and the
framework adapters' kernel pairs (``scanweaver.torch`` on CPU tensors) find them by their options.

Only calls the full path ran on the ``cpu`` backend's direct call are planned, with NumPy arrays (CPU
tensors reach here as NumPy views) that the kernel reads as they are: C-contiguous, aligned, in the
storage dtype (states in the accumulation dtype), and no ``cu_seqlens`` (its offsets are data the full path
checks).  Anything else takes the full path every time: a changed signature finds no plan, and an array
the direct call refuses (misaligned memory) makes the call run the full path, which copies it.  A plan
whose tunables came from the tuned store (or its defaults) is rebuilt once the store changes.

Example:
    >>> import numpy as np
    >>> from scanweaver.ops.delta_rule.plans import forward
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(3, 1, 4, 2, 3))
    >>> o, h = forward("delta_rule", [q, k / 3, v, rng.uniform(0, 1, (1, 4, 2)), None], {"backend": "numpy"})
    >>> o.shape, h.shape
    ((1, 4, 2, 3), (1, 2, 3, 3))
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np

from ...arrays import contiguous, output_array
from ...calls import runner
from ...calls.declare import OPERATIONS
from ...calls.pairs import PAIRS
from ...core import fastpath
from ...schedules.base import tunables_key
from ...tuning import store
from .families import (DEFAULT_SCALE, INPUTS, beta_of_logits, beta_scale, finish_forward, output_scale,
                       reported_family_forward)
from .operands import DeltaOperands

#: Forward plans by call key (family, options, the inputs' signatures).
PLANS = fastpath.PlanCache()
#: Each operation's getter of its arguments beside its arrays (made on first use).
_PARAMS: dict[str, operator.itemgetter] = {}
#: The kernel's name of each input of a kernel pair (RWKV-7's r and w are q and g).
_KERNEL_NAMES = {"r": "q", "w": "g", "initial_state": "h0"}


@dataclass(frozen=True)
class ForwardPlan:
    """A delta-rule forward on host arrays resolved for one signature (see the module docstring).

    Attributes:
        fused: the kernel as the first call resolved it.
        reads: ``(kernel parameter, input index)`` of the inputs the kernel reads as given.
        beta: ``(input index, c)`` where beta is taken as logits (``c * sigmoid(beta)`` per call), else ``None``.
        h0: the input index of an initial state given ``(N, HV, V, K)`` (transposed per call), else ``None``.
        o_shape, dtype: o's shape and storage dtype.
        state_shape, state_dtype: the kernel's final state ``(N, HV, K, V)`` and its dtype.
        scale: the output scale, a scalar of ``state_dtype``.
        out_dtype: o's returned dtype.
        v_first: the final state is returned ``(N, HV, V, K)``.
    """

    fused: runner.FusedPlan
    reads: tuple[tuple[str, int], ...]
    beta: tuple[int, float] | None
    h0: int | None
    o_shape: tuple[int, ...]
    dtype: np.dtype
    state_shape: tuple[int, ...]
    state_dtype: np.dtype
    scale: np.generic
    out_dtype: np.dtype
    v_first: bool

    def fresh(self) -> bool:
        """False once the tuned store has changed since the plan's tunables were read from it."""
        return self.fused.fresh()

    def run(self, inputs: list) -> list:
        """``[o, final_state]`` for ``inputs`` of this plan's signature.

        Raises:
            ValueError, BufferError: an array the direct call refuses (misaligned), before the kernel ran.
        """
        arrays = {name: inputs[i] for name, i in self.reads}
        if self.beta is not None:
            i, c = self.beta
            arrays["beta"] = contiguous(beta_of_logits(inputs[i], c), self.dtype)
        if self.h0 is not None:
            arrays["h0"] = contiguous(np.swapaxes(inputs[self.h0], -1, -2), self.state_dtype)
        o = arrays["o"] = output_array(np, self.o_shape, self.dtype, near=arrays["v"])
        h = arrays["hlast"] = output_array(np, self.state_shape, self.state_dtype)
        self.fused.launch(arrays)
        return finish_forward(o, h, self.scale, self.out_dtype, self.v_first)


def key(family: str, inputs: list, options: dict) -> tuple | None:
    """The plan key of a call of ``family`` (its kernel pair's ``inputs`` and ``options``), or ``None`` when it
    cannot have a plan (an input that is not a NumPy array or ``None``, ``cu_seqlens``, unhashable tunables)."""
    if options.get("cu_seqlens") is not None:
        return None
    tunables = options.get("tunables")
    flags = fastpath.hashable((family, options.get("scale", DEFAULT_SCALE.get(family)), bool(options.get("l2norm")),
                               beta_scale(options), bool(options.get("state_v_first")), options.get("chunk_size"),
                               options.get("backend", "auto"), tunables_key(tunables) if tunables else ()))
    if flags is None or not all(x is None or type(x) is np.ndarray for x in inputs):
        return None
    return fastpath.signature(tuple(inputs), flags)


#: The types of the arguments beside the arrays that an entry point's plan key takes by value (immutable ones;
#: any other, e.g. a list of offsets, leaves the call without a key: it takes the full path).
_LITERALS = frozenset({type(None), bool, int, float, str, np.bool_, np.int32, np.int64, np.float32, np.float64})


def call(family: str, args: dict):
    """The NumPy entry point of ``family`` (``args``: its arguments by name, ``tunables`` the ``**`` keywords):
    the plan of the call's signature when it has one, else the full path, the declaration's kernel pair.

    The key holds every argument beside the arrays by type and value, so a call that finds a plan passes what
    the call that made it passed, and the full path's checks of those arguments (options, booleans, tunables)
    would pass again; the arrays' signatures stand for their checks.
    """
    op = OPERATIONS.get(family)
    inputs = [args[n] for n in INPUTS[family]]
    k = _entry_key(family, inputs, args)
    plan = PLANS.get(k) if k is not None else None
    if plan is not None and plan.fresh():
        try:
            return op.finish(plan.run(inputs), args)
        except (ValueError, BufferError):  # found before the kernel ran: the full path copies the array
            pass
    options = op.options(args)
    out = PAIRS.get(family).forward(inputs, options)  # keeps a plan under the kernel pair's key
    if k is not None:
        kept = PLANS.get(key(family, inputs, options))
        if kept is not None:
            PLANS.put(k, kept)
    return op.finish(out, args)


def _entry_key(family: str, inputs: list, args: dict) -> tuple | None:
    """The plan key of a NumPy entry point's call, or ``None`` (an argument that is not a literal)."""
    values = _scalars(family)(args)
    types = tuple(map(type, values))
    if not _LITERALS.issuperset(types):
        return None
    tunables = args.get("tunables")
    flags = fastpath.hashable(("entry", family, values, types, tunables_key(tunables) if tunables else ()))
    return fastpath.signature(tuple(inputs), flags)


def _scalars(family: str) -> operator.itemgetter:
    """``args -> (...)``: an operation's arguments beside its arrays, in its signature's order."""
    get = _PARAMS.get(family)
    if get is None:
        get = _PARAMS[family] = operator.itemgetter(*(n for n in OPERATIONS.get(family).parameters
                                                      if n not in INPUTS[family]))
    return get


def forward(family: str, inputs: list, options: dict) -> list:
    """:func:`~scanweaver.ops.delta_rule.families.family_forward` on host arrays, from the signature's plan when
    there is one, else by the full path (which keeps a plan where the call qualifies)."""
    k = key(family, inputs, options)
    plan = PLANS.get(k) if k is not None else None
    if plan is not None and plan.fresh():
        try:
            return plan.run(inputs)
        except (ValueError, BufferError):  # e.g. misaligned memory, found before the kernel ran: the full path
            pass                           # copies it
    stamp = store.stamp()  # before the full path reads the store
    out, ops, info = reported_family_forward(family, inputs, options)
    if k is not None and info is not None:
        made = _build(family, inputs, options, ops, info, stamp)
        if made is not None:
            PLANS.put(k, made)
    return out


def _build(family: str, inputs: list, options: dict, ops: DeltaOperands, info: runner.FusedInfo,
           stamp: object) -> ForwardPlan | None:
    """The plan of a call that just ran the full path, or ``None`` when it does not qualify (see the module
    docstring)."""
    if ops.xp is not np or ops.v.size == 0 or ops.q.size == 0:
        return None
    kernel = ops.arrays()
    beta = h0 = None
    reads = []
    for i, (name, given) in enumerate(zip(INPUTS[family], inputs, strict=True)):
        param = _KERNEL_NAMES.get(name, name)
        if given is None:
            continue
        if param == "beta" and beta_scale(options) is not None:
            beta, want = (i, beta_scale(options)), ops.dtype
        elif param == "h0" and options.get("state_v_first"):
            h0, want = i, ops.state_dtype
        elif kernel[param] is given:
            reads.append((param, i))
            continue
        else:
            return None  # the full path converted it: a plan would have to copy it per call
        if given.dtype != want:
            return None
    fused = runner.plan_of(info, ops.features(), ops.sizes, stamp)
    if fused is None:
        return None
    return ForwardPlan(fused, tuple(reads), beta, h0, tuple(ops.v.shape), ops.dtype, ops.state_shape, ops.state_dtype,
                       output_scale(family, ops, options), np.dtype(ops.out_dtype),
                       bool(options.get("state_v_first")))
