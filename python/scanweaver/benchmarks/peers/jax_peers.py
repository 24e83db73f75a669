"""JAX peer: ``jax.lax.associative_scan`` over affine pairs under ``jax.jit``."""

from __future__ import annotations

import os

from ..machine import host_cpu
from . import Peer, installed, register


def _combine(left, right):
    a1, u1 = left
    a2, u2 = right
    return a2 * a1, a2 * u1 + u2


def _selective(a, b, x, c):
    import jax

    return c * jax.lax.associative_scan(_combine, (a, b * x), axis=-1)[1]


@register
class JaxAssociativeScan(Peer):
    """The selective scan as ``jax.lax.associative_scan`` of (a, b*x) pairs, jitted (compile excluded)."""

    name = "jax-assoc"
    label = "JAX associative_scan (jit)"
    note = ("JAX: operands are placed on JAX's default device (the GPU where JAX sees one, with "
            "XLA_PYTHON_CLIENT_PREALLOCATE=false) before timing; compilation is excluded (warm-up).")
    ns_per_element = 70.0

    gpu = True

    def availability(self):
        # JAX must not preallocate most of the GPU when CuPy or PyTorch share it (no effect without a GPU).
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        return installed("jax", "jax jaxlib")

    def skip_reason(self, case, settings):
        if settings.quick and not case.headline:
            return "--quick: jax.jit compiles per shape (seconds each), so it runs on the headline shape only"
        return super().skip_reason(case, settings)

    def device(self) -> str:
        import jax

        return f"JAX {jax.__version__} ({jax.default_backend()}), {host_cpu()}"

    def prepare(self, ops):
        import jax
        import jax.numpy as jnp

        if ops["a"].dtype.itemsize == 8:
            jax.config.update("jax_enable_x64", True)
        def put(v):  # CuPy operands (the gpu suite) are shared through DLPack, NumPy ones copied in
            return jax.dlpack.from_dlpack(v) if type(v).__module__.split(".")[0] == "cupy" else \
                jax.device_put(jnp.asarray(v))

        args = [put(ops[k]) for k in ("a", "b", "x", "c")]
        fn = jax.jit(_selective)
        return lambda: fn(*args).block_until_ready()
