"""Hybrid (qwen38) shapes for ``bloomery bench qwen38-dflash2 | qwen38-mtp --shape``: random weights made on
the device, the MTP head and a DFlash2 drafter at the shape's size, and HF transformers' Qwen3_5ForCausalLM
carrying the very same tensors.

Values (as ``bench_shapes``): layer matrices N(0, 0.002^2), embeddings N(0, 1), the untied LM head a row
permutation of the embedding, zero-centred norms 0 (gain 1), the DeltaNet's plain output norm 1, A_log
log(1..16) spread over heads, dt_bias 1, conv taps N(0, 0.5^2). The residual stream stays the embedding row
plus small layer terms, so greedy decoding is a fixed walk whose top-1 logit stands far above the rest: no
engine's rounding flips an id, the replay draft's synthetic acceptance stays exact and HF's ids compare with
ours. No cost depends on the values.

``layers``: a real-width run with fewer layers (the 3 DeltaNet : 1 attention pattern kept from layer 0), so
the 27B width fits a small device; the draft's target features are picked from the layers that exist.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from bloomery_gates.spec import DFlash2Spec, HybridShape, LayerShape, MTPSpec, Qwen38Spec

from ..formats.dflash import default_target_layer_ids

LIN, FULL = "linear_attention", "full_attention"


@dataclass(frozen=True)
class HybridBenchShape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    lin_key_heads: int
    lin_value_heads: int
    lin_key_dim: int
    lin_value_dim: int
    conv_kernel: int = 4
    partial_rotary: float = 0.25
    full_every: int = 4                # every 4th layer (3, 7, ...) is full attention
    draft_layers: int = 5              # the DFlash2 drafter's depth
    conv_taps: int = 2                 # DFlash2: T
    conv_group: int = 16               # DFlash2: g
    selector_rank: int = 256           # DFlash2: r
    selector_top_k: int = 16           # DFlash2: K
    rms_eps: float = 1e-6
    rope_theta: float = 1e7
    about: str = ""

    def layer_types(self, layers: int | None = None) -> tuple[str, ...]:
        n = layers or self.layers
        return tuple(FULL if (i + 1) % self.full_every == 0 else LIN for i in range(n))

    def layer_shape(self) -> LayerShape:
        return LayerShape(self.hidden, self.heads, self.kv_heads, self.head_dim, self.intermediate, self.rms_eps,
                          self.rope_theta)

    def hybrid(self, layers: int | None = None) -> HybridShape:
        return HybridShape(self.layer_types(layers), self.partial_rotary, int(self.head_dim * self.partial_rotary),
                           self.lin_key_heads, self.lin_value_heads, self.lin_key_dim, self.lin_value_dim,
                           self.conv_kernel, 1)

    def facts(self) -> dict[str, Any]:
        return asdict(self)


HYBRID_SHAPES = {
    "qwen38-27b": HybridBenchShape(
        "qwen38-27b", 5120, 64, 24, 4, 256, 17408, 248320, 16, 48, 128, 128,
        about="Qwen3.8-27B dense hybrid (48 Gated DeltaNet + 16 gated attention, untied head), its MTP head (one "
              "gated attention layer + fc [H, 2H]) and a 5-layer DFlash2 drafter (T=2, g=16, r=256, K=16; the depth "
              "is an assumption: z-lab's DFlash drafters have 5 layers)"),
    "qwen38-tiny": HybridBenchShape(
        "qwen38-tiny", 64, 4, 4, 2, 16, 128, 512, 2, 4, 16, 16, draft_layers=1, selector_rank=8, selector_top_k=4,
        rope_theta=10000.0, about="a CPU-sized hybrid shape for tests"),
}


class _Maker:
    """Random tensors on the device in the run dtype, one ``randn`` per fused matrix (q/k/v and gate/up are
    row blocks of one buffer: the views cost no copy)."""

    def __init__(self, device: torch.device, dtype: torch.dtype, seed: int):
        self.dev, self.dt = device, dtype
        self.gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(self, rows: int, cols: int, std: float = 0.002) -> torch.Tensor:
        return torch.randn(rows, cols, generator=self.gen, device=self.dev, dtype=self.dt).mul_(std)

    def full(self, n: int, value: float) -> torch.Tensor:
        return torch.full((n,), value, device=self.dev, dtype=self.dt)

    def swiglu(self, t: dict, p: str, h: int, i: int) -> None:
        """A dense SwiGLU MLP under p: gate/up (row blocks of one draw) and down."""
        gu = self.rnd(2 * i, h)
        t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"] = gu[:i], gu[i:]
        t[p + "mlp.down_proj.weight"] = self.rnd(h, i)

    def mlp(self, t: dict, p: str, h: int, i: int, norm: float) -> None:
        self.swiglu(t, p, h, i)
        t[p + "input_layernorm.weight"] = self.full(h, norm)
        t[p + "post_attention_layernorm.weight"] = self.full(h, norm)

    def attention(self, t: dict, p: str, s: HybridBenchShape, gated: bool, norm: float) -> None:
        """q [(1 + gated) nh d, H] (gated: query and output gate per head), k, v, o, q/k norms."""
        h, d, nq, nkv = s.hidden, s.head_dim, s.heads * s.head_dim, s.kv_heads * s.head_dim
        wq = (2 if gated else 1) * nq
        qkv = self.rnd(wq + 2 * nkv, h)
        a = p + "self_attn."
        t[a + "q_proj.weight"], t[a + "k_proj.weight"], t[a + "v_proj.weight"] = \
            qkv[:wq], qkv[wq:wq + nkv], qkv[wq + nkv:]
        t[a + "o_proj.weight"] = self.rnd(h, nq)
        t[a + "q_norm.weight"], t[a + "k_norm.weight"] = self.full(d, norm), self.full(d, norm)

    def deltanet(self, t: dict, p: str, s: HybridBenchShape, hy: HybridShape) -> None:
        h, nv = s.hidden, s.lin_value_heads
        a = p + "linear_attn."
        proj = self.rnd(hy.conv_dim + hy.value_dim + 2 * nv, h)        # qkv | z | a | b: one buffer
        c, z = hy.conv_dim, hy.conv_dim + hy.value_dim
        t[a + "in_proj_qkv.weight"], t[a + "in_proj_z.weight"] = proj[:c], proj[c:z]
        t[a + "in_proj_a.weight"], t[a + "in_proj_b.weight"] = proj[z:z + nv], proj[z + nv:]
        t[a + "conv1d.weight"] = self.rnd(c, s.conv_kernel, 0.5).view(c, 1, s.conv_kernel)
        t[a + "A_log"] = torch.log(torch.linspace(1.0, 16.0, nv, device=self.dev)).to(self.dt)
        t[a + "dt_bias"] = self.full(nv, 1.0)
        t[a + "norm.weight"] = self.full(s.lin_value_dim, 1.0)
        t[a + "out_proj.weight"] = self.rnd(h, hy.value_dim)


def random_qwen38(s: HybridBenchShape, device: torch.device, dtype: torch.dtype, layers: int | None = None,
                  seed: int = 0) -> tuple[Qwen38Spec, MTPSpec]:
    """The target (``layers`` of the shape's pattern, default all) and its MTP head, on ``device`` in ``dtype``."""
    m = _Maker(device, dtype, seed)
    hy = s.hybrid(layers)
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": m.rnd(s.vocab, s.hidden, 1.0),
                                  "model.norm.weight": m.full(s.hidden, 0.0)}
    perm = torch.randperm(s.vocab, generator=m.gen, device=device)
    t["lm_head.weight"] = t["model.embed_tokens.weight"][perm]
    for i, kind in enumerate(hy.layer_types):
        p = f"model.layers.{i}."
        if kind == LIN:
            m.deltanet(t, p, s, hy)
        else:
            m.attention(t, p, s, True, 0.0)
        m.mlp(t, p, s.hidden, s.intermediate, 0.0)
    target = Qwen38Spec(family="qwen38", source=Path(f"random:{s.name}"), source_format="random",
                        layer=s.layer_shape(), num_layers=len(hy.layer_types), vocab_size=s.vocab,
                        tie_word_embeddings=False, max_position=1 << 18, tensors=t, hybrid=hy)
    mt: dict[str, torch.Tensor] = {"mtp.fc.weight": m.rnd(s.hidden, 2 * s.hidden),
                                   "mtp.norm.weight": m.full(s.hidden, 0.0),
                                   "mtp.pre_fc_norm_embedding.weight": m.full(s.hidden, 0.0),
                                   "mtp.pre_fc_norm_hidden.weight": m.full(s.hidden, 0.0)}
    m.attention(mt, "mtp.layers.0.", s, True, 0.0)
    m.mlp(mt, "mtp.layers.0.", s.hidden, s.intermediate, 0.0)
    mtp = MTPSpec("mtp", Path(f"random:{s.name}-mtp"), "random", s.layer_shape(), hy.rotary_dim, 1, s.vocab, mt)
    return target, mtp


def random_dflash2(s: HybridBenchShape, target: Qwen38Spec, block: int, device: torch.device, dtype: torch.dtype,
                   seed: int = 1) -> DFlash2Spec:
    """A DFlash2 drafter of the shape's depth and selector at block size ``block``, reading the target's
    layers ``default_target_layer_ids`` (the layers that exist under ``--layers``)."""
    m = _Maker(device, dtype, seed)
    h = s.hidden
    ids = default_target_layer_ids(s.draft_layers, target.num_layers)
    groups = h // s.conv_group
    d: dict[str, torch.Tensor] = {"fc.weight": m.rnd(h, len(ids) * h), "hidden_norm.weight": m.full(h, 1.0),
                                  "norm.weight": m.full(h, 1.0)}
    for i in range(s.draft_layers):
        p = f"layers.{i}."
        m.attention(d, p, s, False, 1.0)
        m.mlp(d, p, h, s.intermediate, 1.0)
        for conv in ("attention_conv", "mlp_conv"):
            base = torch.zeros(2, s.conv_taps, h, device=device, dtype=dtype)
            base[:, 0] = 1.0
            d[p + conv + ".base_kernel"] = base
            d[p + conv + ".kernel_projection.weight"] = m.rnd(2 * s.conv_taps * groups, h)
    sel = "candidate_selector."
    d[sel + "hidden_projection.weight"] = m.rnd(s.selector_rank, h, h ** -0.5)
    d[sel + "predecessor_codebook"] = m.rnd(s.vocab, s.selector_rank, 1.0 / math.sqrt(s.selector_rank))
    d[sel + "successor_codebook"] = m.rnd(s.vocab, s.selector_rank, 1.0 / math.sqrt(s.selector_rank))
    return DFlash2Spec(kind="dflash2", source=Path(f"random:{s.name}-dflash2-b{block}"), layer=s.layer_shape(),
                       num_layers=s.draft_layers, block_size=block, mask_token_id=s.vocab - 1,
                       target_layer_ids=tuple(ids), vocab_size=s.vocab, conv_kernel_size=s.conv_taps,
                       conv_group_size=s.conv_group, selector_rank=s.selector_rank,
                       selector_top_k=s.selector_top_k, tensors=d)


def hf_qwen38_model(spec: Qwen38Spec, device: torch.device) -> torch.nn.Module:
    """transformers' Qwen3_5ForCausalLM holding ``spec``'s own tensors (built on the meta device, then the
    tensors assigned: no second copy of the weights), eager attention."""
    import transformers as tf

    from ..oracle.hf import qwen38_hf_config
    from .shapes import assigned_hf

    config = qwen38_hf_config(spec)
    state = {n: t for n, t in spec.tensors.items() if not n.startswith("mtp.")}
    return assigned_hf(tf.Qwen3_5ForCausalLM, config, state, spec.tie_word_embeddings, device)
