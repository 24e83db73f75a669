"""Stage ``matrix_scan``: a recurrence over a matrix state, classified (the IR of ``state_shape=(K, V)`` steps).

The front end (:mod:`scanweaver.frontend.matrix`) proves a step affine in its
matrix state ``S`` and records its structure here::

    S_t = T_t(S_{t-1}) + U_t          y_t = R_t(S_t or S_{t-1})

* ``transition``: ``identity``, ``scalar`` (a factor per step), ``diagonal on rows`` /
  ``diagonal on columns`` (a vector broadcast over the other axis), ``elementwise``
  (a full matrix of factors), ``dense on rows`` / ``dense on columns`` (a matrix
  product), ``diagonal plus low rank`` (DeltaNet's ``S - b k (k^T S)``).
* ``input``: ``outer product`` of a row and a column step vector, or ``general``.
* ``readout``: ``contraction on rows`` (``q @ S``) or ``on columns`` (``S @ c``), of the state
  ``after`` the update, ``before`` it, or before it plus a ``bonus`` outer product (RWKV-6).

:attr:`MatrixScanIR.lowering` says how it maps onto the fused ``matrix_state``
operation, or why it does not (:attr:`MatrixScanIR.unsupported`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MatrixScanIR:
    """A classified matrix-state recurrence.

    Attributes:
        name: the recurrence's name.
        inputs: the step's operand names.
        state_shape: the state's axis names ``(rows, columns)``.
        operand_axes: operand -> ``()`` (a scalar per step) or ``(axis,)`` (a vector over that axis).
        transition, transition_factor: the kind (see the module docstring) and the factor's text.
        input, input_factors: ``outer product`` and its (row, column) texts, or ``general``.
        readout_axis, readout_of, readout_vector, bonus: the contracted axis (``rows``/``columns``), the state
            read (``after``/``before``/``bonus``), the contracting vector's text and the bonus factor's text.
        lowering: the fused operation's arrays and features (``q``, ``k``, ``v``, ``g`` texts, ``decay``,
            ``readout``, ``transpose``; ``sign``: the gate whose signs are carried beside ``g = log|a|``),
            empty when unsupported.
        unsupported: why it does not map onto ``matrix_state`` (empty when it does).
    """

    name: str
    inputs: tuple[str, ...]
    state_shape: tuple[str, str]
    operand_axes: dict = field(default_factory=dict)
    transition: str = "identity"
    transition_factor: str = ""
    input: str = "outer product"
    input_factors: tuple[str, ...] = ()
    readout_axis: str = "rows"
    readout_of: str = "after"
    readout_vector: str = ""
    bonus: str = ""
    lowering: dict = field(default_factory=dict)
    unsupported: str = ""

    def text(self) -> dict[str, str]:
        """The printed stages: ``matrix_scan`` (the classified step) and ``matrix_state`` (its lowering)."""
        rows, cols = self.state_shape
        axes = ", ".join(f"{n}: {'scalar' if not a else a[0]}" for n, a in self.operand_axes.items())
        factor = f"  D_t = {self.transition_factor}" if self.transition_factor else ""
        inp = f"outer({', '.join(self.input_factors)})" if self.input == "outer product" else "general"
        read = f"contraction on {self.readout_axis} with {self.readout_vector} of S_{{t}}" \
            if self.readout_of == "after" else f"contraction on {self.readout_axis} with {self.readout_vector} " \
            f"of S_{{t-1}}" + (f" + bonus {self.bonus}" if self.bonus else "")
        scan = (f"matrix_scan @{self.name}({', '.join(self.inputs)}) state S: ({rows}, {cols})\n"
                f"  operands:   {axes}\n"
                f"  transition: {self.transition}{factor}\n"
                f"  input:      {inp}\n"
                f"  readout:    {read}")
        if self.unsupported:
            low = f"matrix_state: unsupported ({self.unsupported})"
        else:
            lw = self.lowering
            low = (f"matrix_state decay={lw['decay']} readout={lw['readout']}"
                   f"{' (state transposed)' if lw['transpose'] else ''}\n"
                   f"  q = {lw['q']}\n  k = {lw['k']}\n  v = {lw['v']}\n  g = {lw['g'] or '(none)'}"
                   + (f"\n  u = {lw['u']}" if lw.get("u") else "")
                   + (f"\n  signs of {lw['sign']} carried on q, k and the final state" if lw.get("sign") else ""))
        return {"matrix_scan": scan, "matrix_state": low}

    def __str__(self) -> str:
        return "\n\n".join(f"// ----- stage {k} -----\n{v}" for k, v in self.text().items())
