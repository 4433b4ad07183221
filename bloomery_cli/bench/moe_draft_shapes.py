"""The real drafts of the MoE bench shapes (``bloomery bench moe --drafts``): their shapes, random weights made on
the device like the target's (``moe_shapes``), and the draft engines the gates drive (gates/qwen35moe_mtp.py,
qwen35moe_dflash.py, mimo2_mtp.py).

qwen35moe-35b-a3b  mtp     Qwen3.6-35B-A3B's MTP block (FAMILIES_MOE.md 4.1): fc [H, 2H] over [E(tok) ; h], one
                           gated full-attention layer of the trunk's shape whose FFN is the MoE (256 experts x 512
                           top-8 + the gated shared expert of 512), the target's head; ``MTPDraft``, chained. Natural
                           width: 3 drafts (verify 4), the qwen35moe-mtp gate's.
                   dflash  z-lab/Qwen3.6-35B-A3B-DFlash's shape: 8 layers, hidden 2048, 32 heads / 4 kv heads x 128,
                           MLP 6144, block 16, target layers (1, 10, 19, 28, 37) (its config.json as asserted by a
                           public parser test; the file itself was not read here); ``DFlashDraft`` (the
                           qwen35moe-dflash gate's engine). Natural width: the block, 16 (15 drafts).
mimo2-flash        mtp     MiMo-V2-Flash's 3 MTP layers (4.2): eh_proj [H, 2H], one SWA layer of the trunk's SWA shape
                           with sinks, a dense MLP of 16384; ``Mimo2MTPDraft`` (the mimo2-mtp gate's). Natural
                           width: 3 drafts (verify 4), one per layer.
qwen35moe-tiny, mimo2-tiny  the same kinds at CPU sizes (DFlash: block 4), for the tests.

Values as the target's (layer matrices N(0, 0.002^2), routers N(0, 1/H), norms at gain 1): no cost depends on
them, and the replay draft (``common.ReplayDraft``) replaces the proposals anyway.

``grid``: the verify widths the bench runs the drafted loop at for the cost policy's comparison (1 = plain, the
draft's context still following). An MTP draft at verify width k runs k-1 chained steps (its natural cost); a DFlash
draft runs its whole block whatever k (the verify takes the first k-1 drafts).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from bloomery_gates.errors import InputError
from bloomery_gates.spec import DFlashSpec, Mimo2MTPSpec, MTPSpec

from ..formats.dflash import default_target_layer_ids
from .hybrid_shapes import _Maker
from .moe_shapes import MOE_SHAPES, MoEBenchShape, _hybrid, mimo2_attention, qwen35moe_ffn
from .shapes import BenchShape, random_dflash, weight_bytes

KINDS = ("mtp", "dflash")


@dataclass(frozen=True)
class DraftShape:
    kind: str                              # "mtp" | "dflash"
    width: int                             # the natural verify width: the anchor + the draft's proposals
    grid: tuple[int, ...]                  # verify widths run for the cost policy's comparison
    layers: int = 1                        # MTP layers (mimo2: chained, one draft each) or DFlash layers
    heads: int = 0                         # DFlash: its Qwen3 layers' shape
    kv_heads: int = 0
    head_dim: int = 0
    intermediate: int = 0
    target_layer_ids: tuple[int, ...] = ()
    about: str = ""

    def facts(self) -> dict[str, Any]:
        return asdict(self)


DRAFTS: dict[str, dict[str, DraftShape]] = {
    "qwen35moe-35b-a3b": {
        "mtp": DraftShape("mtp", 4, (1, 2, 3, 4, 6, 8),
                          about="Qwen3.6-35B-A3B MTP block: 1 gated attention layer + MoE FFN, 3 chained drafts"),
        "dflash": DraftShape("dflash", 16, (1, 2, 4, 8, 16), 8, 32, 4, 128, 6144, (1, 10, 19, 28, 37),
                             about="z-lab/Qwen3.6-35B-A3B-DFlash shape: 8 layers, block 16"),
    },
    "mimo2-flash": {
        "mtp": DraftShape("mtp", 4, (1, 2, 3, 4), 3,
                          about="MiMo-V2-Flash MTP: 3 SWA layers (sinks) + dense MLP 16384, one draft each"),
    },
    "qwen35moe-tiny": {
        "mtp": DraftShape("mtp", 4, (1, 2, 3, 4), about="tiny MTP block (MoE FFN), 3 chained drafts"),
        "dflash": DraftShape("dflash", 4, (1, 2, 3, 4), 2, 4, 2, 16, 64, (0, 1, 2), about="tiny DFlash, block 4"),
    },
    "mimo2-tiny": {
        "mtp": DraftShape("mtp", 4, (1, 2, 3, 4), 3, about="tiny mimo2 MTP: 3 SWA layers, one draft each"),
    },
}


def parse_drafts(value: str | None, shape: str) -> tuple[str, ...]:
    """``--drafts`` -> the draft kinds to run: None -> every draft the shape has, "none" -> none, else a comma list
    of kinds the shape has (each once); anything else is an ``InputError`` naming the flag (exit 2)."""
    have = tuple(DRAFTS.get(shape, {}))
    if value is None:
        return have
    if value.strip() == "none":
        return ()
    return check_drafts(tuple(k.strip() for k in value.split(",")), shape)


def check_drafts(kinds: tuple[str, ...], shape: str) -> tuple[str, ...]:
    """``kinds`` if each is a draft ``shape`` has, named once; else an ``InputError`` naming ``--drafts`` (exit 2)."""
    have = tuple(DRAFTS.get(shape, {}))
    for k in kinds:
        if k not in KINDS:
            raise InputError("--drafts", f"{k!r}: expected a comma list of {', '.join(KINDS)}, or none")
        if k not in have:
            raise InputError("--drafts", f"{k}: {shape} has no {k} draft (its drafts: {', '.join(have) or 'none'})")
    if len(set(kinds)) != len(kinds):
        raise InputError("--drafts", f"{','.join(kinds)!r}: a draft named twice")
    return kinds


def random_qwen35moe_mtp(s: MoEBenchShape, target, device: torch.device, dtype: torch.dtype,
                         seed: int = 11) -> MTPSpec:
    """The MTP block at the target's shape: fc, its three norms (zero-centred, 0), one gated attention layer and
    the target's MoE FFN under ``mtp.layers.0.``."""
    m, h = _Maker(device, dtype, seed), s.hidden
    t: dict[str, torch.Tensor] = {"mtp.fc.weight": m.rnd(h, 2 * h)}
    for n in ("mtp.norm", "mtp.pre_fc_norm_embedding", "mtp.pre_fc_norm_hidden",
              "mtp.layers.0.input_layernorm", "mtp.layers.0.post_attention_layernorm"):
        t[n + ".weight"] = m.full(h, 0.0)
    m.attention(t, "mtp.layers.0.", _hybrid(s), True, 0.0)
    qwen35moe_ffn(m, t, "mtp.layers.0.mlp.", s, dtype)
    return MTPSpec("mtp", Path(f"random:{s.name}-mtp"), "random", target.layer, target.hybrid.rotary_dim, 1,
                   s.vocab, t)


def random_mimo2_mtp(s: MoEBenchShape, target, layers: int, device: torch.device, dtype: torch.dtype,
                     seed: int = 12) -> Mimo2MTPSpec:
    """``layers`` MTP layers of the target's SWA shape (sinks 0) and dense MLP width (gains 1)."""
    m, h, a = _Maker(device, dtype, seed), s.hidden, target.mimo.swa
    ff = target.layer.intermediate_size
    t: dict[str, torch.Tensor] = {}
    for k in range(layers):
        p = f"model.mtp.layers.{k}."
        for n in ("enorm", "hnorm", "input_layernorm", "pre_mlp_layernorm", "final_layernorm"):
            t[p + n + ".weight"] = m.full(h, 1.0)
        t[p + "eh_proj.weight"] = m.rnd(h, 2 * h)
        mimo2_attention(m, t, p, a, h)
        m.swiglu(t, p, h, ff)
    return Mimo2MTPSpec(kind="mimo2-mtp", source=Path(f"random:{s.name}-mtp"), source_format="random", attn=a,
                        hidden_size=h, intermediate_size=ff, rms_eps=target.layer.rms_eps,
                        value_scale=target.mimo.value_scale, num_layers=layers, vocab_size=s.vocab, tensors=t)


def random_moe_dflash(s: MoEBenchShape, ds: DraftShape, depth: int, device: torch.device, dtype: torch.dtype,
                      seed: int = 13) -> DFlashSpec:
    """A DFlash drafter of ``ds``'s shape (``bench.shapes.random_dflash``), reading the target layers ``ds`` names,
    or z-lab's default spread over the ``depth`` layers run when ``--layers`` cut one of them away."""
    bs = BenchShape(f"{s.name}-dflash", s.hidden, depth, ds.heads, ds.kv_heads, ds.head_dim, ds.intermediate,
                    s.vocab, ds.layers, ds.width, rope_theta=1e7 if s.hidden > 64 else 10000.0)
    ids = ds.target_layer_ids
    if max(ids) >= depth:
        ids = default_target_layer_ids(len(ids), depth) if depth >= 4 else tuple(range(min(len(ids), depth)))
    m = _Maker(device, dtype, seed)
    return random_dflash(bs, ids, m.rnd, lambda n: m.full(n, 1.0), f"random:{s.name}-dflash-b{ds.width}")


def build_draft(kind: str, s: MoEBenchShape, engine, depth: int, max_len: int):
    """(draft engine, its weight bytes, its DraftShape) of ``kind`` bound to ``engine`` (the bench's target)."""
    ds = DRAFTS[s.name][kind]
    dev, dt, spec = engine.device, engine.dtype, engine.spec
    if kind == "dflash":
        from bloomery_gates.kernels.drafts.dflash import DFlashDraft

        dspec = random_moe_dflash(s, ds, depth, dev, dt)
        return DFlashDraft(dspec, engine, max_len), weight_bytes(dspec.tensors), ds
    if s.family == "mimo2":
        from bloomery_gates.kernels.families.mimo2.mtp import Mimo2MTPDraft

        mspec = random_mimo2_mtp(s, spec, ds.layers, dev, dt)
        return Mimo2MTPDraft(mspec, engine, max_len), weight_bytes(mspec.tensors), ds
    from bloomery_gates.kernels.drafts.mtp import MTPDraft

    mspec = random_qwen35moe_mtp(s, spec, dev, dt)
    return MTPDraft(mspec, engine, max_len, max(ds.grid) - 1), weight_bytes(mspec.tensors), ds


def set_width(draft, ds: DraftShape, k: int) -> None:
    """An MTP draft at verify width k >= 2 runs k-1 chained steps (mimo2: its first k-1 layers); a DFlash draft
    always runs its block. Call before the run (``prompt`` sizes the chain's state)."""
    if ds.kind == "mtp" and k > 1:
        draft.width = k - 1


assert all(n in MOE_SHAPES for n in DRAFTS)
