"""``bloomery plan --shape``: the bench shapes as plan models (no file at all).

qwen3-8b   the ``bloomery bench`` shape (bench_shapes.SHAPES): Qwen3-8B, untied head, + z-lab's DFlash
           drafter for it (5 layers, B = 16)
qwen3-4b   likewise
qwen38-27b the Qwen3.8-27B dense hybrid: H 5120, 64 layers (every 4th full attention: 16 gated-attention
           layers, 24 heads, 4 KV heads of 256, partial rotary 0.25; 48 Gated DeltaNet layers, 16 key heads and
           48 value heads of 128, conv 4), FFN 17408, vocab 248320, untied; + a DFlash2 drafter of the bench_dflash2
           shape (5 layers, B = 8, 32 heads, 8 KV heads of 128)
"""

from __future__ import annotations

from .errors import InputError
from .plan_model import AttnGroup, PlanDraft, PlanModel, Recurrent


def _qwen3_layer_elems(h: int, heads: int, kv: int, hd: int, inter: int) -> int:
    return h * (heads * hd) * 2 + 2 * h * kv * hd + 3 * h * inter + 2 * hd + 2 * h


def _bench(name: str) -> tuple[PlanModel, PlanDraft]:
    from .bench_shapes import SHAPES

    s = SHAPES[name]
    layer = _qwen3_layer_elems(s.hidden, s.heads, s.kv_heads, s.head_dim, s.intermediate)
    w = s.layers * layer + 2 * s.vocab * s.hidden + s.hidden
    t = PlanModel(f"shape:{name}", "qwen3", "shape", s.hidden, s.heads, s.vocab, s.intermediate, 40960, w, 2 * w,
                  False, s.vocab * s.hidden, (AttnGroup(s.layers, s.kv_heads, s.head_dim),), s.head_dim)
    dw = s.draft_layers * layer + s.hidden * 5 * s.hidden + 2 * s.hidden
    d = PlanDraft(f"shape:{name}-dflash", "dflash", dw, s.draft_layers, s.kv_heads, s.head_dim, s.head_dim, s.block,
                  s.vocab)
    return t, d


def _qwen38_27b() -> tuple[PlanModel, PlanDraft]:
    h, inter, vocab = 5120, 17408, 248320
    heads, kv, hd = 24, 4, 256
    nk, nv, dk, dv, k = 16, 48, 128, 128, 4
    conv = 2 * nk * dk + nv * dv
    attn = h * heads * hd * 2 + h * heads * hd + 2 * h * kv * hd + 2 * hd + 2 * h   # q + gate, o, k, v, norms
    lin = h * conv + h * nv * dv + 2 * h * nv + conv * k + nv * dv * h + 2 * nv + dv + 2 * h   # qkv, z, a/b, conv, out
    mlp = 3 * h * inter
    w = 16 * (attn + mlp) + 48 * (lin + mlp) + 2 * vocab * h + h
    t = PlanModel("shape:qwen38-27b", "qwen38", "shape", h, heads, vocab, inter, 262144, w, 2 * w, False, vocab * h,
                  (AttnGroup(16, kv, hd),), int(hd * 0.25), (Recurrent("deltanet", 48, nv * dk * dv, (k - 1) * conv),))
    dl = _qwen3_layer_elems(h, 32, 8, 128, inter)
    d = PlanDraft("shape:qwen38-27b-dflash2", "dflash2", 5 * dl + 5 * h * h + 2 * h, 5, 8, 128, 128, 8, vocab)
    return t, d


SHAPE_NAMES = ("qwen3-8b", "qwen3-4b", "qwen38-27b")


def plan_shape(name: str) -> tuple[PlanModel, PlanDraft]:
    if name == "qwen38-27b":
        return _qwen38_27b()
    if name in ("qwen3-8b", "qwen3-4b"):
        return _bench(name)
    raise InputError("--shape", f"{name!r}: expected one of {', '.join(SHAPE_NAMES)}")
