"""``bloomery plan``: the context / memory plan of a target with its draft as one term, and the ctx-first rule.

From headers alone (``plan_model``), in the run dtype's element size e, for a context of C positions per slot
and S slots. The terms follow what this harness's device engine allocates (kernels/families, kernels/drafts):

    target weights   W_t = e * (weight elements, in-file MTP excluded) (+ e * V H: a tied head is cast as its own
                     copy, except on the host when the file already holds the run dtype) + the bytes held whatever
                     the run dtype (``fixed_bytes``: MXFP4 experts at n/2 + n/32, int64 tables)
    per position     p_t = 2 e sum_groups(layers kv_heads head_dim) + 2 * 4 rotary_dim + 8      (KV, RoPE cos/sin
                     f32, the int64 key positions: ``key_position_bytes``, 0 where the engine holds none)
                     + e position_elems (a family's other rows by position);
                     a sliding-window group keeps min(C, window) positions
    per slot         s_t = sum_recurrent layers * (4 state_f32 + e conv)                         (DeltaNet / Mamba-2
                     state and conv tail: per slot, not per position)
    the draft D      W_d = e * draft weight elements (+ its own embed / head copies)
                     p_d = 2 e layers kv_heads head_dim + 2 * 4 rotary_dim + 8                  (its own KV store)
                     arena_d = e * (R - 1) V  + 8 R                                             (its logits / ids)
                     extra rows: the target's caches hold R more positions (R = the verify's rows), a recurrent
                     verify keeps R per-row states [R x state_f32] f32 per linear layer until the commit (V_R)
    workspace        ws(r, C) = the largest phase of one pass of r rows over C keys (r = the larger of the prefill
                     chunk and R), T = e (L + 1) r n_s H the taps every layer's output keeps for the pass
                     (n_s: the residual streams, 1 or a hyper-connected family's count):
                       attention  r C (s heads + 2) + T + 6 e r W    (the f32 scores and their softmax alive at once,
                                                                      s = 8, + e for the probabilities' cast when the
                                                                      run dtype is not f32; the mask and its negation,
                                                                      q/k/v, gate and rows, W = max(H, heads d))
                       MLP        T + 3 e r I + 2 e r H
                       head       2 T + e r V + e r H                (the taps stacked, the logits)
                       recurrent  T + r (3 e C + 8 dv nv)            (the conv buffer, the scan's rows)
                     plus, in every phase, what a recurrent pass keeps per linear layer until its commit: the conv
                     buffer [k - 1 + r, C] and a state; the transient term is max(ws(prefill rows), ws(R) + S V_R)
    runtime arena    32 MiB on CUDA (cuBLAS workspace, torch's default on sm90), 0 on the host

    bytes(C) = W_t + [W_d + arena_d] + S (C p_t + s_t) + [S (C p_d + R p_t)] + transient + runtime arena

The largest context per slot solves bytes(C) <= budget (``--gpu-mem``), capped at the target's max position;
"with" and "without" the draft. The ctx-first rule (an unset draft, ``--draft-policy auto``): the draft is
turned off when ``with < min(without, base)`` (base: ``--ctx-base``, 4096), and on a paged plan; a draft asked
for by name (``--draft PATH`` or ``--draft-policy on``) is never turned off.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bloomery_gates.dtypes import RUN
from bloomery_gates.errors import InputError

from .model import PlanDraft, PlanModel

ELEM = {k: d.itemsize for k, d in RUN.items()}          # bytes per element (bloomery_gates.dtypes)
CTX_BASE = 4096
PREFILL_ROWS = 512
CUDA_ARENA = 32 << 20
MAX_BYTES = 1 << 60            # a budget past an exbibyte is a typo, not a machine

_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "kb": 10**3, "mb": 10**6, "gb": 10**9,
          "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(text: str, flag: str = "--gpu-mem") -> int:
    """``80G``, ``24GiB``, ``141e9``, ``123456`` -> bytes (decimal K/M/G/T; KiB/MiB/GiB binary)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+]?[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise InputError(flag, f"{text!r}: expected bytes, e.g. 80G, 24GiB or 141000000000")
    x = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(x) or x > MAX_BYTES:
        raise InputError(flag, f"{text!r}: expected at most {MAX_BYTES} bytes (2^60)")
    value = int(x)
    if value <= 0:
        raise InputError(flag, f"{text!r}: expected a positive number of bytes")
    return value


@dataclass
class Terms:
    """The plan's terms in bytes (see the module doc)."""

    target_weights: int
    per_position: int            # p_t at a context past every window
    per_slot: int                # s_t
    windows: list[tuple[int, int]]   # (bytes per position, window) of the sliding groups (inside p_t when C > window)
    draft_weights: int = 0
    draft_per_position: int = 0
    draft_arena: int = 0
    verify_rows: int = 1
    verify_state: int = 0        # R per-row recurrent states
    runtime_arena: int = 0
    draft_extra_positions: int | None = None   # positions the draft's store holds past C (None: 2 R)


@dataclass
class PlanResult:
    target: str
    family: str
    draft: str | None
    draft_kind: str | None
    dtype: str
    device: str
    slots: int
    budget: int
    budget_source: str
    max_position: int
    terms: Terms
    ctx_with: int | None
    ctx_without: int
    base: int
    policy: str
    draft_on: bool
    reason: str
    at_ctx: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _kv_bytes(t: PlanModel, e: int) -> tuple[int, list[tuple[int, int]]]:
    full = sum(e * g.layers * g.kv_heads * g.kv_width for g in t.attn if g.window is None)
    swa = [(e * g.layers * g.kv_heads * g.kv_width, g.window) for g in t.attn if g.window is not None]
    return full, swa


def terms_of(t: PlanModel, d: PlanDraft | None, dtype: str, device: str) -> Terms:
    e = ELEM[dtype]
    on_host = device == "cpu"
    full, swa = _kv_bytes(t, e)
    rope = t.rope_tables * 2 * 4 * t.rotary_dim + t.key_position_bytes
    shared = on_host and t.embed_dtype == dtype      # .to() of a host tensor already in the run dtype: no copy
    w = e * t.weight_elems + (0 if shared or not t.tied else e * t.embed_elems) + (4 - e) * t.f32_elems
    w += t.fixed_bytes
    per_slot = sum(r.layers * (4 * r.state_f32 + e * r.conv) for r in t.recurrent)
    terms = Terms(w, full + rope + e * t.position_elems, per_slot, swa, runtime_arena=0 if on_host else CUDA_ARENA)
    if d is not None:
        terms.draft_weights = e * d.weight_elems + (4 - e) * d.f32_elems
        dv = d.head_dim if d.v_head_dim is None else d.v_head_dim
        terms.draft_per_position = (e * d.layers * d.kv_heads * (d.head_dim + dv) + e * d.store_elems
                                    + 2 * 4 * d.rotary_dim + 8)
        terms.draft_extra_positions = d.extra_positions
        terms.draft_arena = e * (d.verify_rows - 1) * d.vocab + 8 * d.verify_rows
        terms.verify_rows = d.verify_rows
        terms.verify_state = sum(r.layers * d.verify_rows * 4 * r.state_f32 for r in t.recurrent)
    return terms


def gathered(t: PlanModel, rows: int, e: int) -> int:
    """Routed experts (``kernels.ops.moe.routed_experts``): one chunk of P (row, choice) pairs holds its gathered
    gate_up [P, 2 ff, H] (then down [P, H, ff]) and the pairs' rows; P = min(rows k, GATHER_BUDGET // pair bytes).
    MXFP4 experts (``kernels.ops.mxfp4.routed_experts_mxfp4``): P from MXFP4_BUDGET; the decode of gate_up holds
    its int32 byte index (2 bytes a weight) beside the decoded tile, (2 + e) 2 ff H a pair, while the pairs' outputs
    so far hold rows k H e; after the last chunk the outputs, their concatenation and its float32 copy (then the
    weighted float32 product) hold rows k H max(2 e + 4, e + 8): the larger of the two phases."""
    if t.experts is None:
        return 0
    from bloomery_gates.kernels.ops.moe import GATHER_BUDGET
    from bloomery_gates.kernels.ops.mxfp4 import MXFP4_BUDGET

    ff, k, h = t.experts.expert_ff, t.experts.top_k, t.hidden
    pairs = min(rows * k, max(1, (MXFP4_BUDGET if t.experts.mxfp4 else GATHER_BUDGET) // (3 * ff * h * e)))
    if t.experts.mxfp4:
        decode = pairs * (2 * ff * h * (2 + e) + (3 * ff + 2 * h) * e) + rows * k * h * e
        return max(decode, rows * k * h * max(2 * e + 4, e + 8))
    return pairs * (2 * ff * h * e + (3 * ff + 2 * h) * e) + rows * k * h * (e + 4)


def workspace(t: PlanModel, rows: int, ctx: int, e: int, end: int | None = None, prefill: bool = False) -> int:
    """ws(r, C): the peak of one pass of ``rows`` rows over ``ctx`` keys (module doc), the largest of its phases.
    ``end``: the last key the pass writes (None: ``ctx``); a ``keys_to_end`` family scores [r, end] keys, and an
    indexer (``index_pool`` p) holds r (end + 1) mask bytes and 4 r (end // p) score bytes at attention; a
    ``prefill`` pass of a chunked recurrent form holds its chunk scratch (``prefill_scratch``) in its recurrent
    phase; ``masks_held``: the masks (2 r C bytes) and the indexer's selection are held through every phase, and
    ``held_row_bytes`` per row in every phase; ``entry_rate`` m: the keys are C + C // m (the compressed entries)."""
    chunk, one, more, per_row = t.prefill_scratch
    scratch = (one if rows <= chunk else more) + per_row * -(-rows // chunk) * chunk if prefill and chunk else 0
    end = ctx if end is None else min(end, ctx)
    keys = end if t.keys_to_end else ctx
    keys += keys // t.entry_rate if t.entry_rate else 0
    index = rows * (end + 1) + 4 * rows * (end // t.index_pool) if t.index_pool else 0
    layers = t.attention_layers + sum(r.layers for r in t.recurrent)
    taps = (layers + 1) * rows * t.residual_streams * t.hidden * e   # every layer's output rows (all HC streams)
    score = t.score_bytes or 8 + (e if e < 4 else 0)   # f32 scores + softmax, + the cast when e < 4 (or the family's)
    width = max(t.hidden, t.heads * (t.attn[0].head_dim if t.attn else t.hidden // t.heads))   # q / gate / o rows
    attn = rows * keys * (score * t.heads + 2) + taps + 6 * rows * width * e + index
    mlp = taps + 3 * rows * t.intermediate * e + 2 * rows * t.hidden * e + gathered(t, rows, e)
    head = 2 * taps + rows * t.vocab * e + rows * t.hidden * e
    rec = max((taps + scratch + rows * (3 * e * r.channels + 8 * r.state_f32 // max(1, r.channels))
               for r in t.recurrent), default=0)
    pending = sum(r.layers * (e * (r.conv + rows * r.channels) + 4 * r.state_f32) for r in t.recurrent)
    held = (rows * ctx * 2 + index if t.masks_held else 0) + rows * t.held_row_bytes
    attn += rows * t.held_row_bytes
    return max(attn, mlp + held, head + held, rec + held) + pending


def bytes_at(t: PlanModel, terms: Terms, ctx: int, slots: int, with_draft: bool, e: int,
             prefill_rows: int = PREFILL_ROWS) -> dict[str, int]:
    """Each term at a context of ``ctx`` positions per slot, and their total."""
    r = terms.verify_rows if with_draft else 1
    cap = ctx + r
    swa = sum(b * min(cap, win) for b, win in terms.windows)
    out = {"target_weights": terms.target_weights,
           "target_kv": slots * (cap * terms.per_position + swa),
           "target_state": slots * terms.per_slot,
           "workspace": max(workspace(t, min(prefill_rows, ctx), cap, e, end=min(prefill_rows, ctx), prefill=True),
                            workspace(t, r, cap, e) + (slots * terms.verify_state if with_draft else 0)),
           "runtime_arena": terms.runtime_arena}
    if with_draft:
        extra = 2 * r if terms.draft_extra_positions is None else terms.draft_extra_positions
        out.update(draft_weights=terms.draft_weights, draft_kv=slots * (ctx + extra) * terms.draft_per_position,
                   draft_arena=terms.draft_arena)
    out["total"] = sum(out.values())
    return out


def largest_ctx(t: PlanModel, terms: Terms, budget: int, slots: int, with_draft: bool, e: int,
                prefill_rows: int = PREFILL_ROWS) -> int:
    """The largest C <= max_position with bytes_at(C) <= budget (0 when not even one position fits)."""
    def fits(c: int) -> bool:
        return bytes_at(t, terms, c, slots, with_draft, e, prefill_rows)["total"] <= budget
    if fits(t.max_position):
        return t.max_position
    lo, hi = 0, t.max_position                  # bytes_at is increasing in C: bisect
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def decide(with_ctx: int, without: int, base: int, policy: str, paged: bool, draft_bytes: int) -> tuple[bool, str]:
    """The ctx-first rule; (draft on, the reason in words with the numbers)."""
    if policy == "off":
        return False, "asked off (--draft-policy off)"
    floor = min(without, base)
    if policy == "on":
        return True, (f"asked for by name: kept; a slot takes {with_ctx} positions with the draft, {without} "
                      "without")
    if paged:
        return False, f"unset: a paged plan turns the draft off; without the draft a slot takes {without}"
    if with_ctx < floor:
        under = f"under the rule's base of {base}" if base <= without else f"under the {without} it takes without"
        return False, (f"unset: the draft's {draft_bytes} bytes on the card leave a slot {with_ctx} positions, "
                       f"{under}; without the draft a slot takes {without}")
    return True, (f"unset: kept; with the draft's {draft_bytes} bytes a slot takes {with_ctx} positions, not under "
                  f"min({without}, base {base}) = {floor}")


def make_plan(t: PlanModel, d: PlanDraft | None, *, dtype: str = "bf16", device: str = "cuda", budget: int,
              budget_source: str, slots: int = 1, base: int = CTX_BASE, policy: str = "auto", paged: bool = False,
              ctx: int | None = None, prefill_rows: int = PREFILL_ROWS) -> PlanResult:
    if dtype not in ELEM:
        raise InputError("--dtype", f"{dtype!r}: expected one of {', '.join(ELEM)}")
    if slots < 1:
        raise InputError("--slots", f"{slots}: expected at least one slot")
    if policy not in ("auto", "on", "off"):
        raise InputError("--draft-policy", f"{policy!r}: expected auto, on or off")
    if ctx is not None and ctx < 1:
        raise InputError("--ctx", f"{ctx}: expected at least one position")
    if ctx is not None and ctx > t.max_position:
        raise InputError("--ctx", f"{ctx}: past the target's {t.max_position} positions (max_position_embeddings "
                                  "or its GGUF context_length); expected at most that")
    e = ELEM[dtype]
    terms = terms_of(t, d, dtype, device)
    without = largest_ctx(t, terms, budget, slots, False, e, prefill_rows)
    with_ctx = largest_ctx(t, terms, budget, slots, True, e, prefill_rows) if d is not None else None
    if d is None:
        on, reason = False, "no draft given"
    else:
        dbytes = bytes_at(t, terms, 1, 1, True, e)
        draft_bytes = dbytes["draft_weights"] + dbytes["draft_arena"]
        on, reason = decide(with_ctx or 0, without, base, policy, paged, draft_bytes)
    res = PlanResult(t.label, t.family, d.label if d else None, d.kind if d else None, dtype, device, slots, budget,
                     budget_source, t.max_position, terms, with_ctx, without, base, policy, on, reason,
                     notes=list(t.notes))
    alone = bytes_at(t, terms, 1, 1, False, e, prefill_rows)["total"]
    if without <= 0 and alone > budget:
        res.notes.insert(0, f"the target alone does not fit: {_human(alone)} ({alone:,} bytes: its weights "
                            f"{_human(terms.target_weights)} and one position per slot) past the budget "
                            f"{_human(budget)} ({budget_source}); no context can run here")
    if ctx is not None:
        res.at_ctx = {"ctx": ctx, "without": bytes_at(t, terms, ctx, slots, False, e, prefill_rows)}
        if d is not None:
            res.at_ctx["with"] = bytes_at(t, terms, ctx, slots, True, e, prefill_rows)
    return res


def _human(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    exp = min(int(math.log(n, 1024)), 4)
    return f"{n / 1024 ** exp:.2f} {('B', 'KiB', 'MiB', 'GiB', 'TiB')[exp]}"


def render(res: PlanResult, console) -> None:
    from rich.table import Table

    t = Table(title=f"plan: {res.target} ({res.family})" + (f" + {res.draft} ({res.draft_kind})" if res.draft else "")
              + f", {res.dtype} on {res.device}, {res.slots} slot(s)", title_justify="left")
    t.add_column("term")
    t.add_column("bytes", justify="right")
    t.add_column("size", justify="right")
    tm = res.terms
    rows = [("target weights", tm.target_weights), ("target KV + RoPE per position per slot", tm.per_position),
            ("target recurrent state per slot", tm.per_slot), ("draft weights", tm.draft_weights),
            ("draft KV store per position per slot", tm.draft_per_position), ("draft arena", tm.draft_arena),
            ("verify rows", tm.verify_rows), ("verify per-row states per slot", tm.verify_state),
            ("runtime arena", tm.runtime_arena), ("budget (" + res.budget_source + ")", res.budget)]
    for name, v in rows:
        t.add_row(name, f"{v:,}", "" if name == "verify rows" else _human(v))
    for b, win in tm.windows:
        t.add_row(f"sliding-window KV per position (capped at {win})", f"{b:,}", _human(b))
    console.print(t)
    console.print(f"largest context per slot: without the draft {res.ctx_without}"
                  + (f", with the draft {res.ctx_with}" if res.ctx_with is not None else "")
                  + f" (max position {res.max_position}, base {res.base})", highlight=False)
    for k, v in res.at_ctx.items():
        if isinstance(v, dict):
            console.print(f"at ctx {res.at_ctx['ctx']} {k} the draft: " + ", ".join(f"{a}={b:,}" for a, b in v.items()),
                          highlight=False, soft_wrap=True)
    console.print(f"draft={'on' if res.draft_on else 'off'} ({res.reason})", highlight=False, soft_wrap=True)
    for n in res.notes:
        console.print(f"note: {n}", highlight=False, soft_wrap=True)


def to_json(res: PlanResult) -> str:
    return json.dumps(res.to_json(), indent=2)


def load_line(res: PlanResult) -> tuple[str, dict[str, Any]]:
    """The plan's facts for the gate's load line: ("on", facts) or ("off", {"reason": ...})."""
    if not res.draft_on:
        return "off", {"reason": res.reason}
    return "on", {"plan_ctx": res.ctx_with, "plan_ctx_without": res.ctx_without,
                  "plan_draft_bytes": res.terms.draft_weights + res.terms.draft_arena}


def plan_paths(target: Path, draft: Path | None, **kw) -> PlanResult:
    """Read the headers of ``target`` (and ``draft``) and plan them."""
    from .model import read_draft, read_target

    t = read_target(Path(target))
    d = read_draft(Path(draft), t, Path(target)) if draft is not None else None
    return make_plan(t, d, **kw)


def budget_of(gpu_mem: str | None, device: str) -> tuple[int, str]:
    """``--gpu-mem`` parsed, or the free memory of ``device`` (CUDA free bytes / the host's MemAvailable)."""
    if gpu_mem is not None:
        return parse_bytes(gpu_mem), "--gpu-mem"
    import torch

    from ..preflight import available_bytes

    have = available_bytes(torch.device(device)) if device == "cpu" or torch.cuda.is_available() else None
    if have is None:
        raise InputError("--gpu-mem", f"the free memory of {device} is unknown here; expected --gpu-mem BYTES")
    return have, f"free on {device}"
