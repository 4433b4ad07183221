"""MoE shapes for ``bloomery bench moe --shape``: random weights of a real MoE shape made on the device, one
shape per MoE family (the engines are ``kernels.families.qwen35moe.model`` and ``kernels.families.mimo2.model``).

qwen35moe-35b-a3b  Qwen3.6-35B-A3B (docs/FAMILIES_MOE.md 4.1: hidden 2048, 40 layers 3 DeltaNet : 1 gated attention,
                   256 experts of width 512, top-8, one gated shared expert of width 512, vocab 248320)
mimo2-flash        MiMo-V2-Flash (4.2: hidden 4096, 48 layers, full attention at layers 0, 6, 12, ... and SWA
                   (window 128) elsewhere, layer 0 a dense MLP of width 16384, then 256 experts of width 2048,
                   top-8, sigmoid router, no shared expert, vocab 152576). 309 B weights (618 GB in bf16) do not fit
                   one H200: ``fit_layers`` (8) is the default depth, the byte counts are also given at full depth.
qwen35moe-tiny, mimo2-tiny  CPU-sized twins for the tests.

Values: layer matrices N(0, 0.002^2), embeddings N(0, 1), the untied head a row permutation of the embedding
(bench_hybrid_shapes' recipe: the residual stream stays the token's embedding row plus small terms). The router
Wr [E, H] is N(0, 1/H): on the normed rows (RMS 1) each expert's logit is then ~N(0, 1) and independent across
tokens, so over a decode every expert is picked about equally often (as a router trained with a load-balancing
loss spreads its load; the bench prints the measured spread) and distinct tokens pick independent expert sets (a
trained router's rows in one window share some experts: this routing is the unfavourable end of realistic).
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from bloomery_gates.spec import AttnShape, LayerShape, Mimo2Spec, MimoShape, MoEShape, Qwen35MoeSpec

from .hybrid_shapes import HybridBenchShape, _Maker, random_qwen38


@dataclass(frozen=True)
class MoEBenchShape:
    name: str
    family: str                         # "qwen35moe" | "mimo2"
    hidden: int
    layers: int                         # the real depth
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    experts: int
    top_k: int
    expert_ff: int
    shared_ff: int | None = None        # qwen35moe: the gated shared expert's width
    lin_key_heads: int = 0              # qwen35moe: the Gated DeltaNet
    lin_value_heads: int = 0
    lin_key_dim: int = 0
    lin_value_dim: int = 0
    v_head_dim: int = 0                 # mimo2: value head dim, dense MLP width, SWA window, first dense layers
    dense_ff: int = 0
    window: int = 0
    dense_layers: int = 0
    full_every: int = 4                 # qwen35moe: every 4th layer full; mimo2: layers 0, 6, 12, ... full
    fit_layers: int | None = None       # the default depth when the real one does not fit one device
    about: str = ""

    def facts(self) -> dict[str, Any]:
        return asdict(self)

    def moe(self) -> MoEShape:
        if self.family == "qwen35moe":
            return MoEShape(self.experts, self.top_k, self.expert_ff, self.shared_ff, True, "softmax")
        return MoEShape(self.experts, self.top_k, self.expert_ff, None, False, "sigmoid", 1, 1, True, 1.0)


MOE_SHAPES = {
    "qwen35moe-35b-a3b": MoEBenchShape(
        "qwen35moe-35b-a3b", "qwen35moe", 2048, 40, 16, 2, 256, 248320, 256, 8, 512, shared_ff=512,
        lin_key_heads=16, lin_value_heads=32, lin_key_dim=128, lin_value_dim=128,
        about="Qwen3.6-35B-A3B: 30 Gated DeltaNet + 10 gated attention layers, every FFN 256 experts x 512 top-8 + "
              "a gated shared expert of 512, untied head"),
    "mimo2-flash": MoEBenchShape(
        "mimo2-flash", "mimo2", 4096, 48, 64, 4, 192, 152576, 256, 8, 2048, v_head_dim=128, dense_ff=16384,
        window=129, dense_layers=1, full_every=6, fit_layers=8,
        about="MiMo-V2-Flash: 8 full + 40 SWA (window 128, 2x kv heads, sinks) attention layers, layer 0 dense "
              "(16384), 47 MoE layers of 256 experts x 2048 top-8 (sigmoid router), untied head"),
    "qwen35moe-tiny": MoEBenchShape(
        "qwen35moe-tiny", "qwen35moe", 64, 4, 4, 2, 16, 512, 8, 2, 32, shared_ff=32, lin_key_heads=2,
        lin_value_heads=4, lin_key_dim=16, lin_value_dim=16, about="a CPU-sized qwen35moe shape for tests"),
    "mimo2-tiny": MoEBenchShape(
        "mimo2-tiny", "mimo2", 64, 4, 4, 1, 32, 512, 8, 2, 32, v_head_dim=16, dense_ff=128, window=17,
        dense_layers=1, full_every=3, about="a CPU-sized mimo2 shape for tests"),
}


def _hybrid(s: MoEBenchShape) -> HybridBenchShape:
    return HybridBenchShape(s.name, s.hidden, s.layers, s.heads, s.kv_heads, s.head_dim, s.expert_ff, s.vocab,
                            s.lin_key_heads, s.lin_value_heads, s.lin_key_dim, s.lin_value_dim,
                            full_every=s.full_every, rope_theta=1e7 if s.hidden > 64 else 10000.0)


def _experts(m: _Maker, t: dict, p: str, s: MoEBenchShape, router_dtype: torch.dtype) -> None:
    """mlp.gate.weight [E, H] ~ N(0, 1/H), mlp.experts.gate_up_proj [E, 2F, H], mlp.experts.down_proj [E, H, F]."""
    h, e, f = s.hidden, s.experts, s.expert_ff
    t[p + "gate.weight"] = torch.randn(e, h, generator=m.gen, device=m.dev, dtype=router_dtype).mul_(h ** -0.5)
    t[p + "experts.gate_up_proj"] = torch.randn(e, 2 * f, h, generator=m.gen, device=m.dev, dtype=m.dt).mul_(0.002)
    t[p + "experts.down_proj"] = torch.randn(e, h, f, generator=m.gen, device=m.dev, dtype=m.dt).mul_(0.002)


def qwen35moe_ffn(m: _Maker, t: dict, p: str, s: MoEBenchShape, dtype: torch.dtype) -> None:
    """One qwen35moe MoE FFN under ``p`` (".mlp."): the routed experts (``_experts``) and the gated shared expert."""
    _experts(m, t, p, s, dtype)
    gu = m.rnd(2 * s.shared_ff, s.hidden)
    t[p + "shared_expert.gate_proj.weight"], t[p + "shared_expert.up_proj.weight"] = gu[:s.shared_ff], gu[s.shared_ff:]
    t[p + "shared_expert.down_proj.weight"] = m.rnd(s.hidden, s.shared_ff)
    t[p + "shared_expert_gate.weight"] = m.rnd(1, s.hidden)


def random_qwen35moe(s: MoEBenchShape, device: torch.device, dtype: torch.dtype, layers: int,
                     seed: int = 0) -> Qwen35MoeSpec:
    """bench_hybrid_shapes' qwen38 trunk at this shape (``layers`` of the 3:1 pattern) with every FFN the MoE."""
    hs = _hybrid(s)
    q38, _ = random_qwen38(hs, device, dtype, layers, seed)
    t = {n: x for n, x in q38.tensors.items() if ".mlp." not in n}
    m = _Maker(device, dtype, seed + 7)
    for i in range(layers):
        qwen35moe_ffn(m, t, f"model.layers.{i}.mlp.", s, dtype)
    fields = {f.name: getattr(q38, f.name) for f in dataclasses.fields(q38)}
    fields.update(family="qwen35moe", source=Path(f"random:{s.name}"), tensors=t)
    return Qwen35MoeSpec(**fields, moe=s.moe())


def mimo2_attention(m: _Maker, t: dict, p: str, a: AttnShape, h: int) -> None:
    """A MiMo-V2 attention's tensors under prefix p (q/k/v rows of one draw, o_proj, the sink bias when it has
    sinks): the trunk's layers and its MTP layers alike."""
    nq, nk, nv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim, a.num_kv_heads * a.v_head_dim
    qkv = m.rnd(nq + nk + nv, h)
    t[p + "self_attn.q_proj.weight"], t[p + "self_attn.k_proj.weight"], t[p + "self_attn.v_proj.weight"] = \
        qkv[:nq], qkv[nq:nq + nk], qkv[nq + nk:]
    t[p + "self_attn.o_proj.weight"] = m.rnd(h, a.num_heads * a.v_head_dim)
    if a.sinks:
        t[p + "self_attn.attention_sink_bias"] = torch.zeros(a.num_heads, device=qkv.device, dtype=qkv.dtype)


def mimo2_layer_types(s: MoEBenchShape, layers: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    attn = tuple("full_attention" if i % s.full_every == 0 else "sliding_attention" for i in range(layers))
    mlp = tuple("dense" if i < s.dense_layers else "sparse" for i in range(layers))
    return attn, mlp


def random_mimo2(s: MoEBenchShape, device: torch.device, dtype: torch.dtype, layers: int,
                 seed: int = 0) -> Mimo2Spec:
    """The MiMo-V2-Flash trunk at this shape, its first ``layers`` layers (norms 1, sinks 0, router bias 0)."""
    m = _Maker(device, dtype, seed)
    h, rot = s.hidden, int(s.head_dim * 0.334)
    full = AttnShape(s.heads, s.kv_heads, s.head_dim, s.v_head_dim, 5e6, rot, None, False)
    swa = AttnShape(s.heads, 2 * s.kv_heads, s.head_dim, s.v_head_dim, 1e4, rot, s.window, True)
    attn, mlp = mimo2_layer_types(s, layers)
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": m.rnd(s.vocab, h, 1.0),
                                  "model.norm.weight": m.full(h, 1.0)}
    t["lm_head.weight"] = t["model.embed_tokens.weight"][torch.randperm(s.vocab, generator=m.gen, device=device)]
    for i in range(layers):
        p, a = f"model.layers.{i}.", swa if attn[i] == "sliding_attention" else full
        t[p + "input_layernorm.weight"], t[p + "post_attention_layernorm.weight"] = m.full(h, 1.0), m.full(h, 1.0)
        mimo2_attention(m, t, p, a, h)
        if mlp[i] == "dense":
            m.swiglu(t, p, h, s.dense_ff)
        else:
            _experts(m, t, p + "mlp.", s, torch.float32)
            t[p + "mlp.gate.e_score_correction_bias"] = torch.zeros(s.experts, device=device)
    layer = LayerShape(h, s.heads, s.kv_heads, s.head_dim, s.dense_ff, 1e-5, 5e6)
    mimo = MimoShape(attn, mlp, full, swa, 0.707, 0.334, s.moe(), 0)
    return Mimo2Spec(family="mimo2", source=Path(f"random:{s.name}"), source_format="random", layer=layer,
                     num_layers=layers, vocab_size=s.vocab, tie_word_embeddings=False, max_position=1 << 18,
                     tensors=t, mimo=mimo)


def build_engine(s: MoEBenchShape, device: torch.device, dtype: torch.dtype, layers: int, max_len: int):
    """(engine, spec): the family's eager target engine over random weights at ``layers`` of the shape."""
    if s.family == "qwen35moe":
        from bloomery_gates.kernels.families.qwen35moe.model import Qwen35MoeTarget

        spec = random_qwen35moe(s, device, dtype, layers)
        return Qwen35MoeTarget(spec, device, dtype, max_len), spec
    from bloomery_gates.kernels.families.mimo2.model import Mimo2Target

    spec = random_mimo2(s, device, dtype, layers)
    return Mimo2Target(spec, device, dtype, max_len), spec
