"""The MLIR rendering of ``blelloch``: up-sweep, root, down-sweep over blocks of ``2*workgroup_size``.

Whole blocks are viewed as ``(lanes, nb, block)``.  ``@blelloch_up`` computes
the pairs (A_t, U_t) and builds the tree: level ``d`` views each block as
``(block / 2d, 2d)`` (``tensor.expand_shape``) and composes the right child
(column ``2d-1``) after the left (column ``d-1``), one ``linalg.generic`` over
those strided slices.  ``@blelloch_root`` takes the block totals and puts the
identity (1, 0) at the root; ``@blelloch_down`` pushes exclusive prefixes down
(left := parent, right := left o parent); ``@blelloch_carry`` chains the totals
from h0; ``@blelloch_apply`` gives h_{t-1} = prefix(carry) and h_t, y_t.  The
steps past the last whole block run ``@tail_scan`` from the final carry, as in
``chunked``.  Blelloch (1990), "Prefix sums and their applications".
"""

from __future__ import annotations

from .mlir_module import PARALLEL, Operand, generic, identity_map, prefix_map, project
from .mlir_schedules import _call, _element, _operand_types, _step_args, _types, chain_function, finish, split
from .mlir_target import MLIR_SCHEDULES, Lowering, MLIRSchedule


def _compose(low: Lowering, lines: list[str], tag: str, later: tuple[str, str], earlier: tuple[str, str],
             t: str) -> tuple[str, str]:
    """``later o earlier`` of two pair tensors of type ``t``, elementwise: (A2*A1, A2*U1 + U2)."""
    m = low.m
    rank = t.count("x")
    body = m.body()
    a = body.binary("arith.mulf", "%l_a", "%e_a")
    u = body.fma("%l_a", "%e_u", "%l_u")
    lines.append(f"  %{tag}_empty = tensor.empty(%d0, %d1) : {t}")
    ops = [Operand(v, t, identity_map(rank)) for v in (*later, *earlier)]
    outs = [Operand(f"%{tag}_empty", t, identity_map(rank))] * 2
    lines += generic(body, [f"%{tag}_a", f"%{tag}_u"], ops, outs, [PARALLEL] * rank,
                     [f"%l_a: {m.ty}", f"%l_u: {m.ty}", f"%e_a: {m.ty}", f"%e_u: {m.ty}", f"%o_a: {m.ty}",
                      f"%o_u: {m.ty}"], [a, u])
    return f"%{tag}_a", f"%{tag}_u"


def _level(low: Lowering, lines: list[str], pa: str, pu: str, d: int, block: int, down: bool) -> tuple[str, str]:
    """One tree level: the pairs at columns ``d-1`` (left) and ``2d-1`` (right) of every ``2d`` of a block."""
    m = low.m
    g = block // (2 * d)
    t3, t4, ts = m.tensor((None, None, block)), m.tensor((None, None, g, 2 * d)), m.tensor((None, None, g))
    tag = f"{'dn' if down else 'up'}{d}"
    cols = {"l": d - 1, "r": 2 * d - 1}
    views = {}
    for part, v in (("a", pa), ("u", pu)):
        lines.append(f"  %{tag}_{part}4 = tensor.expand_shape {v} [[0], [1], [2, 3]] output_shape "
                     f"[%d0, %d1, {g}, {2 * d}] : {t3} into {t4}")
        for side, col in cols.items():
            lines.append(f"  %{tag}_{part}{side} = tensor.extract_slice %{tag}_{part}4[0, 0, 0, {col}] "
                         f"[%d0, %d1, {g}, 1] [1, 1, 1, 1] : {t4} to {ts}")
            views[part + side] = f"%{tag}_{part}{side}"
    left, right = (views["al"], views["ul"]), (views["ar"], views["ur"])
    if down:  # left takes the parent's prefix, right the left subtree after the prefix
        new = {"l": right, "r": _compose(low, lines, f"{tag}c", left, right, ts)}
    else:
        new = {"r": _compose(low, lines, f"{tag}c", right, left, ts)}
    out = []
    for i, part in enumerate(("a", "u")):
        cur = f"%{tag}_{part}4"
        for side, pair in new.items():
            nxt = f"%{tag}_{part}{side}4n"
            lines.append(f"  {nxt} = tensor.insert_slice {pair[i]} into {cur}[0, 0, 0, {cols[side]}] "
                         f"[%d0, %d1, {g}, 1] [1, 1, 1, 1] : {ts} into {t4}")
            cur = nxt
        lines.append(f"  %{tag}_{part}3 = tensor.collapse_shape {cur} [[0], [1], [2, 3]] : {t4} into {t3}")
        out.append(f"%{tag}_{part}3")
    return out[0], out[1]


def _header(name: str, params: list[str], results: list[str], first: str, t: str) -> list[str]:
    return [f"func.func private @{name}({', '.join(params)}) -> ({', '.join(results)}) {{",
            "  %k0 = arith.constant 0 : index", "  %k1 = arith.constant 1 : index",
            f"  %d0 = tensor.dim {first}, %k0 : {t}", f"  %d1 = tensor.dim {first}, %k1 : {t}"]


def up_function(low: Lowering, block: int) -> None:
    """``@blelloch_up(blocks...) -> (A, U)``: the pairs, then the up-sweep (block aggregates at the root)."""
    m = low.m
    t, tm, _ = _types(low, 3, block)
    ops = low.operands()
    params = [f"%p_{n}: {tm if ty == 'i8' else t}" for n, _, ty in ops]
    lines = _header("blelloch_up", params, [t, t], f"%p_{ops[0][0]}", t)
    lines.append(f"  %pair_empty = tensor.empty(%d0, %d1) : {t}")
    body = m.body()
    args = _step_args(low, body) + [f"%o_a: {m.ty}", f"%o_u: {m.ty}"]
    a, u = _element(low, body)
    ins = [Operand(f"%p_{n}", tm if ty == "i8" else t, identity_map(3)) for n, _, ty in ops]
    lines += generic(body, ["%ea", "%eu"], ins, [Operand("%pair_empty", t, identity_map(3))] * 2,
                     [PARALLEL] * 3, args, [a, u])
    pa, pu, d = "%ea", "%eu", 1
    while d < block:
        pa, pu = _level(low, lines, pa, pu, d, block, down=False)
        d *= 2
    lines += [f"  return {pa}, {pu} : {t}, {t}", "}"]
    m.functions.append("\n".join(lines))


def root_function(low: Lowering, block: int) -> None:
    """``@blelloch_root(A, U) -> (totals A, totals U, A, U)``: block totals out, the identity in at the root."""
    m = low.m
    t, ts = m.tensor((None, None, block)), m.t2
    lines = _header("blelloch_root", [f"%pa: {t}", f"%pu: {t}"], [ts, ts, t, t], "%pa", t)
    lines += [f"  %ta = tensor.extract_slice %pa[0, 0, {block - 1}] [%d0, %d1, 1] [1, 1, 1] : {t} to {ts}",
              f"  %tu = tensor.extract_slice %pu[0, 0, {block - 1}] [%d0, %d1, 1] [1, 1, 1] : {t} to {ts}",
              f"  %id_empty = tensor.empty(%d0, %d1) : {ts}",
              f"  %one = arith.constant 1.0 : {m.ty}", f"  %zero = arith.constant 0.0 : {m.ty}",
              f"  %ones = linalg.fill ins(%one : {m.ty}) outs(%id_empty : {ts}) -> {ts}",
              f"  %zeros = linalg.fill ins(%zero : {m.ty}) outs(%id_empty : {ts}) -> {ts}",
              f"  %ra = tensor.insert_slice %ones into %pa[0, 0, {block - 1}] [%d0, %d1, 1] [1, 1, 1] : {ts} into {t}",
              f"  %ru = tensor.insert_slice %zeros into %pu[0, 0, {block - 1}] [%d0, %d1, 1] [1, 1, 1] : {ts} into {t}",
              f"  return %ta, %tu, %ra, %ru : {ts}, {ts}, {t}, {t}", "}"]
    m.functions.append("\n".join(lines))


def down_function(low: Lowering, block: int) -> None:
    """``@blelloch_down(A, U) -> (A, U)``: exclusive prefixes of every element of a block."""
    m = low.m
    t = m.tensor((None, None, block))
    lines = _header("blelloch_down", [f"%pa: {t}", f"%pu: {t}"], [t, t], "%pa", t)
    pa, pu, d = "%pa", "%pu", block // 2
    while d >= 1:
        pa, pu = _level(low, lines, pa, pu, d, block, down=True)
        d //= 2
    lines += [f"  return {pa}, {pu} : {t}, {t}", "}"]
    m.functions.append("\n".join(lines))


def apply_function(low: Lowering, block: int) -> None:
    """``@blelloch_apply(blocks..., A, U, carry) -> y``: h_{t-1} = prefix applied to the carry-in, h_t, y_t."""
    m = low.m
    t, tm, _ = _types(low, 3, block)
    ops = low.operands()
    params = [f"%p_{n}: {tm if ty == 'i8' else t}" for n, _, ty in ops] + [f"%pa: {t}", f"%pu: {t}",
                                                                             f"%carry: {m.t2}"]
    lines = _header("blelloch_apply", params, [t], f"%p_{ops[0][0]}", t)
    lines.append(f"  %y_empty = tensor.empty(%d0, %d1) : {t}")
    body = m.body()
    args = _step_args(low, body) + [f"%x_a: {m.ty}", f"%x_u: {m.ty}", f"%cin: {m.ty}", f"%y_o: {m.ty}"]
    hp = body.fma("%x_a", "%cin", "%x_u")
    a, u = _element(low, body)
    h = body.fma(a, hp, u)
    y = project(body, low.aff, h, hp)
    ins = [Operand(f"%p_{n}", tm if ty == "i8" else t, identity_map(3)) for n, _, ty in ops]
    ins += [Operand("%pa", t, identity_map(3)), Operand("%pu", t, identity_map(3)),
            Operand("%carry", m.t2, prefix_map(3, 2))]
    lines += generic(body, ["%y"], ins, [Operand("%y_empty", t, identity_map(3))], [PARALLEL] * 3, args, [y])
    lines += [f"  return %y : {t}", "}"]
    m.functions.append("\n".join(lines))


def _blelloch(low: Lowering) -> tuple[str, str]:
    m = low.m
    block = 2 * int(low.config["workgroup_size"])  # type: ignore[call-overload]
    blocks, tails, _, mm, r = split(low, block)
    for make in (up_function, root_function, down_function, apply_function):
        make(low, block)
    chain_function(low, "blelloch_carry")
    t3 = m.tensor((None, None, block))
    names = [n for n, _, _ in low.operands()]
    ua, uu, ta, tu, ra, ru, da, du, carry, h_end, yb = (low.fresh(s) for s in (
        "up_a", "up_u", "tot_a", "tot_u", "root_a", "root_u", "pre_a", "pre_u", "carry", "h_blocks", "y_blocks"))
    _call(low, [ua, uu], "blelloch_up", [blocks[n] for n in names], _operand_types(low, block), [t3, t3])
    _call(low, [ta, tu, ra, ru], "blelloch_root", [ua, uu], [t3, t3], [m.t2, m.t2, t3, t3])
    _call(low, [da, du], "blelloch_down", [ra, ru], [t3, t3], [t3, t3])
    _call(low, [carry, h_end], "blelloch_carry", [ta, tu, low.h0], [m.t2, m.t2, m.state], [m.t2, m.state])
    _call(low, [yb], "blelloch_apply", [blocks[n] for n in names] + [da, du, carry],
          _operand_types(low, block) + [t3, t3, m.t2], [t3])
    return finish(low, block, yb, h_end, tails, mm, r)


MLIR_SCHEDULES.register(MLIRSchedule("blelloch", _blelloch))
