"""``bloomery plan --shape``: the bench shapes as plan models (no file at all).

qwen3-8b   the ``bloomery bench`` shape (bench_shapes.SHAPES): Qwen3-8B, untied head, + z-lab's DFlash
           drafter for it (5 layers, B = 16)
qwen3-4b   likewise
tiny       likewise (the bench's test shape)
qwen38-27b the Qwen3.8-27B dense hybrid with its shipped MTP layer (plan_random: the tensor table at the real
           widths, the same one ``--measure`` fills with random weights on the device)
"""

from __future__ import annotations

from bloomery_gates.errors import InputError

from .model import AttnGroup, PlanDraft, PlanModel, Recurrent


def _qwen3_layer_elems(h: int, heads: int, kv: int, hd: int, inter: int) -> int:
    return h * (heads * hd) * 2 + 2 * h * kv * hd + 3 * h * inter + 2 * hd + 2 * h


def _bench(name: str) -> tuple[PlanModel, PlanDraft]:
    from ..bench.shapes import SHAPES

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
    from ..families.qwen38 import plan_shape as q

    w, mtp = q.elems()
    conv = 2 * q.NK * q.DK + q.NV * q.DV
    rot = int(q.HD * q.ROT)
    lin = sum(t == "linear_attention" for t in q.layer_types())
    t = PlanModel("shape:qwen38-27b", "qwen38", "shape", q.H, q.HEADS, q.VOCAB, q.INTER, 262144, w, 2 * w, False,
                  q.VOCAB * q.H, (AttnGroup(q.LAYERS - lin, q.KV, q.HD),), rot,
                  (Recurrent("deltanet", lin, q.NV * q.DK * q.DV, (q.CONV_K - 1) * conv, conv),), mtp, 1)
    d = PlanDraft("shape:qwen38-27b-mtp", "mtp", mtp, 1, q.KV, q.HD, rot, 4, q.VOCAB)
    return t, d


SHAPE_NAMES = ("qwen3-8b", "qwen3-4b", "qwen38-27b", "tiny")


def plan_shape(name: str) -> tuple[PlanModel, PlanDraft]:
    if name == "qwen38-27b":
        return _qwen38_27b()
    if name in ("qwen3-8b", "qwen3-4b", "tiny"):
        return _bench(name)
    raise InputError("--shape", f"{name!r}: expected one of {', '.join(SHAPE_NAMES)}")
