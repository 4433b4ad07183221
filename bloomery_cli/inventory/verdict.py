"""Per-token active bytes and the draft-path verdict with its reasons."""

from __future__ import annotations

from typing import Any

from bloomery_gates.registry import Family, of_model_type

from .groups import _block_draft_kind
from .model import (
    BLOCK_DRAFT,
    MTP_DRAFT_KINDS,
    MTP_IN_FILE,
    MTP_SIDECAR,
    NONE,
    ModelInventory,
    _human,
)

# ---------------------------------------------------------------------------------------------
# active bytes, verdict

# FAMILIES_MOE.md sections 4.6 and 7: the draft path of a Nemotron-H (Nemotron 3.5 Bolt) checkpoint
NEMOTRON_MTP = ("draft path: its in-file MTP block (an attention sub-layer then a LatentMoE sub-layer, one block), "
                "as llama.cpp's draft-mtp runs it through nemotron_h_moe graph_mtp; family nemotron is inventory "
                "only here")
NEMOTRON_NONE = ("family nemotron: no in-file draft, so a block draft (a DFlash / DSpark drafter trained for it) or "
                 "n-gram lookup would be needed; inventory only here")


def _infer_routed(m: ModelInventory) -> int | None:
    if m.fmt == "gguf":
        for t in m.tensors:
            if t.group == "ffn_exps_routed" and len(t.shape) == 3:
                return t.shape[0]
        return None
    ids: set[int] = set()
    for t in m.tensors:
        if t.group == "ffn_exps_routed":
            parts = t.name.split(".")
            i = parts.index("experts") if "experts" in parts else -1
            if 0 <= i < len(parts) - 1 and parts[i + 1].isdigit():
                ids.add(int(parts[i + 1]))
            elif i >= 0 and len(t.shape) == 3:      # fused experts [E, ...]
                return t.shape[0]
    return len(ids) or None


def _active(m: ModelInventory) -> None:
    g = {k: b for k, (_, b) in m.groups.items()}
    tied = g["output"] == 0 or not any(t.group == "output" and len(t.shape) == 2 for t in m.tensors)
    dense = sum(b for k, b in g.items() if k not in ("ffn_exps_routed", "mtp_nextn", "token_embd"))
    parts = [f"dense {_human(dense)}"]
    if tied and g["token_embd"]:
        dense += g["token_embd"]
        parts[0] = f"dense {_human(dense)} (token_embd counted: tied, it is the head)"
    elif g["token_embd"]:
        parts.append(f"token_embd {_human(g['token_embd'])} left out (a row lookup)")
    if g["mtp_nextn"]:
        parts.append(f"mtp_nextn {_human(g['mtp_nextn'])} left out (draft, not target)")
    routed = g["ffn_exps_routed"]
    if not routed:
        m.active_bytes = dense
        m.active_why = "; ".join(parts)
        return
    if m.n_routed is None:
        m.n_routed = _infer_routed(m)
        if m.n_routed is not None:
            m.meta["experts (from tensors)"] = m.n_routed
    if not m.n_routed or m.n_used is None:
        m.active_bytes = None
        m.active_why = ("unknown: routed experts present but "
                        + ("no expert count" if not m.n_routed else "no experts-per-token key") + " in the metadata")
        return
    share = routed * m.n_used // m.n_routed
    m.active_bytes = dense + share
    parts.append(f"routed {_human(routed)} x {m.n_used}/{m.n_routed} = {_human(share)}")
    m.active_why = "; ".join(parts)




def _registered(m: ModelInventory) -> Family | None:
    """The registry's family of the file's arch / model_type (or its text_config's), if any."""
    for key in (m.arch, m.meta.get("text_config.model_type")):
        if isinstance(key, str) and (fam := of_model_type(key)) is not None:
            return fam
    return None


def _family(m: ModelInventory) -> str | None:
    fam = _registered(m)
    return fam.key if fam else None


def _gates() -> dict[str, Any]:
    try:
        from bloomery_gates.gates import GATES
    except Exception:  # the registry failing to import must not break an inventory
        return {}
    return dict(GATES)


def _drafter_line(m: ModelInventory, kinds: frozenset[str] | set[str], what: str) -> str:
    fam = _family(m)
    gates = _gates()
    hits = sorted(g.name for g in gates.values()
                  if getattr(g, "draft_kind", None) in kinds and (fam is None or getattr(g, "family", None) == fam))
    who = f"family {fam}" if fam else f"model_type/arch {m.arch!r} (no family here)"
    if fam and hits:
        entry = _registered(m)
        if m.fmt == "gguf" and entry is not None and not entry.gguf_runs:
            return (f"drafter here for the HF layout only: gate {', '.join(hits)}; family {fam}'s GGUF layout is "
                    "read for inventory and plan, not run by the gates")
        if m.fmt == "gguf" and entry is not None and entry.mtp == "sidecar":
            return (f"drafter here: gate {', '.join(hits)} runs family {fam}'s GGUF trunk with the HF checkpoint's "
                    "mtp.* head; the separate MTP GGUF (sidecar) is read for inventory and plan, not run")
        return f"drafter here: gate {', '.join(hits)}"
    entry = _registered(m)
    if entry is not None and entry.draft_path:     # the registry names the path; no gate runs it
        return (f"draft path recognised: {entry.draft_path}; not gated: no gate here runs family {fam}'s draft "
                "yet, so nothing here drafts with it")
    return f"the {what} tensors are present but {who} has no {what} drafter here yet; nothing drafts with them"


def _head_names(names: list[str], k: int = 4) -> str:
    return ", ".join(names[:k]) + (f", ... ({len(names)} in all)" if len(names) > k else "")


def _mtp_layer_count(m: ModelInventory, names: list[str]) -> int:
    """Distinct MTP layers: GGUF nextn blocks, or the k of HF ``mtp.layers.{k}.`` / ``mtp_layers.{k}.`` names."""
    if m.fmt == "gguf":
        return len(m.mtp_blocks)
    ks = set()
    for n in names:
        parts = n.replace("mtp_layers.", "mtp.layers.").split(".")
        for i in range(len(parts) - 2):
            if parts[i] == "mtp" and parts[i + 1] == "layers" and parts[i + 2].isdigit():
                ks.add(int(parts[i + 2]))
    return len(ks) or (1 if names else 0)


def _verdict(m: ModelInventory) -> None:
    mtp_names = m.names("mtp_nextn")
    trunk = any(t.block is not None and t.group != "mtp_nextn" for t in m.tensors)  # trunk blocks
    kind = _block_draft_kind(m)
    if kind:
        m.verdict = BLOCK_DRAFT
        if m.fmt == "gguf":
            m.why.append(f"general.architecture = {m.arch!r}: a block-draft GGUF ({kind})")
        elif m.architectures:
            m.why.append(f"config.json architectures {m.architectures}: this file is a {kind} block drafter")
        else:
            m.why.append(f"speculators_model_type {m.meta.get('speculators_model_type')!r}: a {kind} block drafter")
        hits = sorted(g.name for g in _gates().values() if getattr(g, "draft_kind", None) == kind)
        m.why.append(f"gates that run this kind here: {', '.join(hits)}" if hits
                     else f"no gate here runs a {kind} drafter yet")
        return
    if mtp_names and trunk:
        m.verdict = MTP_IN_FILE
        layers = m.nextn_layers or _mtp_layer_count(m, mtp_names)
        if layers:
            m.why.append(f"{layers} MTP layer{'s' if layers > 1 else ''}")
        m.why.append(f"{len(mtp_names)} MTP/NextN tensors in the file: {_head_names(mtp_names)}")
        if m.mtp_why:
            m.why.append(m.mtp_why)
        m.why.append(_drafter_line(m, MTP_DRAFT_KINDS, "MTP"))
        if _family(m) == "nemotron":
            m.why.append(NEMOTRON_MTP)
        return
    if mtp_names:
        m.verdict = MTP_SIDECAR
        m.why.append(f"MTP/NextN tensors and no trunk blocks: this file "
                     f"is an MTP sidecar ({_head_names(mtp_names)}); pass it with its target")
        m.why.append(_drafter_line(m, MTP_DRAFT_KINDS, "MTP"))
        return
    if (fam := _registered(m)) is not None and fam.mtp == "sidecar":
        m.verdict = MTP_SIDECAR
        key = "general.architecture" if m.fmt == "gguf" else "model_type"
        m.why.append(f"{key} {m.arch!r} ships its MTP layer as a separate file; no MTP tensors in this one "
                     "(look for the MTP sidecar beside it)")
        m.why.append(_drafter_line(m, MTP_DRAFT_KINDS, "MTP"))
        return
    m.verdict = NONE
    spec = m.meta.get("speculators_model_type")
    if spec == "eagle3":
        hits = sorted(g.name for g in _gates().values() if getattr(g, "draft_kind", None) == "eagle3")
        m.why.append("speculators_model_type 'eagle3': an EAGLE-3 head (it reads the target's aux hidden rows; "
                     f"not a block draft or MTP); gates that run this kind here: {', '.join(hits) or 'none'}")
    elif spec:
        m.why.append(f"speculators_model_type {spec!r}: a draft file, but not a block draft or MTP")
    if m.fmt == "gguf":
        m.why.append("no blk.N.nextn.* tensors" + (
            f"; {m.arch}.nextn_predict_layers = {m.nextn_layers} but the blocks it names are absent "
            "(stripped at conversion?)" if m.nextn_layers else f", no {m.arch}.nextn_predict_layers key")
            + f"; general.architecture {m.arch!r} is not a block draft")
    else:
        m.why.append("no mtp.* / mtp_layers.* / NextN (enorm, hnorm, eh_proj) tensors" + (
            f"; config says {m.nextn_layers} MTP layer(s) but their tensors are absent"
            if m.nextn_layers else "") + f"; architectures {m.architectures or '(no config.json)'} "
            "is not a block draft")
    if _family(m) == "nemotron":
        m.why.append(NEMOTRON_NONE)
