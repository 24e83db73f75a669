"""The operations, one package each: declaration, NumPy definition, gradient pair and kernel registration.

* :mod:`.scan`: ``selective_scan`` and the ``scan`` pair every compiled recurrence differentiates through.
* :mod:`.mamba1`: ``mamba_selective_scan`` (Mamba-1's fused selective scan).
* :mod:`.matrix_state`: ``linear_attention``, ``rwkv6``, ``mamba2_scan``, their decode steps, and
  ``@recurrence(state_shape=...)`` (the fused ``matrix_state`` operation).
* :mod:`.delta_rule`: the delta-rule family (the fused ``delta_rule`` operation).
* :mod:`.log_scan`: ``log_scan`` (log-space scans, NumPy).

An operation's package imports only downward (the core, the call machinery of
:mod:`scanweaver.calls`, the compiler), never another operation's package
(``log_scan`` is below the others) and never a framework adapter.
"""
