"""The Qwen3.8-27B hybrid shape for ``bloomery plan --shape qwen38-27b``: its tensor table (HF names, the qwen38
fixture's layout at the real widths) and, for ``--measure``, random weights made on the device.

    H 5120, 64 layers: layer l is full attention when (l + 1) % 4 == 0 (16 gated-attention layers: 24 heads,
    4 KV heads of 256, q_proj [2 nh d, H] = query and output gate, partial rotary 0.25), else Gated DeltaNet
    (16 key heads and 48 value heads of 128, conv 4); SwiGLU FFN 17408; vocab 248320, untied head; one shipped MTP
    layer (``mtp.*``: fc [H, 2H], its norms and one gated-attention decoder layer).

Values: N(0, 0.002^2) matrices, zero norms (gain 1 + w), as bench_shapes does for qwen3: no cost depends on them.
"""

from __future__ import annotations

from math import prod
from pathlib import Path

H, LAYERS, INTER, VOCAB = 5120, 64, 17408, 248320
HEADS, KV, HD, ROT = 24, 4, 256, 0.25
NK, NV, DK, DV, CONV_K = 16, 48, 128, 128, 4


def layer_types() -> tuple[str, ...]:
    return tuple("full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(LAYERS))


def _attn(p: str) -> dict[str, tuple[int, ...]]:
    return {p + "self_attn.q_proj.weight": (2 * HEADS * HD, H), p + "self_attn.k_proj.weight": (KV * HD, H),
            p + "self_attn.v_proj.weight": (KV * HD, H), p + "self_attn.o_proj.weight": (H, HEADS * HD),
            p + "self_attn.q_norm.weight": (HD,), p + "self_attn.k_norm.weight": (HD,)}


def _common(p: str) -> dict[str, tuple[int, ...]]:
    return {p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
            p + "mlp.gate_proj.weight": (INTER, H), p + "mlp.up_proj.weight": (INTER, H),
            p + "mlp.down_proj.weight": (H, INTER)}


def shapes() -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """(target tensors, MTP tensors): HF name -> shape."""
    conv = 2 * NK * DK + NV * DV
    t: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, H), "model.norm.weight": (H,),
                                     "lm_head.weight": (VOCAB, H)}
    for i, kind in enumerate(layer_types()):
        p = f"model.layers.{i}."
        t.update(_common(p))
        if kind == "full_attention":
            t.update(_attn(p))
        else:
            a = p + "linear_attn."
            t.update({a + "in_proj_qkv.weight": (conv, H), a + "in_proj_z.weight": (NV * DV, H),
                      a + "in_proj_a.weight": (NV, H), a + "in_proj_b.weight": (NV, H),
                      a + "conv1d.weight": (conv, 1, CONV_K), a + "A_log": (NV,), a + "dt_bias": (NV,),
                      a + "norm.weight": (DV,), a + "out_proj.weight": (H, NV * DV)})
    m = {"mtp.fc.weight": (H, 2 * H), "mtp.norm.weight": (H,), "mtp.pre_fc_norm_embedding.weight": (H,),
         "mtp.pre_fc_norm_hidden.weight": (H,)}
    m.update(_common("mtp.layers.0."))
    m.update(_attn("mtp.layers.0."))
    return t, m


def elems() -> tuple[int, int]:
    t, m = shapes()
    return sum(prod(s) for s in t.values()), sum(prod(s) for s in m.values())


def random_specs(device, dtype, seed: int = 0):
    """(Qwen38Spec, MTPSpec) of this shape, every tensor made on ``device`` in ``dtype``."""
    import torch

    from bloomery_gates.spec import HybridShape, LayerShape, MTPSpec, Qwen38Spec

    gen = torch.Generator(device=device).manual_seed(seed)

    def make(shape: tuple[int, ...], name: str) -> torch.Tensor:
        if len(shape) == 1 and not name.endswith(("A_log", "dt_bias")):
            return torch.zeros(shape, device=device, dtype=dtype)
        return torch.randn(shape, generator=gen, device=device, dtype=dtype).mul_(0.002)

    ts, ms = shapes()
    layer = LayerShape(H, HEADS, KV, HD, INTER, 1e-6, 1e7)
    hy = HybridShape(layer_types(), ROT, int(HD * ROT), NK, NV, DK, DV, CONV_K, 1)
    target = Qwen38Spec("qwen38", Path("random:qwen38-27b"), "random", layer, LAYERS, VOCAB, False, 262144,
                        {n: make(s, n) for n, s in ts.items()}, hy)
    mtp = MTPSpec("mtp", Path("random:qwen38-27b-mtp"), "random", layer, int(HD * ROT), 1, VOCAB,
                  {n: make(s, n) for n, s in ms.items()})
    return target, mtp
