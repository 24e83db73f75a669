"""GPU kernel text of the fused Mamba-1 backward (assembled by :mod:`.fused_gpu_mamba1`).

One workgroup per (batch, channel), chunks of ``workgroup_size * items_per_thread``
steps, as in the forward.  First the forward carries run over every chunk and
the state at each chunk start is kept in the scratch buffer ``ws`` (one value
per chunk and state: the checkpoints).  Then the chunks run in reverse; for
each state n a work-item rebuilds its items' states from the chunk's
checkpoint with the forward workgroup scan, and the reverse recurrence of the
gradient runs as a second workgroup scan with the ranks reversed, over the
pairs ``(a_t, a_t * C_t * dy_t)`` of ``G_t = a_t * (C_t dy_t + G_{t+1})``
(``g_t = C_t dy_t + G_{t+1}`` is dL/dh_t).  Per item the chain rule gives
du, ddelta and dz in registers; dA, dD, delta_bias and fixed B/C gradients are
summed over the workgroup and added to their outputs atomically (they are
sums over batch and time); per-step B/C gradients (sums over a group's
channels) are added atomically per (n, t).  Outputs must be zero before the
launch; sums made with atomics are not bit-reproducible between runs.

Kernel: the ABI of :meth:`~scanweaver.fused.mamba1.Mamba1.params` (backward),
then ``ws`` (``batch * dim * chunks * N`` values of scratch).
"""

from __future__ import annotations

#: ``sw_atomic_add(p, v)`` on a global SW_T (a compare-and-swap loop on OpenCL, ``atomicAdd`` on CUDA) and
#: ``SW_GLOBAL_BARRIER()``; needs ``SW_DOUBLE``.
ATOMIC_ADD = r"""
#ifdef __OPENCL_VERSION__
#define SW_GLOBAL_BARRIER() barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE)
#if SW_DOUBLE
#pragma OPENCL EXTENSION cl_khr_int64_base_atomics : enable
inline void sw_atomic_add(volatile __global double* p, double v) {
  union { ulong u; double f; } old, upd;
  do { old.f = *p; upd.f = old.f + v; }
  while (atom_cmpxchg((volatile __global ulong*)p, old.u, upd.u) != old.u);
}
#else
inline void sw_atomic_add(volatile __global float* p, float v) {
  union { uint u; float f; } old, upd;
  do { old.f = *p; upd.f = old.f + v; }
  while (atomic_cmpxchg((volatile __global uint*)p, old.u, upd.u) != old.u);
}
#endif
#else
#define SW_GLOBAL_BARRIER() __syncthreads()
#define sw_atomic_add(p, v) atomicAdd((p), (v))
#endif
"""

PRELUDE = ATOMIC_ADD + r"""
/* Inclusive scan of the workgroup's pairs in rank order (any rank permutation: the reverse scan passes
 * SW_TPL-1-lid) in local memory; excl/total as sw_group_scan gives them. */
SW_DEVICE void sw_rank_scan(sw_pair agg, const int rank, sw_pair* excl, sw_pair* total, SW_LOCAL_PTR sw_pair* sm) {
  sm[rank] = agg;
  SW_BARRIER();
  for (int dd = 1; dd < SW_TPL; dd <<= 1) {
    sw_pair v = sm[rank];
    if (rank >= dd) v = sw_compose(v, sm[rank - dd]);
    SW_BARRIER();
    sm[rank] = v;
    SW_BARRIER();
  }
  *total = sm[SW_TPL - 1];
  *excl = rank > 0 ? sm[rank - 1] : sw_identity();
  SW_BARRIER();
}

/* The sum of v over the workgroup, in work-item 0 (red: SW_WORKGROUP_SIZE values of local memory). */
SW_DEVICE SW_T sw_group_sum(SW_T v, SW_LOCAL_PTR SW_T* red, const int lid) {
  red[lid] = v;
  SW_BARRIER();
  for (int s = SW_WORKGROUP_SIZE / 2; s > 0; s >>= 1) {
    if (lid < s) red[lid] += red[lid + s];
    SW_BARRIER();
  }
  const SW_T total = red[0];
  SW_BARRIER();
  return total;
}
"""

BODY = r"""
#define SW_IPT SW_ITEMS_PER_THREAD
#define SW_CHUNK ((sw_index)SW_TPL * SW_IPT)

SW_KERNEL void sw_mamba1_backward(@PARAMS@, SW_GLOBAL SW_T* restrict ws) {
  SW_LOCAL sw_pair sm[SW_WORKGROUP_SIZE];
  SW_LOCAL SW_T red[SW_WORKGROUP_SIZE];
  const int lid = SW_LID;
  const sw_index ch = SW_GROUP, b = ch / dim, d = ch % dim, row = ch * L;
  const sw_index nchunks = (L + SW_CHUNK - 1) / SW_CHUNK;
  SW_GLOBAL SW_T* ckpt = ws + ch * nchunks * SW_N;
  SW_GLOBAL const SW_T* Bp = SW_B_FIXED ? B + d * SW_N : B + (b * groups_b + d / (dim / groups_b)) * SW_N * L;
  SW_GLOBAL const SW_T* Cp = SW_C_FIXED ? C + d * SW_N : C + (b * groups_c + d / (dim / groups_c)) * SW_N * L;
  SW_GLOBAL SW_T* dBp = SW_B_FIXED ? dB + d * SW_N : dB + (b * groups_b + d / (dim / groups_b)) * SW_N * L;
  SW_GLOBAL SW_T* dCp = SW_C_FIXED ? dC + d * SW_N : dC + (b * groups_c + d / (dim / groups_c)) * SW_N * L;
  const SW_T Dd = SW_HAS_D ? D[d] : (SW_T)0, bias = SW_HAS_BIAS ? delta_bias[d] : (SW_T)0;
  SW_T carry[SW_N];
  for (int n = 0; n < SW_N; ++n) carry[n] = SW_HAS_H0 ? h0[ch * SW_N + n] : (SW_T)0;
  /* 1. the checkpoints: the state at every chunk's start */
  for (sw_index c = 0; c < nchunks; ++c) {
    const sw_index s0 = c * SW_CHUNK + (sw_index)lid * SW_IPT;
    if (lid == 0)
      for (int n = 0; n < SW_N; ++n) ckpt[c * SW_N + n] = carry[n];
    SW_T dt[SW_IPT], dtu[SW_IPT];
    for (int k = 0; k < SW_IPT; ++k) {
      const sw_index t = s0 + k;
      SW_T v = (SW_T)0, x = (SW_T)0;
      if (t < L) {
        v = delta[row + t] + bias;
        if (SW_SOFTPLUS) v = sw_softplus(v);
        x = u[row + t];
      }
      dt[k] = v;
      dtu[k] = v * x;
    }
    for (int n = 0; n < SW_N; ++n) {
      const SW_T an = A[d * SW_N + n];
      sw_pair agg = sw_identity();
      for (int k = 0; k < SW_IPT; ++k) {
        const sw_index t = s0 + k;
        if (t < L) {
          SW_T a = @EXP@(dt[k] * an);
          if (SW_HAS_RESET && reset[t]) a = (SW_T)0;
          agg = sw_compose(sw_pair_make(a, dtu[k] * (SW_B_FIXED ? Bp[n] : Bp[n * L + t])), agg);
        }
      }
      sw_pair excl, total;
      sw_group_scan(agg, &excl, &total, sm, lid);
      carry[n] = sw_carry(total.a, total.u, carry[n]);
    }
  }
  SW_GLOBAL_BARRIER();
  /* 2. the chunks in reverse: states rebuilt from the checkpoint, then the reverse scan of G */
  SW_T G[SW_N], dAp[SW_N], dBf[SW_N], dCf[SW_N];
  for (int n = 0; n < SW_N; ++n) {
    G[n] = SW_HAS_DHLAST ? dhlast[ch * SW_N + n] : (SW_T)0;
    dAp[n] = dBf[n] = dCf[n] = (SW_T)0;
  }
  SW_T dDp = (SW_T)0, dbiasp = (SW_T)0;
  for (sw_index c = nchunks - 1; c >= 0; --c) {
    const sw_index s0 = c * SW_CHUNK + (sw_index)lid * SW_IPT;
    SW_T dt[SW_IPT], uu[SW_IPT], dy[SW_IPT], go[SW_IPT], ddt[SW_IPT], gb[SW_IPT], yp[SW_IPT];
    for (int k = 0; k < SW_IPT; ++k) {
      const sw_index t = s0 + k;
      SW_T v = (SW_T)0, x = (SW_T)0, g = (SW_T)0;
      if (t < L) {
        v = delta[row + t] + bias;
        if (SW_SOFTPLUS) v = sw_softplus(v);
        x = u[row + t];
        g = dout[row + t];
      }
      dt[k] = v;
      uu[k] = x;
      go[k] = g;
      dy[k] = (SW_HAS_Z && t < L) ? g * sw_silu(z[row + t]) : g;
      ddt[k] = gb[k] = yp[k] = (SW_T)0;
    }
    for (int n = 0; n < SW_N; ++n) {
      const SW_T an = A[d * SW_N + n];
      sw_pair e[SW_IPT];
      SW_T hp[SW_IPT], xs[SW_IPT];
      sw_pair agg = sw_identity();
      for (int k = 0; k < SW_IPT; ++k) {
        const sw_index t = s0 + k;
        if (t < L) {
          SW_T a = @EXP@(dt[k] * an);
          if (SW_HAS_RESET && reset[t]) a = (SW_T)0;
          e[k] = sw_pair_make(a, dt[k] * uu[k] * (SW_B_FIXED ? Bp[n] : Bp[n * L + t]));
          xs[k] = (SW_C_FIXED ? Cp[n] : Cp[n * L + t]) * dy[k];
        } else {
          e[k] = sw_identity();
          xs[k] = (SW_T)0;
        }
        agg = sw_compose(e[k], agg);
      }
      sw_pair excl, total;
      sw_group_scan(agg, &excl, &total, sm, lid);
      SW_T h = sw_carry(excl.a, excl.u, ckpt[c * SW_N + n]);
      sw_pair ragg = sw_identity();
      for (int k = 0; k < SW_IPT; ++k) {
        hp[k] = h;
        h = e[k].a * h + e[k].u;
        yp[k] += (SW_C_FIXED ? Cp[n] : (s0 + k < L ? Cp[n * L + s0 + k] : (SW_T)0)) * h;
      }
      for (int k = SW_IPT - 1; k >= 0; --k) ragg = sw_compose(sw_pair_make(e[k].a, e[k].a * xs[k]), ragg);
      sw_pair rexcl, rtotal;
      sw_rank_scan(ragg, SW_TPL - 1 - lid, &rexcl, &rtotal, sm);
      SW_T Gin = sw_carry(rexcl.a, rexcl.u, G[n]);
      for (int k = SW_IPT - 1; k >= 0; --k) {
        const sw_index t = s0 + k;
        if (t >= L) continue;
        const SW_T g = xs[k] + Gin, a = e[k].a, hn = a * hp[k] + e[k].u;
        const SW_T q = g * a * hp[k], bb = SW_B_FIXED ? Bp[n] : Bp[n * L + t];
        dAp[n] += q * dt[k];
        ddt[k] += q * an;
        gb[k] += g * bb;
        if (SW_B_FIXED) dBf[n] += g * dt[k] * uu[k]; else sw_atomic_add(&dBp[n * L + t], g * dt[k] * uu[k]);
        if (SW_C_FIXED) dCf[n] += dy[k] * hn; else sw_atomic_add(&dCp[n * L + t], dy[k] * hn);
        Gin = a * g;
      }
      G[n] = sw_carry(rtotal.a, rtotal.u, G[n]);
    }
    for (int k = 0; k < SW_IPT; ++k) {
      const sw_index t = s0 + k;
      if (t >= L) continue;
      SW_T dd = ddt[k] + gb[k] * uu[k];
      du[row + t] = gb[k] * dt[k] + Dd * dy[k];
      if (SW_SOFTPLUS) dd *= sw_sigmoid(delta[row + t] + bias);
      ddelta[row + t] = dd;
      dbiasp += dd;
      dDp += dy[k] * uu[k];
      if (SW_HAS_Z) {
        const SW_T zz = z[row + t], sz = sw_sigmoid(zz);
        dz[row + t] = go[k] * (yp[k] + Dd * uu[k]) * sz * ((SW_T)1 + zz * ((SW_T)1 - sz));
      }
    }
  }
  /* 3. sums over the workgroup, added to the outputs (sums over batch and time) */
  for (int n = 0; n < SW_N; ++n) {
    const SW_T sa = sw_group_sum(dAp[n], red, lid);
    if (lid == 0) sw_atomic_add(&dA[d * SW_N + n], sa);
    if (SW_B_FIXED) { const SW_T sb = sw_group_sum(dBf[n], red, lid); if (lid == 0) sw_atomic_add(&dBp[n], sb); }
    if (SW_C_FIXED) { const SW_T sc = sw_group_sum(dCf[n], red, lid); if (lid == 0) sw_atomic_add(&dCp[n], sc); }
    if (lid == 0 && SW_HAS_H0) dh0[ch * SW_N + n] = G[n];
  }
  const SW_T sD = sw_group_sum(dDp, red, lid), sbias = sw_group_sum(dbiasp, red, lid);
  if (lid == 0 && SW_HAS_D) sw_atomic_add(&dD[d], sD);
  if (lid == 0 && SW_HAS_BIAS) sw_atomic_add(&ddelta_bias[d], sbias);
}
"""
