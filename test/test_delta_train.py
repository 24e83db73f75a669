"""Drop-in for real models: a small Gated DeltaNet layer (fla's short convolution, gates written in PyTorch) trained
with Adam on ScanWeaver's ``gated_delta_rule`` follows the losses of the same model on fla 0.6's naive reference
(within 0.3% at every step: both accumulate in float32, in different orders, and Adam's steps amplify that);
and, where ``transformers`` is installed, its Qwen3-Next gated delta net layer with ScanWeaver's function in its
``chunk_gated_delta_rule`` and ``fused_recurrent_gated_delta_rule`` hooks, and its Kimi Linear delta attention
layer with ``scanweaver.kda`` in its ``chunk_kda`` and ``fused_recurrent_kda`` hooks, equal the layers' own
PyTorch fallbacks (prefill, then decode with the cache; outputs and every parameter's gradient)."""

from __future__ import annotations

import pytest

import scanweaver

torch = pytest.importorskip("torch")
F = torch.nn.functional
nn = torch.nn


class CausalConv(nn.Module):
    """fla's ``ShortConvolution`` written in PyTorch: a causal depthwise conv1d over T, then SiLU (no bias)."""

    def __init__(self, channels: int, kernel: int = 4):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, kernel, groups=channels, padding=kernel - 1, bias=False)

    def forward(self, x):
        return F.silu(self.conv(x.transpose(1, 2))[..., : x.shape[1]].transpose(1, 2))


def short_conv(channels: int) -> tuple[nn.Module, str]:
    """fla's ``ShortConvolution`` where it runs on this CPU, else :class:`CausalConv`; and which one it is."""
    try:
        from fla.modules import ShortConvolution

        conv = ShortConvolution(channels, 4, activation="silu")
        conv(torch.zeros(1, 3, channels))
    except Exception as exc:  # fla's modules import Triton; its kernels need a GPU
        return CausalConv(channels), f"PyTorch depthwise conv1d (fla's ShortConvolution: {type(exc).__name__})"

    class First(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x):
            return self.conv(x)[0]

    return First(), "fla.modules.ShortConvolution"


class GatedDeltaNet(nn.Module):
    """fla's Gated DeltaNet layer, small: q/k/v projections through short convolutions, the decay
    ``g = -exp(A_log) softplus(a + dt_bias)`` and ``beta = sigmoid(b)`` written in PyTorch, the rule ``core``
    (fla's ``chunk_gated_delta_rule`` signature) with in-kernel l2 normalisation, a gated RMSNorm and the output
    projection."""

    def __init__(self, core, d=32, H=2, HV=4, K=8, V=8):
        super().__init__()
        self.core, self.shape = core, (H, HV, K, V)
        self.q_proj, self.k_proj = nn.Linear(d, H * K, bias=False), nn.Linear(d, H * K, bias=False)
        self.v_proj, self.g_proj = nn.Linear(d, HV * V, bias=False), nn.Linear(d, HV * V, bias=False)
        self.a_proj, self.b_proj = nn.Linear(d, HV, bias=False), nn.Linear(d, HV, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.empty(HV).uniform_(1, 16)))
        self.dt_bias = nn.Parameter(torch.log(torch.expm1(torch.empty(HV).uniform_(1e-3, 0.1))))
        (self.conv_q, self.conv_kind), (self.conv_k, _), (self.conv_v, _) = (short_conv(H * K), short_conv(H * K),
                                                                          short_conv(HV * V))
        self.norm = nn.Parameter(torch.ones(V))
        self.o_proj = nn.Linear(HV * V, d, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        H, HV, K, V = self.shape
        q = self.conv_q(self.q_proj(x)).view(B, T, H, K)
        k = self.conv_k(self.k_proj(x)).view(B, T, H, K)
        v = self.conv_v(self.v_proj(x)).view(B, T, HV, V)
        g = -self.A_log.exp() * F.softplus(self.a_proj(x) + self.dt_bias)
        beta = self.b_proj(x).sigmoid()
        o, _ = self.core(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
        o = o * torch.rsqrt(o.square().mean(-1, keepdim=True) + 1e-6) * self.norm
        o = o * F.silu(self.g_proj(x).view(B, T, HV, V))
        return self.o_proj(o.reshape(B, T, HV * V))


class Model(nn.Module):
    def __init__(self, core, vocab=16, d=32):
        super().__init__()
        self.embed, self.layer, self.head = nn.Embedding(vocab, d), GatedDeltaNet(core, d), nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        return self.head(x + self.layer(x))


def fla_core(q, k, v, g, beta, use_qk_l2norm_in_kernel=False):
    """fla 0.6's ``naive_recurrent_gated_delta_rule`` behind fla's ``chunk_gated_delta_rule`` signature: the
    normalisation and the grouped value heads (which the naive reference lacks) written in PyTorch."""
    import matrix_peers as peers

    mod = peers.fla("gated_delta_rule/naive")
    if mod is None:
        pytest.skip(peers.FLA_WHY)
    if use_qk_l2norm_in_kernel:
        q, k = (x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    G = v.shape[2] // q.shape[2]
    q, k = q.repeat_interleave(G, dim=2), k.repeat_interleave(G, dim=2)
    return mod.naive_recurrent_gated_delta_rule(q, k, v, beta, g, None, None, False)


def train(core, steps=40):
    """Losses of Adam steps on a copy task (token t repeats token t - 8), the same seed and data for every core."""
    torch.manual_seed(0)
    model = Model(core)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1)
    first = torch.randint(0, 16, (8, 8), generator=gen)
    tokens = first.repeat(1, 9)[:, :67]
    losses = []
    for _ in range(steps):
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 16), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model.layer.conv_kind


def test_gated_deltanet_layer_trains_to_the_losses_of_fla_naive_reference():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thousands of tiny ops in fla's reference: two threads on a busy machine crawl
    try:
        ours, conv = train(scanweaver.gated_delta_rule)
        ref, _ = train(fla_core)
    finally:
        torch.set_num_threads(threads)
    rel = max(abs(a - b) / abs(b) for a, b in zip(ours, ref, strict=True))
    print(f"\nshort convolution: {conv}; losses {ours[0]:.4f} -> {ours[-1]:.4f} (fla naive {ref[0]:.4f} -> "
          f"{ref[-1]:.4f}), largest relative difference per step {rel:.1e}")
    assert ours[-1] < 0.6 * ours[0]
    assert rel < 3e-3


def check_drop_in(transformers, monkeypatch, layer, cfg, module, hooks, ours):
    """``layer`` with ``ours`` in the ``hooks`` of ``module`` equals the layer's own PyTorch fallback: serving
    (prefill, then decode steps with the layer's cache; no gradients) and training (the whole sequence, every
    parameter's gradient); and our backward ran."""
    x = torch.randn(2, 37, 64)

    def run():
        with torch.no_grad():
            cache = transformers.DynamicCache(config=cfg)
            ys = [layer(x[:, :30], cache=cache)] + [layer(x[:, t: t + 1], cache=cache) for t in range(30, 37)]
        layer.zero_grad()
        full = layer(x)
        full.square().sum().backward()
        return torch.cat(ys, 1), full.detach(), {n: p.grad.clone() for n, p in layer.named_parameters()}

    want = run()
    for hook in hooks:
        monkeypatch.setattr(module, hook, ours)
    before = scanweaver.matrix.last
    got = run()
    ran = scanweaver.matrix.last
    assert ran is not before and ran.part == "backward", f"{ours.__name__} ran the layer's training step"
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-5)
    for name, grad in want[2].items():
        # the fallbacks compute in float32 in chunks whatever the layer's dtype: A_log's gradient, a sum over every
        # step with cancellation, differed by 6e-4 of its largest entry from ours also with the layer in float64
        torch.testing.assert_close(got[2][name], grad, rtol=1e-3, atol=2e-3 * float(grad.abs().max()), msg=name)


def test_qwen3_next_layer_takes_scanweaver_as_its_fla_hooks(monkeypatch):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install "
                                                              "transformers)")
    try:
        from transformers.models.qwen3_next import modeling_qwen3_next as qwen
    except ImportError as exc:
        pytest.skip(f"transformers {transformers.__version__} has no Qwen3-Next: {exc}")
    cfg = transformers.Qwen3NextConfig(hidden_size=64, linear_num_value_heads=4, linear_num_key_heads=2,
                                       linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                                       num_hidden_layers=1, layer_types=["linear_attention"], hidden_act="silu",
                                       rms_norm_eps=1e-6, vocab_size=32, num_attention_heads=2, num_key_value_heads=1,
                                       intermediate_size=64, num_experts=2, num_experts_per_tok=1)
    torch.manual_seed(0)
    layer = qwen.Qwen3NextGatedDeltaNet(cfg, 0)
    check_drop_in(transformers, monkeypatch, layer, cfg, qwen,
                  ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"), scanweaver.gated_delta_rule)


def test_kimi_linear_layer_takes_scanweaver_kda_as_its_fla_hooks(monkeypatch):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install "
                                                              "transformers)")
    try:
        from transformers.models.kimi_linear import modeling_kimi_linear as kimi
    except ImportError as exc:
        pytest.skip(f"transformers {transformers.__version__} has no Kimi Linear: {exc}")
    cfg = transformers.KimiLinearConfig(hidden_size=64, linear_num_heads=4, linear_head_dim=16,
                                        linear_conv_kernel_dim=4, num_hidden_layers=1,
                                        layer_types=["linear_attention"], hidden_act="silu", rms_norm_eps=1e-6,
                                        vocab_size=32, num_attention_heads=2, num_key_value_heads=2,
                                        intermediate_size=64, moe_intermediate_size=32, num_experts=2,
                                        num_experts_per_token=1, pad_token_id=None, bos_token_id=None,
                                        eos_token_id=None)
    torch.manual_seed(0)
    layer = kimi.KimiLinearDeltaAttention(cfg, 0)
    with torch.no_grad():  # the layer leaves its gate's parameters to the model's initialisation
        layer.forget_gate.dt_bias.uniform_(-1.0, 1.0)
        layer.forget_gate.A_log.uniform_(-1.0, 0.5)
    check_drop_in(transformers, monkeypatch, layer, cfg, kimi,
                  ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention"), scanweaver.kda)
