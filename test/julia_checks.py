"""Static checks of ScanWeaver.jl that need no Julia: ambiguities, local memory, device dtypes, validated
launches, boxed closures.

Julia cannot run on the machines that test this repository, so these checks
read the Julia source through ``fatou parse --to sexpr`` (JuliaSyntax's
s-expression form, from a real parser) and look for five classes of defect
that ``fatou lint`` cannot see. Each is deliberately simple; each docstring
says what it cannot see. ``test/test_julia_static.py`` runs them on the package
and on small planted defects.

Example:
    >>> from julia_checks import parse_julia
    >>> parse_julia("f(x::Int) = x")
    ['toplevel', ['function-=', ['call', 'f', ['::-i', 'x', 'Int']], 'x']]
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

Node = "str | Str | list"


class Str(str):
    """A string literal of the s-expression (an atom is a plain ``str``)."""


def parse_julia(text: str) -> list:
    """The s-expression tree of Julia source ``text`` (nested lists of atoms)."""
    exe = shutil.which("fatou")
    if exe is None:
        raise RuntimeError("julia_checks: fatou is not installed (pip install fatou)")
    proc = subprocess.run([exe, "parse", "--to", "sexpr", "--color", "never", "-"], input=text,
                          capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"julia_checks: fatou parse failed: {proc.stderr.strip()}")
    return _read_sexpr(proc.stdout)


def _read_sexpr(text: str) -> list:
    stack: list[list] = [[]]
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch == "(":
            stack.append([])
            i += 1
        elif ch == ")":
            done = stack.pop()
            stack[-1].append(done)
            i += 1
        elif ch == '"' or (ch == "'" and stack[-1] == ["char"]):  # a lone ' is postfix adjoint
            j = i + 1
            while text[j] != ch:
                j += 2 if text[j] == "\\" else 1
            raw = text[i + 1:j]
            stack[-1].append(Str(raw) if ch == '"' else "'" + raw + "'")
            i = j + 1
        else:
            j = i
            while j < n and not text[j].isspace() and text[j] not in "()":
                j += 1
            stack[-1].append(text[i:j])
            i = j
    (tree,) = stack[0]
    return tree


def head(node) -> str | None:
    """The head atom of a list node (``None`` for atoms)."""
    return node[0] if isinstance(node, list) and node and isinstance(node[0], str) else None


def walk(node):
    """Every node of the tree, depth first."""
    yield node
    if isinstance(node, list):
        for child in node[1:]:
            yield from walk(child)


def render(node) -> str:
    """A compact Julia-like rendering of a node, for messages."""
    if not isinstance(node, list):
        return str(node)
    h, args = node[0], [render(a) for a in node[1:]]
    if h in ("::-i",):
        return f"{args[0]}::{args[1]}"
    if h == "::-pre":
        return f"::{args[0]}"
    if h == "curly":
        return f"{args[0]}{{{', '.join(args[1:])}}}"
    if h in ("call", "call-,"):
        return f"{args[0]}({', '.join(args[1:])})"
    if h == "<:-pre":
        return f"<:{args[0]}"
    if h == "quote-:":
        return f":{args[0]}"
    if h == ".":
        return f"{args[0]}.{args[1].lstrip(':')}"
    if h == "...":
        return f"{args[0]}..."
    if h == "call-i" and len(args) == 3:
        return f"{args[0]} {args[1]} {args[2]}"
    if h == "in":
        return f"{args[0]} in {args[1]}"
    if h == "iteration":
        return ", ".join(args)
    return f"({h} {' '.join(args)})"


# --- (a) method ambiguities ---------------------------------------------------------------------

#: Supertypes of the types ScanWeaver's methods dispatch on (Base, StaticArrays, KernelAbstractions,
#: the GPU packages). Types the package defines itself are added from its ``struct``/``abstract`` lines.
KNOWN_SUPERTYPES = {
    "Any": None, "Number": "Any", "Real": "Number", "AbstractFloat": "Real", "Float16": "AbstractFloat",
    "Float32": "AbstractFloat", "Float64": "AbstractFloat", "BFloat16": "AbstractFloat", "Integer": "Real",
    "Signed": "Integer", "Unsigned": "Integer", "Int": "Signed", "Int64": "Signed", "Int32": "Signed",
    "UInt": "Unsigned", "UInt8": "Unsigned", "Bool": "Integer", "Complex": "Number", "Nothing": "Any",
    "Symbol": "Any", "AbstractString": "Any", "String": "AbstractString", "Function": "Any", "Type": "Any",
    "DataType": "Any", "Val": "Any", "Tuple": "Any", "NamedTuple": "Any", "AbstractArray": "Any",
    "DenseArray": "AbstractArray", "Array": "DenseArray", "BitArray": "AbstractArray",
    "StaticArray": "AbstractArray", "SArray": "StaticArray", "MArray": "StaticArray",
    "Backend": "Any", "CPU": "Backend", "GPU": "Backend", "CUDABackend": "GPU", "ROCBackend": "GPU",
    "oneAPIBackend": "GPU", "MetalBackend": "GPU", "Kernel": "Any", "AbstractZero": "Any",
}

#: Aliases: name -> (head it stands for, how many leading parameters it fixes are irrelevant here).
ALIASES = {
    "AbstractVector": "AbstractArray", "AbstractMatrix": "AbstractArray", "Vector": "Array",
    "Matrix": "Array", "BitMatrix": "BitArray", "BitVector": "BitArray", "StaticVector": "StaticArray",
    "StaticMatrix": "StaticArray", "SVector": "SArray", "SMatrix": "SArray", "Dims": "Tuple", "NTuple": "Tuple",
    "ComplexF16": "Complex", "ComplexF32": "Complex", "ComplexF64": "Complex",
}

#: Distinct alias spellings of one head that are disjoint (a vector is never a matrix).
DISJOINT_ALIASES = [{"StaticVector", "StaticMatrix", "SVector", "SMatrix"},
                    {"AbstractVector", "AbstractMatrix", "Vector", "Matrix", "BitVector", "BitMatrix"}]


@dataclass(frozen=True)
class JType:
    """A dispatch type: ``kind`` is ``name`` (with ``params``), ``var`` (a wildcard bounded by ``bound``),
    ``lit`` (a literal parameter such as ``:cpu``), ``union``, or ``vararg`` (a trailing ``x...`` of
    element type ``bound``)."""

    kind: str
    name: str = ""
    params: tuple = ()
    bound: JType | None = None


ANY = JType("name", "Any")


@dataclass
class Method:
    """One method definition: its function's name, its positional argument types, where it is."""

    name: str
    args: tuple[JType, ...]
    source: str
    text: str


def _fname(node) -> str | None:
    if isinstance(node, str):
        return node
    h = head(node)
    if h == ".":
        left, right = _fname(node[1]), node[2]
        right = right[1] if head(right) == "quote-:" else _fname(right)
        return f"{left}.{right}" if left and right else None
    if h in ("::-i", "::-pre"):
        return f"(::{render(node[-1])})"
    return None


def _typevars(where_clauses: list, env: dict) -> dict:
    env = dict(env)
    for clause in where_clauses:
        items = clause[1:] if head(clause) == "braces" else [clause]
        for item in items:
            if isinstance(item, str):
                env[item] = JType("var", item, bound=ANY)
            elif head(item) == "<:":
                env[item[1]] = JType("var", item[1], bound=to_type(item[2], env))
    return env


def to_type(node, env: dict) -> JType:
    """The :class:`JType` of a type expression, with type variables from ``env``."""
    if isinstance(node, Str) or (isinstance(node, str) and node[:1].isdigit()):
        return JType("lit", str(node))
    if isinstance(node, str):
        name = node.split(".")[-1]
        return env.get(name, JType("name", name))
    h = head(node)
    if h == "quote-:":
        return JType("lit", ":" + str(node[1]))
    if h == ".":
        return JType("name", _fname(node).split(".")[-1])
    if h == "<:-pre":
        return JType("var", "_", bound=to_type(node[1], env))
    if h == "where":
        return to_type(node[1], _typevars(node[2:], env))
    if h == "curly":
        base = to_type(node[1], env)
        params = tuple(to_type(p, env) for p in node[2:])
        if base.name == "Union":
            return JType("union", params=params)
        return JType("name", base.name, params)
    return JType("lit", render(node))


def _arguments(call: list, env: dict) -> list[list[JType]] | None:
    """Positional argument types of a call signature, one list per arity (optional arguments).

    A trailing vararg ``I...`` becomes a last position of kind ``vararg`` (its element type in
    ``bound``), so vararg methods are compared with vararg methods of as many fixed arguments."""
    required, optional = [], []
    for arg in call[2:]:
        h = head(arg)
        if h == "parameters":
            continue
        if h == "...":
            required.append(JType("vararg", bound=_arg_type(arg[1], env)))
            continue
        if h == "=":
            optional.append(_arg_type(arg[1], env))
            continue
        required.append(_arg_type(arg, env))
    return [required + optional[:k] for k in range(len(optional) + 1)]


def _arg_type(arg, env: dict) -> JType:
    if isinstance(arg, str):
        return ANY
    h = head(arg)
    if h == "::-i":
        return to_type(arg[2], env)
    if h == "::-pre":
        return to_type(arg[1], env)
    if h == "where":
        return _arg_type(arg[1], _typevars(arg[2:], env))
    return ANY  # @Const(x) and the like: untyped


def methods_of(tree: list, source: str) -> tuple[list[Method], dict[str, str]]:
    """Method definitions (outside ``@kernel``) and the package's own ``struct``/``abstract`` supertypes."""
    found: list[Method] = []
    supers: dict[str, str] = {}

    def visit(node):
        h = head(node)
        if h is None:
            return
        if h == "macrocall" and node[1] == "@kernel":
            return
        if h in ("struct", "struct-mut", "abstract"):
            decl = node[1]
            name, sup = (decl[1], render(decl[2]).split("{")[0]) if head(decl) == "<:" else (decl, "Any")
            supers[render(name).split("{")[0]] = sup.split(".")[-1]
            return
        if h in ("function", "function-=") and len(node) > 1 and isinstance(node[1], list):
            sig, env = node[1], {}
            while head(sig) in ("where", "::-i") and head(sig) != "call":
                if head(sig) == "where":
                    env = _typevars(sig[2:], env)
                sig = sig[1]
            if head(sig) in ("call", "call-,"):
                name = _fname(sig[1])
                arities = _arguments(sig, env)
                if name and arities is not None:
                    name = name.removeprefix("ScanWeaver.")
                    found.extend(Method(name, tuple(a), source, render(sig)) for a in arities)
            return
        for child in node[1:]:
            visit(child)

    visit(tree)
    return found, supers


class Lattice:
    """Subtype questions over :data:`KNOWN_SUPERTYPES` plus the package's own types."""

    def __init__(self, own: dict[str, str]):
        self.parent = {**KNOWN_SUPERTYPES, **own}

    def canonical(self, name: str) -> str:
        return ALIASES.get(name, name)

    def ancestors(self, name: str) -> list[str] | None:
        chain, cur = [], self.canonical(name)
        while cur is not None:
            if cur not in self.parent:
                return None
            chain.append(cur)
            cur = self.parent[cur]
        return chain

    def relation(self, a: JType, b: JType) -> str:
        """``eq``, ``sub`` (a strictly below b), ``super``, ``disjoint`` or ``unknown``."""
        if a == b:
            return "eq"
        if a.kind == "vararg" or b.kind == "vararg":
            return self.relation(a.bound, b.bound) if a.kind == b.kind else "disjoint"
        if a.kind == "union" or b.kind == "union":
            return self._union(a, b)
        if a.kind == "var" and b.kind == "lit":
            return "super" if a.bound == ANY else "unknown"
        if a.kind == "lit" and b.kind == "var":
            return "sub" if b.bound == ANY else "unknown"
        if a.kind == "var" or b.kind == "var":
            ab, bb = (a.bound if a.kind == "var" else a), (b.bound if b.kind == "var" else b)
            rel = self.relation(ab, bb)
            return "eq" if rel == "eq" and a.kind == b.kind == "var" else rel
        if a.kind == "lit" or b.kind == "lit":
            return "disjoint" if a.kind == b.kind == "lit" else "unknown"
        return self._named(a, b)

    def _union(self, a: JType, b: JType) -> str:
        if a.kind == "union":
            rels = {self.relation(m, b) for m in a.params}
            if rels == {"disjoint"}:
                return "disjoint"
            return "sub" if rels <= {"sub", "eq"} else "unknown"
        flipped = self._union(b, a)
        return {"sub": "super", "super": "sub"}.get(flipped, flipped)

    def _named(self, a: JType, b: JType) -> str:
        for group in DISJOINT_ALIASES:
            if a.name != b.name and a.name in group and b.name in group:
                return "disjoint"
        up_a, up_b = self.ancestors(a.name), self.ancestors(b.name)
        if up_a is None or up_b is None:
            return "unknown"
        ca, cb = self.canonical(a.name), self.canonical(b.name)
        if ca == cb:
            return self._params(a, b)
        if cb in up_a:
            return "sub" if all(p.kind == "var" for p in b.params) else "unknown"
        if ca in up_b:
            return "super" if all(p.kind == "var" for p in a.params) else "unknown"
        return "disjoint"

    def _params(self, a: JType, b: JType) -> str:
        if a.name != b.name:
            return "unknown"
        if not a.params or not b.params:
            if a.params == b.params:
                return "eq"
            wild = a.params if a.params else b.params
            if all(p.kind == "var" and p.bound == ANY for p in wild):
                return "eq"
            return "super" if not a.params else "sub"
        result = "eq"
        for p, q in itertools.zip_longest(a.params, b.params, fillvalue=JType("var", "_", bound=ANY)):
            rel = self.relation(p, q)
            if p.kind != "var" and q.kind != "var" and rel in ("sub", "super"):
                rel = "disjoint"  # invariant parameters
            if rel in ("disjoint", "unknown"):
                return rel
            if rel != "eq":
                if result not in ("eq", rel):
                    return "unknown"
                result = rel
        return result


@dataclass
class Ambiguity:
    """Two methods of one function, each more specific than the other in some argument."""

    first: Method
    second: Method

    def __str__(self) -> str:
        return f"{self.first.source}: {self.first.text}  vs  {self.second.source}: {self.second.text}"


def find_ambiguities(sources: dict[str, str]) -> tuple[list[Ambiguity], int]:
    """Ambiguous method pairs among ``sources`` (name -> Julia text), and how many pairs were not decided.

    Two methods of one function and one arity are reported when no argument
    position tells them apart (none is disjoint), one is strictly more
    specific in some position and the other in another, and no third method
    of the function has exactly their intersection (which would resolve it, as
    in Julia). A vararg method is compared with vararg methods of as many
    fixed arguments only (a vararg position counts as one more argument).
    Cannot see: methods that macros generate (``@kernel`` bodies are
    skipped), methods of other packages' functions beyond those defined
    here (an ambiguity with a Base method), a vararg method against one of
    fixed arity that its varargs could match, diagonal
    constraints (``f(x::T, y::T) where T``), and types it does not know
    (:data:`KNOWN_SUPERTYPES`); pairs involving those are counted as undecided
    instead of reported.
    """
    methods: list[Method] = []
    own: dict[str, str] = {}
    for source, text in sources.items():
        found, supers = methods_of(parse_julia(text), source)
        methods += found
        own.update(supers)
    lattice = Lattice(own)
    by_key: dict[tuple, list[Method]] = {}
    for m in methods:
        by_key.setdefault((m.name, len(m.args)), []).append(m)
    found_pairs, undecided = [], 0
    for group in by_key.values():
        for m1, m2 in itertools.combinations(group, 2):
            rels = [lattice.relation(p, q) for p, q in zip(m1.args, m2.args, strict=True)]
            if "disjoint" in rels or all(r == "eq" for r in rels):
                continue
            if "unknown" in rels:
                undecided += 1
                continue
            if "sub" in rels and "super" in rels:
                meet = tuple(p if r in ("sub", "eq") else q for p, q, r in zip(m1.args, m2.args, rels, strict=True))
                resolved = any(all(lattice.relation(x, y) == "eq" for x, y in zip(m3.args, meet, strict=True))
                               for m3 in group if m3 is not m1 and m3 is not m2)
                if not resolved:
                    found_pairs.append(Ambiguity(m1, m2))
    return found_pairs, undecided


# --- (b) local memory ---------------------------------------------------------------------------

#: Tunable values and element sizes the local-memory formulas are compared at.
TUNABLE_GRID = {"workgroupsize": (1, 2, 7, 32, 128, 256, 1024), "workgroup_size": (1, 2, 7, 32, 128, 256, 1024),
                "items_per_thread": (1, 3, 8), "chunk": (64, 2048)}
SIZE_GRID = {"P": (4, 8, 16, 48, 96, 2176), "S": (4, 8, 24, 128)}


class NotStatic(Exception):
    """An expression names something other than tunables, element types and integers."""


def evaluate(node, names: dict[str, int]) -> int:
    """Integer value of a small arithmetic Julia expression over ``names`` (``sizeof(T)``,
    ``local_bytes(T, n)``, ``s.field``, ``+ - * ÷``, ``prod``, literals)."""
    if isinstance(node, str):
        if node.isdigit():
            return int(node)
        if node in names:
            return names[node]
        raise NotStatic(node)
    h = head(node)
    if h == "call-i":
        left, op, right = evaluate(node[1], names), node[2], [evaluate(r, names) for r in node[3:]]
        ops = {"*": lambda x, y: x * y, "+": lambda x, y: x + y, "-": lambda x, y: x - y,
               "÷": lambda x, y: x // y}
        if op not in ops:
            raise NotStatic(render(node))
        for r in right:
            left = ops[op](left, r)
        return left
    if h in ("call", "call-,"):
        fn, args = node[1], node[2:]
        if fn == "sizeof" and isinstance(args[0], str) and f"sizeof({args[0]})" in names:
            return names[f"sizeof({args[0]})"]
        if fn == "local_bytes":
            return evaluate(["call", "sizeof", args[0]], names) * evaluate(args[1], names)
        raise NotStatic(render(node))
    if h == ".":
        field = node[2][1] if head(node[2]) == "quote-:" else node[2]
        if field in names:
            return names[field]
        raise NotStatic(render(node))
    if h == "block":
        local = dict(names)
        for stmt in node[1:-1]:
            if head(stmt) != "=" or not isinstance(stmt[1], str):
                raise NotStatic(render(stmt))
            local[stmt[1]] = evaluate(stmt[2], local)
        return evaluate(node[-1], local)
    if h == "return":
        return evaluate(node[1], names)
    raise NotStatic(render(node))


def _kernel_allocations(tree: list) -> dict[str, tuple[tuple[str, ...], list]]:
    """``@kernel`` name -> (its ``Val`` tunables, its ``@localmem`` allocations as ``(T, dims)``)."""
    kernels = {}
    for node in walk(tree):
        if head(node) == "macrocall" and node[1] == "@kernel":
            sig = node[2][1]
            while head(sig) == "where":
                sig = sig[1]
            vals = tuple(a[1][2] for a in sig[2:] if head(a) == "::-pre" and head(a[1]) == "curly"
                         and a[1][1] == "Val")
            allocs = [(n[2], n[3]) for n in walk(node[2]) if head(n) == "macrocall" and n[1] == "@localmem"]
            kernels[sig[1]] = (vals, allocs)
    return kernels


def _declarations(tree: list) -> dict[str, list]:
    """Schedule name -> the body of its ``local_memory(schedule, ...)`` method.

    The schedule is the first argument's type: ``::Val{:name}`` or a schedule struct (lower-cased
    with underscores, ``ReduceThenScan`` -> ``reduce_then_scan``)."""
    found = {}
    for node in walk(tree):
        if head(node) in ("function", "function-=") and isinstance(node[1], list):
            sig = node[1]
            while head(sig) == "where":
                sig = sig[1]
            if head(sig) in ("call", "call-,") and sig[1] == "local_memory" and len(sig) > 2:
                first = sig[2]
                t = first[-1] if head(first) in ("::-i", "::-pre") else None
                if head(t) == "curly" and t[1] == "Val" and head(t[2]) == "quote-:":
                    found[t[2][1]] = node[2]
                elif isinstance(t, str):
                    found["".join("_" + c.lower() if c.isupper() else c for c in t).lstrip("_")] = node[2]
    return found


def check_local_memory(sources: dict[str, str], schedules: dict[str, tuple[str, ...]]) -> list[str]:
    """Every ``@localmem`` of every kernel is counted by its schedule's ``local_memory`` method.

    ``schedules`` maps each schedule to its kernels (``scanweaver.julia.kernels.SCHEDULES``). For each
    schedule whose kernels allocate local memory, the kernels' allocations (element type ``P`` or
    ``S`` times the product of dims written in the kernel's ``Val`` tunables) and the declared
    ``local_memory`` (``local_bytes``/``sizeof`` over the schedule's tunables) are evaluated on
    :data:`TUNABLE_GRID` x :data:`SIZE_GRID`; the declaration must never be smaller. Cannot see:
    local memory allocated outside ``@kernel`` bodies or through helper functions, element types
    other than the pair ``P`` and state ``S``, or whether ``check_config`` calls the declaration
    (a separate test looks for the call).
    """
    kernels, declared = {}, {}
    for text in sources.values():
        tree = parse_julia(text)
        kernels.update(_kernel_allocations(tree))
        declared.update(_declarations(tree))
    problems = []
    owner = {k: s for s, ks in schedules.items() for k in ks}
    for kname, (_, allocs) in kernels.items():
        if allocs and kname not in owner:
            problems.append(f"{kname}: allocates @localmem but belongs to no schedule")
    for schedule, knames in schedules.items():
        allocs = [(k, t, d) for k in knames if k in kernels for t, d in kernels[k][1]]
        if not allocs:
            continue
        if schedule not in declared:
            problems.append(f"schedule {schedule}: kernels allocate @localmem but no local_memory method counts it")
            continue
        problems += _compare(schedule, allocs, kernels, declared[schedule])
    return problems


def _compare(schedule: str, allocs: list, kernels: dict, body) -> list[str]:
    problems: list[str] = []
    tunables = sorted({v for k, _, _ in allocs for v in kernels[k][0]})
    for values in itertools.product(*(TUNABLE_GRID.get(t, (1, 4)) for t in tunables)):
        for sp, ss in itertools.product(SIZE_GRID["P"], SIZE_GRID["S"]):
            names = {**dict(zip(tunables, values, strict=True)), "sizeof(P)": sp, "sizeof(S)": ss}
            used = 0
            for kname, elt, dims in allocs:
                items = dims[1:] if head(dims) and head(dims).startswith("tuple") else [dims]
                try:
                    count = 1
                    for d in items:
                        count *= evaluate(d, names)
                    used += evaluate(["call", "sizeof", elt], names) * count
                except NotStatic as exc:
                    return [(f"{kname}: @localmem {render(elt)} {render(dims)} is not sized by the "
                             f"kernel's Val tunables and element types ({exc})")]
            try:
                budget = evaluate(body, names)
            except NotStatic as exc:
                return [f"schedule {schedule}: local_memory is not arithmetic over its tunables ({exc})"]
            if budget < used:
                return [(f"schedule {schedule}: local_memory declares {budget} bytes but its kernels "
                         f"allocate {used} at {names}")]
    return problems


# --- (c) device dtypes --------------------------------------------------------------------------

#: What each GPU package's KernelAbstractions backend answers to ``supports_float64``, read in
#: its source (KernelAbstractions' default is ``true``).
UPSTREAM_FLOAT64 = {
    "CPU": (True, "KernelAbstractions 0.9.41 src/KernelAbstractions.jl: supports_float64(::Backend) = true"),
    "CUDABackend": (True, "CUDA.jl 6.3 CUDACore/src/CUDAKernels.jl defines no supports_float64"),
    "ROCBackend": (True, "AMDGPU.jl 2.8 src/ROCKernels.jl defines no supports_float64"),
    "oneAPIBackend": (False, "oneAPI.jl 2.9.1 src/oneAPIKernels.jl: KA.supports_float64(::oneAPIBackend) = false"),
    "MetalBackend": (False, "Metal.jl 1.10.3 src/MetalKernels.jl: KA.supports_float64(::MetalBackend) = false"),
}

WIDE_DTYPES = {"float64", "complex128"}


def julia_device_backends(sources: dict[str, str]) -> dict[str, str]:
    """Device name -> the backend type its ``device_backend(::Val{:name}) = Backend()`` method returns."""
    found = {}
    for text in sources.values():
        for node in walk(parse_julia(text)):
            if head(node) == "function-=" and head(node[1]) == "call" and \
                    _fname(node[1][1]).removeprefix("ScanWeaver.") == "device_backend":
                arg = node[1][2]
                t = arg[-1] if head(arg) == "::-pre" else None
                if head(t) == "curly" and head(t[2]) == "quote-:" and head(node[2]) == "call":
                    found[t[2][1]] = node[2][1].split(".")[-1]
    return found


def julia_host_dtypes(sources: dict[str, str]) -> set[str]:
    """The keys of ScanWeaver.jl's ``HOST_ELTYPES`` (the dtypes the facade can hand over)."""
    for text in sources.values():
        for node in walk(parse_julia(text)):
            if head(node) == "const" and head(node[1]) == "=" and node[1][1] == "HOST_ELTYPES":
                return {item[1] for item in node[1][2][1:] if head(item) == "="}
    return set()


def check_device_dtypes(table: dict[str, tuple[str, ...]], sources: dict[str, str]) -> list[str]:
    """The Python device table (device -> dtypes) agrees with what ScanWeaver.jl will answer.

    For each device, Julia's ``device_backend`` method names a backend type; its dtypes are
    ``HOST_ELTYPES`` minus the 64-bit ones where :data:`UPSTREAM_FLOAT64` (read in the GPU
    packages' source) says the backend has no Float64. Cannot see: the GPU packages themselves
    (a release that changes its answer: ScanWeaver.jl's ``device_dtypes`` asks at run time, and the
    Python facade uses that answer once Julia runs) or device-dependent FP64 support.
    """
    backends, host = julia_device_backends(sources), julia_host_dtypes(sources)
    problems = []
    for device, dtypes in table.items():
        if device not in backends:
            problems.append(f"device {device}: no device_backend(::Val{{:{device}}}) method in the Julia source")
            continue
        backend = backends[device]
        if backend not in UPSTREAM_FLOAT64:
            problems.append(f"device {device}: backend {backend} has no known supports_float64 answer")
            continue
        wide, where = UPSTREAM_FLOAT64[backend]
        expected = host if wide else host - WIDE_DTYPES
        if set(dtypes) != expected:
            problems.append(f"device {device}: the Python table lists {sorted(dtypes)} but {backend} runs "
                            f"{sorted(expected)} ({where})")
    return problems


# --- (d) validated launches -----------------------------------------------------------------------

#: Functions that launch a schedule's kernels without checking the configuration themselves.
LAUNCHERS = ("launch!", "launch_mamba!")

#: Functions that refuse a configuration the kernels cannot run (a tunable below 1, a workgroup past
#: the device's limit, a ``:blelloch`` workgroup that is not a power of two, local memory over budget).
VALIDATORS = ("check_config", "config_problem", "check_mamba_chunks")


def _definitions(tree: list):
    """``(name, body)`` of every function definition of ``tree`` (a callable struct's method is
    named ``(::Type)``)."""
    for node in walk(tree):
        if head(node) in ("function", "function-=") and len(node) > 2 and isinstance(node[1], list):
            sig = node[1]
            while head(sig) in ("where", "::-i") and head(sig) != "call":
                sig = sig[1]
            if head(sig) in ("call", "call-,"):
                name = _fname(sig[1])
                if name:
                    yield name.removeprefix("ScanWeaver."), node[2]


def check_validated_launches(sources: dict[str, str]) -> list[str]:
    """Every entry point that launches a schedule checks the configuration first.

    A function that calls one of :data:`LAUNCHERS` (other than their own methods) must also call
    one of :data:`VALIDATORS`: the Kernel Tuner launchers (``hybrid_scan!(backend, wg)(...)``,
    ``mamba_scan!``) receive whatever configuration the search space holds, and a ``:blelloch``
    workgroup of 48 work-items scans wrongly without any error. Cannot see: whether the validator
    runs before the launch on every path, whether it is given the launched configuration, or
    validation done by a helper that the entry point calls under another name.
    """
    problems = []
    for source, text in sources.items():
        for name, body in _definitions(parse_julia(text)):
            if name in LAUNCHERS:
                continue
            calls = {n[1] for n in walk(body) if head(n) in ("call", "call-,") and isinstance(n[1], str)}
            launched = sorted(calls & set(LAUNCHERS))
            if launched and not calls & set(VALIDATORS):
                problems.append(f"{source}: {name} calls {', '.join(launched)} without "
                                f"{' / '.join(VALIDATORS)}")
    return problems


# --- (e) boxed closures -------------------------------------------------------------------------

_CLOSURES = ("->", "do")


def _is_name(atom) -> bool:
    return isinstance(atom, str) and not isinstance(atom, Str) and (atom[:1].isalpha() or atom[:1] == "_") \
        and atom.replace("_", "a").replace("!", "a").isalnum()


def _targets(lhs) -> list[str]:
    if _is_name(lhs):
        return [lhs]
    if head(lhs) == "tuple":
        return [n for part in lhs[1:] for n in _targets(part)]
    return []


def _assignments(node, counts: dict[str, int]) -> None:
    """Counts the places that assign each local of a kernel body (``x += 1`` counts twice: it reads
    and writes); closures' own bodies are skipped, their assignments are their own locals. A variable
    assigned once inside a loop body is a fresh binding each iteration and counts once."""
    if not isinstance(node, list) or head(node) in _CLOSURES:
        return
    h = head(node)
    if h in ("=", "op=") and len(node) > 2:
        for name in _targets(node[1]):
            counts[name] = counts.get(name, 0) + (2 if h == "op=" else 1)
    for child in node[1:]:
        _assignments(child, counts)


def _parameters(sig) -> list[str]:
    """The names a function's signature binds (positional, with a default, and keyword parameters)."""
    names = []
    for arg in sig[2:]:
        if head(arg) == "parameters":
            names += _parameters(["call", None, *arg[1:]])
        elif head(arg) == "=":
            names += _parameters(["call", None, arg[1]])
        elif head(arg) == "::-i":
            names += _targets(arg[1])
        else:
            names += _targets(arg)
    return names


def _captures(closure) -> set[str]:
    """Names a closure (``->`` or ``do``) reads that are not its parameters."""
    params = set(_targets(closure[1])) if len(closure) > 1 else set()
    return {n for n in walk(closure[2]) if _is_name(n)} - params if len(closure) > 2 else set()


def check_boxed_closures(sources: dict[str, str]) -> list[str]:
    """No ``@kernel`` body, item function or other function has a closure that captures a variable the body
    assigns more than once (a parameter counts as one assignment: a parameter reassigned in a loop is boxed).

    Julia keeps such a variable in a ``Core.Box`` (it may change after the closure is made), so
    every use of it is a dynamic call: on a CPU the kernel slows down many times, and GPU compilers
    reject the kernel (``InvalidIRError``). ``h = ntuple(n -> apply_pair(p[n], h[n]), Val(N))`` in
    a loop is the classic case; ``map(apply_pair, p, h)`` has no closure. Every function is read, since
    kernels inline the helpers they call (``G = ntuple(x -> s[x] + q[x] * d, Val(K))`` in a helper's loop
    that reassigns its parameter ``s`` made a kernel's state ``Any``). Cannot see: boxes the compiler adds
    for other reasons (a variable assigned in two
    branches of an ``if``, captured once: rare in kernels), or a loop written as recursion;
    ``test/runtests.jl`` checks the typed code of every kernel for ``Core.Box`` where Julia runs.
    """
    problems = []
    for source, text in sources.items():
        for kind, sig, body in _function_bodies(parse_julia(text)):
            counts: dict[str, int] = dict.fromkeys(_parameters(sig), 1)
            _assignments(body, counts)
            reassigned = {n for n, k in counts.items() if k > 1}
            for closure in (n for n in walk(body) if head(n) in _CLOSURES):
                boxed = sorted(_captures(closure) & reassigned)
                if boxed:
                    problems.append(f"{source}: {kind} {_fname(sig[1])}: the closure {render(closure)} captures "
                                    f"{', '.join(boxed)}, which its body assigns more than once (a Core.Box)")
    return problems


def _function_bodies(tree: list):
    """``(kind, signature, body)`` of every function: kind ``@kernel``, ``item function`` (named ``*_item!``:
    the body of a kernel whose wrapper only calls it, ``src/items.jl``) or ``function``."""
    kernels = {id(node[2]) for node in walk(tree)
               if head(node) == "macrocall" and node[1] == "@kernel" and head(node[2]) == "function"}
    for node in walk(tree):
        if head(node) != "function":
            continue
        fn, kind = node, "@kernel" if id(node) in kernels else "function"
        sig = fn[1]
        while head(sig) == "where":
            sig = sig[1]
        if head(sig) not in ("call", "call-,"):
            continue
        if kind == "function" and (_fname(sig[1]) or "").endswith("_item!"):
            kind = "item function"
        yield kind, sig, fn[2]


# --- (f) @synchronize in divergent control flow ---------------------------------------------------

#: ``@index`` kinds that differ between the work-items of one workgroup (``Group`` is the same for all).
_DIVERGENT_INDEX = ("Local", "Global")
#: Control flow whose first child decides whether (or how often) its body runs.
_BRANCHES = ("if", "elseif", "while", "&&", "||", "?")


def _is_synchronize(node) -> bool:
    return head(node) in ("macrocall", "macrocall-p") and node[1] == "@synchronize"


def _divergent_names(body) -> set[str]:
    """Locals of a kernel body that may differ between the work-items of a workgroup: assigned from a
    ``Local``/``Global`` ``@index``, or from an expression that reads such a local (to a fixed point),
    and the variables of loops over such ranges. ``@uniform`` assignments are the same for all."""
    def reads_divergent(expr, names) -> bool:
        for n in walk(expr):
            if head(n) in ("macrocall", "macrocall-p") and n[1] == "@index" and len(n) > 2 \
                    and n[2] in _DIVERGENT_INDEX:
                return True
            if isinstance(n, str) and n in names:
                return True
        return False

    def nodes(node):
        if isinstance(node, list) and not (head(node) in ("macrocall", "macrocall-p") and node[1] == "@uniform"):
            yield node
            for child in node[1:]:
                yield from nodes(child)

    names: set[str] = set()
    changed = True
    while changed:
        changed = False
        for node in nodes(body):
            if head(node) not in ("=", "op=", "in") or len(node) <= 2:  # assignments and loop variables
                continue
            targets, expr = _targets(node[1]), node[2]
            if reads_divergent(expr, names) and not set(targets) <= names:
                names |= set(targets)
                changed = True
    return names


def _reads_divergent(expr, divergent: set[str]) -> bool:
    """Whether ``expr`` reads a divergent local or a ``Local``/``Global`` ``@index``."""
    for x in walk(expr):
        if isinstance(x, str) and x in divergent:
            return True
        if head(x) in ("macrocall", "macrocall-p") and x[1] == "@index" and len(x) > 2 and x[2] in _DIVERGENT_INDEX:
            return True
    return False


def _divergent_barriers(node, divergent: set[str], guards: tuple[str, ...] = ()) -> list[str]:
    """The guard (rendered) of every ``@synchronize`` under ``node`` that sits under divergent control flow."""
    if not isinstance(node, list):
        return []
    if _is_synchronize(node):
        return [guards[-1]] if guards else []
    h = head(node)
    if h in _BRANCHES and len(node) > 1:
        inner = (*guards, f"`{h} {render(node[1])}`") if _reads_divergent(node[1], divergent) else guards
        found = _divergent_barriers(node[1], divergent, guards)
        for child in node[2:]:
            found += _divergent_barriers(child, divergent, inner)
        return found
    if h == "for" and len(node) > 2:
        ranges = [r[2] for r in walk(node[1]) if head(r) == "in" and len(r) > 2]  # not the loop variables
        loops = any(_reads_divergent(r, divergent) for r in ranges)
        return _divergent_barriers(node[2], divergent, (*guards, f"`for {render(node[1])}`") if loops else guards)
    return [g for child in node[1:] for g in _divergent_barriers(child, divergent, guards)]


def check_synchronize(sources: dict[str, str]) -> list[str]:
    """No ``@synchronize`` of a ``@kernel`` sits where only some work-items of a workgroup reach it.

    A barrier must be reached by every work-item of the workgroup or by none: inside an ``if``, a
    ``while``, a ``&&``/``||`` or a ternary whose condition reads a divergent local (see
    :func:`_divergent_names`), or a ``for`` over a range that does, some work-items skip it or run it
    a different number of times. GPUs then hang or read stale local memory, and KernelAbstractions
    0.10's CPU backend (POCL) rejects or miscompiles such a kernel. Branches on uniform values
    (``@uniform`` locals, arguments, ``@index(Group, ...)``) are allowed. Cannot see: a ``return``
    before a barrier in a divergent branch, or divergence that enters through a function a kernel
    calls (e.g. a helper that reads ``@index``).
    """
    problems = []
    for source, text in sources.items():
        for node in walk(parse_julia(text)):
            if head(node) != "macrocall" or node[1] != "@kernel" or head(node[2]) != "function":
                continue
            sig = node[2][1]
            while head(sig) == "where":
                sig = sig[1]
            body = node[2][2]
            for guard in _divergent_barriers(body, _divergent_names(body)):
                problems.append(f"{source}: @kernel {_fname(sig[1])}: @synchronize under {guard}, which not "
                                "every work-item of a workgroup takes the same way")
    return problems


def read_sources(root: Path, folders: tuple[str, ...] = ("src", "ext")) -> dict[str, str]:
    """Relative path -> text of every ``.jl`` file under ``folders`` of ``root``."""
    return {p.relative_to(root).as_posix(): p.read_text() for f in folders for p in sorted((root / f).rglob("*.jl"))}


# --- (g) @index only as a statement's right-hand side ----------------------------------------------

def _is_index(node) -> bool:
    return head(node) in ("macrocall", "macrocall-p") and node[1] == "@index"


def check_index_statements(sources: dict[str, str]) -> list[str]:
    """Every ``@index`` of a ``@kernel`` is the whole right-hand side of a statement of the kernel's body
    (``w = @index(Global, Linear)``).

    KernelAbstractions' CPU backend (``split`` and ``emit_cpu`` in its ``src/macros.jl``) passes the
    work-item's index only to such statements; an ``@index`` anywhere else (``item!(@index(Global,
    Linear), args...)``, or inside an ``if`` or a loop) becomes a call without it, a ``MethodError`` at
    run time on the CPU, while GPUs run it. Cannot see: kernels split by ``@synchronize`` inside a
    scope construct, whose statements KernelAbstractions also reads (none here).
    """
    problems = []
    for source, text in sources.items():
        for node in walk(parse_julia(text)):
            if head(node) != "macrocall" or node[1] != "@kernel" or head(node[2]) != "function":
                continue
            sig = node[2][1]
            while head(sig) == "where":
                sig = sig[1]
            body = node[2][2]
            statements = body[1:] if head(body) == "block" else [body]
            allowed = {id(s[2]) for s in statements if head(s) == "=" and len(s) > 2 and _is_index(s[2])}
            for index in (n for n in walk(body) if _is_index(n) and id(n) not in allowed):
                problems.append(f"{source}: @kernel {_fname(sig[1])}: {render(index)} is not the right-hand side "
                                "of a statement of the kernel's body (KernelAbstractions' CPU backend does not "
                                "pass it the index)")
    return problems


# --- [compat] ----------------------------------------------------------------------------------

def _version(text: str) -> tuple[int, int, int]:
    parts = [int(p) for p in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))[:3]


def compat_admits(spec: str, version: str) -> bool:
    """Whether a Julia ``[compat]`` entry (caret ``"1.2"``, tilde ``"~1.2"`` or ``"=1.2.3"`` terms,
    comma-separated) admits ``version``, as Pkg's ``semver_spec`` reads it.

    Example:
        >>> compat_admits("0.9.1", "0.9.41"), compat_admits("0.9.1", "0.9.0"), compat_admits("5, 6", "6.3.0")
        (True, False, True)
    """
    v = _version(version)
    for term in (t.strip() for t in spec.split(",")):
        if term.startswith("="):
            if v == _version(term[1:]):
                return True
            continue
        tilde = term.startswith("~")
        text = term.lstrip("~^")
        n = len(text.split("."))
        low = _version(text)
        if tilde:
            upper = (low[0] + 1, 0, 0) if n == 1 else (low[0], low[1] + 1, 0)
        elif low[0] > 0 or n == 1:
            upper = (low[0] + 1, 0, 0)
        elif low[1] > 0 or n == 2:
            upper = (0, low[1] + 1, 0)
        else:
            upper = (0, 0, low[2] + 1)
        if low <= v < upper:
            return True
    return False
