"""The peers of ``bench/linear_rnn.py``: each returns ``run() -> o`` (NumPy, (batch, T, H, V)) on prepared inputs.

Inputs are the fused op's: q, k ``(batch, T, Hq, K)``, v ``(batch, T, H, V)``, g the log decay ``(batch, T, H)``
or ``(batch, T, H, K)``, u ``(H, K)``; no scale (the op has none; peers with a built-in scale get q / scale).
Loading:

* mamba-ssm's ``ssd_minimal_discrete``: its pure-PyTorch file, taken at bench time from the PyPI sdist
  (``pip download --no-deps --no-binary :all: mamba-ssm``) into the git-ignored ``bench/out/peers``, its one
  import of the Triton kernels dropped;
* flash-linear-attention (``pip install fla-core``): ``naive_recurrent_gla``, ``naive_chunk_simple_gla``
  (its chunk code: a decay per head, so the Mamba-2 shapes), ``naive_recurrent_rwkv6`` loaded from their files
  (the package itself imports Triton);
* llama.cpp's ggml (``pip install ggml-python``): ``ggml_ssm_scan`` (Mamba-2 form: A one value per head),
  ``ggml_gated_linear_attn`` (K == V), ``ggml_rwkv_wkv6``; their graph compute only, on inputs copied into
  their layouts beforehand (their decays as multipliers exp(g), made beforehand too);
* JAX: a jitted ``lax.scan`` of the recurrence (GLA, RWKV-6) and a jitted chunked SSD (scalar decay).
"""

from __future__ import annotations

import ctypes
import importlib.util
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np

PEERS = Path(__file__).resolve().parent / "out" / "peers"


def _module(path: Path, name: str, drop: tuple[str, ...] = ()):
    src = "\n".join(line for line in path.read_text().splitlines() if not any(d in line for d in drop))
    spec = importlib.util.spec_from_loader(name, loader=None)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # torch.compile looks functions' modules up by name
    exec(compile(src, str(path), "exec"), mod.__dict__)
    return mod


def ssd_minimal():
    """mamba-ssm's ssd_minimal module, from the sdist fetched into bench/out/peers (once)."""
    target = PEERS / "ssd_minimal.py"
    if not target.exists():
        PEERS.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "--no-build-isolation", "mamba-ssm==2.2.4", "-d", str(PEERS)], check=True,
                       capture_output=True, env={"MAMBA_SKIP_CUDA_BUILD": "TRUE", "PATH": "/usr/bin:/bin",
                                                 **{k: v for k, v in __import__("os").environ.items()}})
        with tarfile.open(next(PEERS.glob("mamba_ssm-*.tar.gz"))) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith("modules/ssd_minimal.py"))
            target.write_bytes(tar.extractfile(member).read())
    return _module(target, "ssd_minimal", drop=("mamba_ssm.ops.triton",))


def fla_naive(rel: str):
    """A flash-linear-attention naive file (``gla/naive.py``) as a module."""
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("flash-linear-attention is not installed (pip install fla-core)")
    return _module(Path(list(spec.submodule_search_locations)[0]) / "ops" / rel, "fla_" + rel.replace("/", "_"))


def torch_ssd(a: dict, chunk: int = 64, compiled: bool = False):
    import torch

    mod = ssd_minimal()
    H = a["v"].shape[2]
    X, A = torch.from_numpy(a["v"]), torch.from_numpy(a["g"])
    rep = H // a["k"].shape[2]
    B = torch.from_numpy(a["k"]).repeat_interleave(rep, 2)
    C = torch.from_numpy(a["q"]).repeat_interleave(rep, 2)
    fn = torch.compile(mod.ssd_minimal_discrete) if compiled else mod.ssd_minimal_discrete

    def run():
        with torch.no_grad():
            return fn(X, A, B, C, chunk)[0].numpy()
    return run


def torch_gla(a: dict):
    """fla's ``naive_recurrent_gla`` (a decay per key)."""
    import torch

    K = a["q"].shape[-1]
    q, k, v, g = (torch.from_numpy(a[n]) for n in ("q", "k", "v", "g"))
    fn = fla_naive("gla/naive.py").naive_recurrent_gla

    def run():
        with torch.no_grad():
            return fn(q * K ** 0.5, k, v, g)[0].numpy()
    return run


def torch_chunk_simple_gla(a: dict, compiled: bool = False):
    """fla's naive chunk code (``naive_chunk_simple_gla``, a decay per head) on the op's inputs (q, k repeated to
    every head of their group), eager or ``torch.compile`` d."""
    import torch

    rep = a["v"].shape[2] // a["q"].shape[2]
    q, k = (torch.from_numpy(a[n]).repeat_interleave(rep, 2) for n in ("q", "k"))
    v, g = torch.from_numpy(a["v"]), torch.from_numpy(a["g"])
    chunk = fla_naive("simple_gla/naive.py").naive_chunk_simple_gla
    fn = torch.compile(chunk) if compiled else chunk

    def run():
        with torch.no_grad():
            return fn(q, k, v, g, chunk_size=64, scale=1.0)[0].numpy()
    return run


def torch_rwkv6(a: dict):
    import torch

    K = a["q"].shape[-1]
    tr = {n: torch.from_numpy(a[n]).transpose(1, 2) for n in ("q", "k", "v", "g")}
    u = torch.from_numpy(a["u"])
    fn = fla_naive("rwkv6/recurrent_naive.py").naive_recurrent_rwkv6

    def run():
        with torch.no_grad():
            return fn(tr["q"], tr["k"], tr["v"], tr["g"], u, scale=1.0)[0].transpose(1, 2).numpy()
    del K
    return run


def jax_peer(a: dict, kind: str):
    import jax
    import jax.numpy as jnp

    H = a["v"].shape[2]
    rep = H // a["q"].shape[2]
    q, k = (jnp.repeat(jnp.asarray(a[n]), rep, 2) for n in ("q", "k"))
    v, g = jnp.asarray(a["v"]), jnp.asarray(a["g"])
    if kind == "ssd":
        fn = jax.jit(lambda q, k, v, g: _jax_ssd(jnp, q, k, v, g, 64))
        return lambda: np.asarray(fn(q, k, v, g).block_until_ready())
    u = jnp.asarray(a["u"]) if kind == "rwkv6" else None

    def step(S, x):
        qt, kt, vt, gt = x
        d = jnp.exp(gt)[..., None] if gt.ndim == 3 else jnp.exp(gt)[..., None, None]
        kv = kt[..., None] * vt[..., None, :]
        if u is not None:
            o = jnp.einsum("bhk,bhkv->bhv", qt, S + u[None, :, :, None] * kv)
            return d * S + kv, o
        S = d * S + kv
        return S, jnp.einsum("bhk,bhkv->bhv", qt, S)

    def scan(q, k, v, g):
        S0 = jnp.zeros(q.shape[:1] + q.shape[2:] + v.shape[-1:], q.dtype)
        xs = tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, g))
        return jnp.moveaxis(jax.lax.scan(step, S0, xs)[1], 0, 1)
    fn = jax.jit(scan)
    return lambda: np.asarray(fn(q, k, v, g).block_until_ready())


def _jax_ssd(jnp, q, k, v, g, c):
    """Chunked SSD (scalar decay) in JAX: the same four terms as ssd_minimal_discrete."""
    b, T, H, K = q.shape
    n = T // c
    Q, Kc, V = (x.reshape(b, n, c, H, -1) for x in (q, k, v))
    G = jnp.cumsum(g.reshape(b, n, c, H), axis=2)
    seg = G[:, :, :, None, :] - G[:, :, None, :, :]
    mask = jnp.tril(jnp.ones((c, c), bool))[None, None, :, :, None]
    L = jnp.where(mask, jnp.exp(jnp.where(mask, seg, 0.0)), 0.0)
    y = jnp.einsum("bnihk,bnjhk,bnijh,bnjhv->bnihv", Q, Kc, L, V)
    states = jnp.einsum("bnjhk,bnjh,bnjhv->bnhkv", Kc, jnp.exp(G[:, :, -1:, :] - G), V)

    def carry(S, x):
        st, glast = x
        return jnp.exp(glast)[..., None, None] * S + st, S
    _, starts = __import__("jax").lax.scan(carry, jnp.zeros_like(states[:, 0]),
                                           (jnp.moveaxis(states, 1, 0), jnp.moveaxis(G[:, :, -1], 1, 0)))
    starts = jnp.moveaxis(starts, 0, 1)
    y = y + jnp.einsum("bnihk,bnhkv,bnih->bnihv", Q, starts, jnp.exp(G))
    return y.reshape(b, T, H, -1)


def ggml_peer(a: dict, kind: str, threads: int):
    """llama.cpp's kernel on ggml tensors: ``(run, close)``; run() computes the graph, returns o."""
    import ggml

    b, T, H, V = a["v"].shape
    Hq, K = a["q"].shape[2:]
    mem = 4 * sum(x.size for x in a.values()) * 3 + 4 * b * H * K * V * 4 + (64 << 20)
    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=mem, mem_buffer=None))

    def tensor(data):
        data = np.ascontiguousarray(data, np.int32 if data.dtype == np.int32 else np.float32)
        shape = tuple(reversed(data.shape))
        make = {1: ggml.ggml_new_tensor_1d, 2: ggml.ggml_new_tensor_2d, 3: ggml.ggml_new_tensor_3d,
                4: ggml.ggml_new_tensor_4d}[len(shape)]
        t = make(ctx, ggml.GGML_TYPE_I32 if data.dtype == np.int32 else ggml.GGML_TYPE_F32, *shape)
        ctypes.memmove(ggml.ggml_get_data(t), data.ctypes.data, data.nbytes)
        return t

    if kind == "ssd":  # s {N, P, H, seqs}, x {P, H, T, seqs}, dt {H, T, seqs}, A {1, H}, B/C {N, G, T, seqs}
        # its decay is exp(softplus(dt) * A) and its input softplus(dt) * x: with A = -1, softplus(dt) = -g
        # and x = v / -g give exactly the op's state update (made beforehand, outside the timing)
        dts = -a["g"]
        dt = np.log(np.expm1(dts))
        out = ggml.ggml_ssm_scan(ctx, tensor(np.zeros((b, H, V, K), np.float32)), tensor(a["v"] / dts[..., None]),
                                 tensor(dt), tensor(-np.ones((H, 1), np.float32)), tensor(a["k"]), tensor(a["q"]),
                                 tensor(np.arange(b, dtype=np.int32)))
    elif kind == "gla":  # k, v, q, g {S, H, T}, state {S*S*H, seqs}
        flat = (b * T, H, K)
        out = ggml.ggml_gated_linear_attn(ctx, tensor(a["k"].reshape(flat)), tensor(a["v"].reshape(flat)),
                                          tensor(a["q"].reshape(flat)), tensor(np.exp(a["g"]).reshape(flat)),
                                          tensor(np.zeros((b, H * K * V), np.float32)), 1.0)
    else:  # rwkv6: k, v, r {S, H, T}, tf {S, H}, td {S, H, T}, state {S*S*H, seqs}
        flat = (b * T, H, K)
        out = ggml.ggml_rwkv_wkv6(ctx, tensor(a["k"].reshape(flat)), tensor(a["v"].reshape(flat)),
                                  tensor(a["q"].reshape(flat)), tensor(a["u"]), tensor(np.exp(a["g"]).reshape(flat)),
                                  tensor(np.zeros((b, H * K * V), np.float32)))
    graph = ggml.ggml_new_graph(ctx)
    ggml.ggml_build_forward_expand(graph, out)
    n = b * T * H * V
    view = np.ctypeslib.as_array(ctypes.cast(ggml.ggml_get_data(out), ctypes.POINTER(ctypes.c_float)), (n,))

    def run():
        ggml.ggml_graph_compute_with_ctx(ctx, graph, threads)
        return view.reshape(b, T, H, V).copy()
    return run, lambda: ggml.ggml_free(ctx)


def torch_grad(a: dict, kind: str, do: np.ndarray, compiled: bool = False):
    """Forward + backward of a peer through torch autograd: ``run() -> dv`` (the gradient of ``sum(o * do)``
    with respect to every input; mamba-ssm's ``ssd_minimal_discrete`` for ``ssd``, fla's naive chunk code for
    ``simple_gla_chunk`` (a decay per head), fla's naive recurrent code for ``gla`` and ``rwkv6``), eager or
    ``torch.compile`` d."""
    import torch

    names = ("q", "k", "v", "g", "u") if kind == "rwkv6" else ("q", "k", "v", "g")
    leaves = [torch.from_numpy(a[n].copy()).requires_grad_() for n in names]
    dout = torch.from_numpy(do)
    H, K = a["v"].shape[2], a["q"].shape[-1]
    rep = H // a["q"].shape[2]
    if kind == "ssd":
        mod = ssd_minimal()

        def fwd(q, k, v, g):
            return mod.ssd_minimal_discrete(v, g, k.repeat_interleave(rep, 2), q.repeat_interleave(rep, 2), 64)[0]
    elif kind == "simple_gla_chunk":
        chunk = fla_naive("simple_gla/naive.py").naive_chunk_simple_gla

        def fwd(q, k, v, g):
            return chunk(q.repeat_interleave(rep, 2), k.repeat_interleave(rep, 2), v, g, chunk_size=64, scale=1.0)[0]
    elif kind == "gla":
        gla = fla_naive("gla/naive.py").naive_recurrent_gla

        def fwd(q, k, v, g):
            return gla(q * K ** 0.5, k, v, g)[0]
    else:
        rwkv = fla_naive("rwkv6/recurrent_naive.py").naive_recurrent_rwkv6

        def fwd(q, k, v, g, u):
            tr = [x.transpose(1, 2) for x in (q, k, v, g)]
            return rwkv(*tr, u, scale=1.0)[0].transpose(1, 2)
    fn = torch.compile(fwd) if compiled else fwd

    def run():
        for x in leaves:
            x.grad = None
        fn(*leaves).backward(dout)
        return leaves[2].grad.numpy()
    return run


def jax_grad(a: dict, kind: str, do: np.ndarray):
    """Forward + backward in JAX: ``jax.grad`` under ``jit`` of the peers' scan (GLA, RWKV-6) or chunked SSD
    with respect to q, k, v, g (and u): ``run() -> dv``."""
    import jax
    import jax.numpy as jnp

    H = a["v"].shape[2]
    rep = H // a["q"].shape[2]
    dout = jnp.asarray(do)
    u = jnp.asarray(a["u"]) if kind == "rwkv6" else jnp.zeros((1,), jnp.float32)

    def step_for(u, bonus):
        def step(S, x):
            qt, kt, vt, gt = x
            d = jnp.exp(gt)[..., None] if gt.ndim == 3 else jnp.exp(gt)[..., None, None]
            kv = kt[..., None] * vt[..., None, :]
            if bonus:
                return d * S + kv, jnp.einsum("bhk,bhkv->bhv", qt, S + u[None, :, :, None] * kv)
            S = d * S + kv
            return S, jnp.einsum("bhk,bhkv->bhv", qt, S)
        return step

    def forward(q, k, v, g, u):
        q, k = (jnp.repeat(x, rep, 2) for x in (q, k))
        if kind == "ssd":
            return _jax_ssd(jnp, q, k, v, g, 64)
        S0 = jnp.zeros(q.shape[:1] + q.shape[2:] + v.shape[-1:], q.dtype)
        xs = tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, g))
        return jnp.moveaxis(jax.lax.scan(step_for(u, kind == "rwkv6"), S0, xs)[1], 0, 1)
    grad = jax.jit(jax.grad(lambda *xs: jnp.sum(forward(*xs) * dout), argnums=(0, 1, 2, 3, 4)))
    args = [jnp.asarray(a[n]) for n in ("q", "k", "v", "g")] + [u]
    return lambda: np.asarray(grad(*args)[2].block_until_ready())
