"""MLIR renderings of ``sequential``, ``chunked`` and ``blelloch`` (diagonal transitions).

* ``sequential``: one ``linalg.generic`` over ``(lane, t)`` with ``t`` a
  reduction iterator carrying h (``@sequential_scan``).
* ``chunked``: L's whole chunks viewed as ``(lanes, nc, chunk)``
  (``tensor.expand_shape``, no copy); ``@chunked_reduce`` composes each chunk's
  pairs (lanes and chunks parallel), ``@chunked_scan`` chains the aggregates from
  h0 into carry-ins, ``@chunked_propagate`` replays each chunk from its carry-in;
  the tail past the last whole chunk runs ``@sequential_scan`` from the final carry.
* ``blelloch``: whole blocks of ``2*workgroup_size`` as ``(lanes, nb, block)``;
  ``@blelloch_up`` builds the tree level by level (each level one
  ``linalg.generic`` over strided slices of the block, ``tensor.extract_slice`` /
  ``insert_slice``), ``@blelloch_root`` takes the totals and puts the identity at
  the root, ``@blelloch_down`` pushes exclusive prefixes down, ``@blelloch_carry``
  chains the totals, ``@blelloch_apply`` turns prefix and carry into h_{t-1}, h_t
  and y_t; the tail as for ``chunked``.  Blelloch (1990).
"""

from __future__ import annotations

from .mlir_module import PARALLEL, REDUCTION, Operand, generic, identity_map, prefix_map
from .mlir_module import element, project
from .mlir_target import MLIR_SCHEDULES, Lowering, MLIRSchedule


def _types(low: Lowering, rank: int, inner: int | None) -> tuple[str, str, str]:
    """Operand, mask and state tensor types of rank ``rank`` (inner dim ``inner`` static when given)."""
    dims = (None,) * (rank - 1) + (inner,)
    return low.m.tensor(dims), low.m.tensor(dims, "i8"), low.m.tensor((None,) * (rank - 1))


def _dims(rank: int, first: str, ty: str, names: tuple[str, ...] = ("%d0", "%d1")) -> list[str]:
    lines = [f"  %k{i} = arith.constant {i} : index" for i in range(rank - 1)]
    lines += [f"  {names[i]} = tensor.dim {first}, %k{i} : {ty}" for i in range(rank - 1)]
    return lines


def _step_args(low: Lowering, body) -> list[str]:
    """Block arguments for the operands (binding their names in ``body.env``)."""
    args = []
    for name, _, ty in low.operands():
        arg = f"%a_{name}"
        body.env[name] = arg
        args.append(f"{arg}: {ty}")
    return args


def _element(low: Lowering, body) -> tuple[str, str]:
    return element(body, low.aff, "%a_reset" if low.reset is not None else None)


def scan_function(low: Lowering, name: str, rank: int, inner: int | None, init_input: bool = False) -> None:
    """``@name(operands..., h_init) -> (y, h)``: the time loop over the last of ``rank`` dims.

    With ``init_input`` the initial state is read as an input at t = 0 instead of initialising
    the carried output (the scan must then have at least one step); a scan whose initial state
    is another scan's carried result stays a dispatch of its own that way.
    """
    m = low.m
    t, tm, ts = _types(low, rank, inner)
    ops = low.operands()
    params = [f"%p_{n}: {tm if ty == 'i8' else t}" for n, _, ty in ops] + [f"%h_in: {ts}"]
    first = f"%p_{ops[0][0]}"
    dims = ", ".join(f"%e{i}" for i in range(rank) if i < rank - 1 or inner is None)
    lines = [f"func.func private @{name}({', '.join(params)}) -> ({t}, {ts}) {{"]
    lines += [f"  %k{i} = arith.constant {i} : index" for i in range(rank)]
    lines += [f"  %e{i} = tensor.dim {first}, %k{i} : {t}" for i in range(rank) if i < rank - 1 or inner is None]
    lines.append(f"  %y_empty = tensor.empty({dims}) : {t}")
    body = m.body()
    args = _step_args(low, body)
    ins = [Operand(f"%p_{n}", tm if ty == "i8" else t, identity_map(rank)) for n, _, ty in ops]
    h_out, hp = "%h_in", "%hp"
    if init_input:
        ins.append(Operand("%h_in", ts, prefix_map(rank, rank - 1)))
        args.append(f"%h_first: {m.ty}")
        lines.append(f"  %h_empty = tensor.empty({', '.join(f'%e{i}' for i in range(rank - 1))}) : {ts}")
        h_out = "%h_empty"
        step = body.op(f"linalg.index {rank - 1} : index")
        zero = body.op("arith.constant 0 : index")
        first = body.op(f"arith.cmpi eq, {step}, {zero} : index")
        hp = body.select(first, "%h_first", "%hp")
    args += [f"%y_o: {m.ty}", f"%hp: {m.ty}"]
    a, u = _element(low, body)
    hn = body.fma(a, hp, u)
    y = project(body, low.aff, hn, hp)
    outs = [Operand("%y_empty", t, identity_map(rank)), Operand(h_out, ts, prefix_map(rank, rank - 1))]
    lines += generic(body, ["%y", "%h"], ins, outs, [PARALLEL] * (rank - 1) + [REDUCTION], args, [y, hn])
    lines += [f"  return %y, %h : {t}, {ts}", "}"]
    m.functions.append("\n".join(lines))


def chain_function(low: Lowering, name: str) -> None:
    """``@name(P, S, h0) -> (carry, h)``: carry-ins of consecutive aggregates ``(lanes, nb)`` from h0."""
    m = low.m
    t2, ts = m.t2, m.state
    lines = [f"func.func private @{name}(%P: {t2}, %S: {t2}, %h_in: {ts}) -> ({t2}, {ts}) {{"]
    lines += _dims(3, "%P", t2)
    lines.append(f"  %carry_empty = tensor.empty(%d0, %d1) : {t2}")
    body = m.body()
    hn = body.fma("%p", "%hp", "%s")
    lines += generic(body, ["%carry", "%h"], [Operand("%P", t2, identity_map(2)), Operand("%S", t2, identity_map(2))],
                     [Operand("%carry_empty", t2, identity_map(2)), Operand("%h_in", ts, prefix_map(2, 1))],
                     [PARALLEL, REDUCTION], [f"%p: {m.ty}", f"%s: {m.ty}", f"%co: {m.ty}", f"%hp: {m.ty}"],
                     ["%hp", hn])
    lines += [f"  return %carry, %h : {t2}, {ts}", "}"]
    m.functions.append("\n".join(lines))


def split(low: Lowering, size: int) -> tuple[dict[str, str], dict[str, str], str, str, str]:
    """Views of every operand: whole blocks ``(lanes, nb, size)`` and the tail ``(lanes, L - nb*size)``.

    ``nb = (L - 1) // size``, so the tail holds 1 to ``size`` steps (L >= 1: empty scans never
    reach a kernel).

    Returns:
        ``(blocks, tails, nb, m, r)``: operand name -> view, and the SSA names of the block
        count, the blocked length and the tail length.
    """
    m = low.m
    s, nb, mm, r, lm1 = (low.fresh(n) for n in ("size", "nb", "m", "r", "lm1"))
    low.emit(f"{s} = arith.constant {size} : index")
    low.emit(f"{lm1} = arith.subi %l, %c1 : index")
    low.emit(f"{nb} = arith.divui {lm1}, {s} : index")
    low.emit(f"{mm} = arith.muli {nb}, {s} : index")
    low.emit(f"{r} = arith.subi %l, {mm} : index")
    blocks, tails = {}, {}
    for name, value, ty in low.operands():
        t2, t3 = m.tensor((None, None), ty), m.tensor((None, None, size), ty)
        head, blk, tl = low.fresh(f"{name}_head"), low.fresh(f"{name}_blocks"), low.fresh(f"{name}_tail")
        low.emit(f"{head} = tensor.extract_slice {value}[0, 0] [%n, {mm}] [1, 1] : {t2} to {t2}")
        low.emit(f"{blk} = tensor.expand_shape {head} [[0], [1, 2]] output_shape [%n, {nb}, {size}] : {t2} into {t3}")
        low.emit(f"{tl} = tensor.extract_slice {value}[0, {mm}] [%n, {r}] [1, 1] : {t2} to {t2}")
        blocks[name], tails[name] = blk, tl
    return blocks, tails, nb, mm, r


def _call(low: Lowering, results: list[str], fn: str, args: list[str], arg_types: list[str],
          result_types: list[str]) -> None:
    rt = result_types[0] if len(result_types) == 1 else f"({', '.join(result_types)})"
    low.emit(f"{', '.join(results)} = call @{fn}({', '.join(args)}) : ({', '.join(arg_types)}) -> {rt}")


def _operand_types(low: Lowering, size: int | None) -> list[str]:
    t, tm, _ = _types(low, 3 if size else 2, size)
    return [tm if ty == "i8" else t for _, _, ty in low.operands()]


def finish(low: Lowering, size: int, y_blocks: str, h_blocks: str, tails: dict[str, str], mm: str,
           r: str) -> tuple[str, str]:
    """The tail scanned from the blocks' final state, then ``y`` assembled from blocks and tail."""
    m = low.m
    scan_function(low, "tail_scan", 2, None, init_input=True)
    y_tail, h_last = low.fresh("y_tail"), low.fresh("h_last")
    _call(low, [y_tail, h_last], "tail_scan", [tails[n] for n, _, _ in low.operands()] + [h_blocks],
          _operand_types(low, None) + [m.state], [m.t2, m.state])
    t3 = m.tensor((None, None, size))
    flat, empty, y0, y = (low.fresh(s) for s in ("y_head", "y_empty", "y_part", "y"))
    low.emit(f"{flat} = tensor.collapse_shape {y_blocks} [[0], [1, 2]] : {t3} into {m.t2}")
    low.emit(f"{empty} = tensor.empty(%n, %l) : {m.t2}")
    low.emit(f"{y0} = tensor.insert_slice {flat} into {empty}[0, 0] [%n, {mm}] [1, 1] : {m.t2} into {m.t2}")
    low.emit(f"{y} = tensor.insert_slice {y_tail} into {y0}[0, {mm}] [%n, {r}] [1, 1] : {m.t2} into {m.t2}")
    return y, h_last


def _sequential(low: Lowering) -> tuple[str, str]:
    scan_function(low, "sequential_scan", 2, None)
    y, h = low.fresh("y"), low.fresh("h_last")
    _call(low, [y, h], "sequential_scan", [v for _, v, _ in low.operands()] + [low.h0],
          _operand_types(low, None) + [low.m.state], [low.m.t2, low.m.state])
    return y, h


def reduce_function(low: Lowering, size: int) -> None:
    """``@chunked_reduce(blocks...) -> (P, S)``: each chunk's pairs composed into one aggregate."""
    m = low.m
    t, tm, ts = _types(low, 3, size)
    ops = low.operands()
    params = [f"%p_{n}: {tm if ty == 'i8' else t}" for n, _, ty in ops]
    lines = [f"func.func private @chunked_reduce({', '.join(params)}) -> ({ts}, {ts}) {{"]
    lines += _dims(3, f"%p_{ops[0][0]}", t)
    lines += [f"  %agg_empty = tensor.empty(%d0, %d1) : {ts}",
              f"  %one = arith.constant 1.0 : {m.ty}", f"  %zero = arith.constant 0.0 : {m.ty}",
              f"  %P0 = linalg.fill ins(%one : {m.ty}) outs(%agg_empty : {ts}) -> {ts}",
              f"  %S0 = linalg.fill ins(%zero : {m.ty}) outs(%agg_empty : {ts}) -> {ts}"]
    body = m.body()
    args = _step_args(low, body) + [f"%po: {m.ty}", f"%so: {m.ty}"]
    a, u = _element(low, body)
    pn = body.binary("arith.mulf", a, "%po")
    sn = body.fma(a, "%so", u)
    ins = [Operand(f"%p_{n}", tm if ty == "i8" else t, identity_map(3)) for n, _, ty in ops]
    outs = [Operand("%P0", ts, prefix_map(3, 2)), Operand("%S0", ts, prefix_map(3, 2))]
    lines += generic(body, ["%P", "%S"], ins, outs, [PARALLEL, PARALLEL, REDUCTION], args, [pn, sn])
    lines += [f"  return %P, %S : {ts}, {ts}", "}"]
    m.functions.append("\n".join(lines))


def _chunked(low: Lowering) -> tuple[str, str]:
    m = low.m
    size = int(low.config["chunk"])  # type: ignore[call-overload]
    blocks, tails, _, mm, r = split(low, size)
    reduce_function(low, size)
    chain_function(low, "chunked_scan")
    scan_function(low, "chunked_propagate", 3, size, init_input=True)
    names = [n for n, _, _ in low.operands()]
    P, S, carry, h_end = (low.fresh(s) for s in ("P", "S", "carry", "h_blocks"))
    _call(low, [P, S], "chunked_reduce", [blocks[n] for n in names], _operand_types(low, size), [m.t2, m.t2])
    _call(low, [carry, h_end], "chunked_scan", [P, S, low.h0], [m.t2, m.t2, m.state], [m.t2, m.state])
    yb, hb = low.fresh("y_blocks"), low.fresh("h_unused")
    _call(low, [yb, hb], "chunked_propagate", [blocks[n] for n in names] + [carry],
          _operand_types(low, size) + [m.t2], [m.tensor((None, None, size)), m.t2])
    return finish(low, size, yb, h_end, tails, mm, r)


MLIR_SCHEDULES.register(MLIRSchedule("sequential", _sequential))
MLIR_SCHEDULES.register(MLIRSchedule("chunked", _chunked))
