"""The core of a scan call: compiled recurrences and what every call of one shares.

* :mod:`.recurrence`: :class:`~.recurrence.Recurrence`, a step function proved affine, ready to run.
* :mod:`.dispatch`: which backend, schedule and tunables a call runs.
* :mod:`.fastpath`: call plans cached per signature (repeated calls at the speed of the kernel).
* :mod:`.autodiff`: gradients of recurrences on arrays (stage ``adjoint``), and :func:`~.autodiff.vjp`.
* :mod:`.plans`: :func:`~.plans.plan`, an explicit plan for hot loops.

Nothing here imports an operation (:mod:`scanweaver.ops`), the front door or an adapter.
"""
