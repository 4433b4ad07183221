"""The FFN slot of a decoder layer, pluggable per family (device side; mirror: ``reference.families.ffn``).

``ffn_for(spec)(spec, t, p, a)`` maps normed rows a [N, R, H] to the FFN output [N, R, H]; ``p`` is the layer's
prefix ("model.layers.3." or "mtp.layers.0."), tensors under ``p + "mlp."``:
  dense (spec without ``moe``): swiglu(a; mlp.{gate,up,down}_proj)
  MoE (spec.moe, ``bloomery_gates.spec.MoEShape``): router mlp.gate.weight (+ e_score_correction_bias), routed
      experts mlp.experts.{gate_up_proj, down_proj}, shared expert mlp.shared_expert.* (+ mlp.shared_expert_gate)

Inside ``record_routing()`` every MoE FFN call appends (p, Routing) to the yielded list (``note_routing``: the
gates' tier-1 check of the chosen experts and a draft's router lines, the fixtures' load-balancing loss). Inside
``forced_routing(fn)`` (benches only: the MoE bench's worst case, every row its own expert set) ``route`` returns
``fn(routing)`` instead of the router's choice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from bloomery_gates.spec import MoEShape

from ..ops import moe as kmoe
from ..ops.mlp import swiglu

T = torch.Tensor
FFN = Callable[[object, Mapping[str, T], str, T], T]
_RECORD: ContextVar[list | None] = ContextVar("bloomery_moe_routing", default=None)
_FORCE: ContextVar[Callable | None] = ContextVar("bloomery_moe_forced", default=None)


@contextmanager
def record_routing() -> Iterator[list[tuple[str, kmoe.Routing]]]:
    """Collect (layer prefix, Routing) of every MoE FFN call made inside the block, in call order."""
    rec: list[tuple[str, kmoe.Routing]] = []
    token = _RECORD.set(rec)
    try:
        yield rec
    finally:
        _RECORD.reset(token)


def note_routing(p: str, routing: kmoe.Routing) -> None:
    """Inside ``record_routing()``: append (the layer prefix ``p``, ``routing``). Every MoE FFN reports here (this
    module's, and a family's own MoE: deepseek4's ``ffn_at``), so a gate can read a draft's experts off one
    call without the draft carrying them."""
    rec = _RECORD.get()
    if rec is not None:
        rec.append((p, routing))


@contextmanager
def forced_routing(fn: Callable[[kmoe.Routing], kmoe.Routing]) -> Iterator[None]:
    """Inside the block every ``route`` call returns ``fn(the router's Routing)`` (a bench's planted routing)."""
    token = _FORCE.set(fn)
    try:
        yield
    finally:
        _FORCE.reset(token)


def dense_ffn(spec, t: Mapping[str, T], p: str, a: T) -> T:
    m = p + "mlp."
    return swiglu(a, t[m + "gate_proj.weight"], t[m + "up_proj.weight"], t[m + "down_proj.weight"])


def route(moe: MoEShape, t: Mapping[str, T], m: str, x: T) -> kmoe.Routing:
    """The router of ``moe`` on rows x [N, H] (tensors under ``m`` = p + "mlp.")."""
    logits = kmoe.router_logits(x, t[m + "gate.weight"])
    if moe.router == "softmax":
        r = kmoe.softmax_topk(logits, moe.top_k)
    else:
        r = kmoe.sigmoid_group_topk(logits, t[m + "gate.e_score_correction_bias"], moe.top_k, moe.n_group,
                                    moe.topk_group, moe.norm_topk, moe.routed_scale)
    force = _FORCE.get()
    return r if force is None else force(r)


def moe_ffn(spec, t: Mapping[str, T], p: str, a: T, routed: Callable = kmoe.routed_experts) -> T:
    moe: MoEShape = spec.moe
    m, shape = p + "mlp.", a.shape
    x = a.reshape(-1, shape[-1])
    routing = route(moe, t, m, x)
    note_routing(p, routing)
    out = routed(x, routing, t[m + "experts.gate_up_proj"], t[m + "experts.down_proj"])
    if moe.shared_ff is not None:
        s = m + "shared_expert."
        gate = t[m + "shared_expert_gate.weight"] if moe.shared_gated else None
        out = out + kmoe.shared_expert(x, t[s + "gate_proj.weight"], t[s + "up_proj.weight"], t[s + "down_proj.weight"],
                                       gate)
    return out.view(shape)


def moe_ffn_train(spec, t: Mapping[str, T], p: str, a: T) -> T:
    """``moe_ffn`` with every expert run on every row (``kmoe.routed_experts_dense``): the same function, cheaper to
    differentiate over many rows (training only)."""
    return moe_ffn(spec, t, p, a, routed=kmoe.routed_experts_dense)


def ffn_for(spec, train: bool = False) -> FFN:
    """The FFN of ``spec``'s layers: MoE when the spec carries ``moe``, else dense SwiGLU."""
    if getattr(spec, "moe", None) is None:
        return dense_ffn
    return moe_ffn_train if train else moe_ffn
