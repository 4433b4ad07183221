"""What ``bloomery plan`` knows of a checkpoint, from its headers alone.

A target or a draft is read into a ``PlanModel``: the element counts of its weights (from the safetensors
headers or the GGUF tensor infos, through ``plan_headers``: no tensor data is touched), and the numbers that size
its state (from ``config.json`` or the GGUF metadata):

    attention layers      by KV shape (kv heads, head dim, sliding window or None)  -> bytes per position
    rotary dim            the cos/sin tables, f32, per position
    recurrent state       per slot, not per position: Gated DeltaNet S [nv, dk, dv] f32 and the conv tail
                          [k-1, conv_dim] per linear layer; Mamba-2 S [heads, head_dim, state] f32 and its
                          conv tail [k-1, inner + 2 groups state] per mamba layer

Nothing here is unpickled or run; a missing or odd key is a ``BadConfig`` naming the file and the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bloomery_gates.errors import BadConfig, InputError, MissingFile
from bloomery_gates.registry import FAMILIES, Family, of_model_type

from ..files import exists, read_json_file
from ..formats.config import Cfg
from .types import AttnGroup, Experts, PlanDraft, PlanModel, Recurrent, _elems, _embed_dtype


def _plan_family(name: str, where: str, key: str, which: str) -> Family:
    """The registry's family of a model type / arch that plan can count (its own layout, or a plan of its own)."""
    fam = of_model_type(name)
    if fam is None or not (fam.plan_as or fam.has(which)):
        known = sorted({n for f in FAMILIES.values() if f.plan_as or f.has(which) for n in f.names})
        raise BadConfig(f"{where}: key {key}", f"{name!r}; expected one of {', '.join(known)}")
    return fam


def _hf_config(path: Path) -> tuple[dict[str, Any], Path]:
    cfg_path = path / "config.json" if path.is_dir() else path.parent / "config.json"
    if not exists(cfg_path, "checkpoint's config.json"):     # a link to a device is read (and capped), not "missing"
        raise MissingFile(cfg_path, "missing; expected the checkpoint's config.json beside its safetensors")
    data = read_json_file(cfg_path, "checkpoint's config.json")
    if not isinstance(data, dict):
        raise BadConfig(cfg_path, "expected a JSON object")
    return data, cfg_path


def _layer_types(c: Cfg, n: int) -> list[str]:
    types = c.get("layer_types", None)
    if types is None:
        return ["full_attention"] * n
    if not isinstance(types, list) or len(types) < n or not all(isinstance(t, str) for t in types):
        raise c.bad("layer_types", f"{types!r}; expected {n} layer type strings")
    return list(types[:n])


def _nemotron_pattern(c: Cfg) -> list[str]:
    """``layers_block_type`` (mamba / attention / moe / mlp) or the ``hybrid_override_pattern`` M * E -."""
    types = c.get("layers_block_type", None)
    if types is None:
        pat = c.get("hybrid_override_pattern", what="layers_block_type or hybrid_override_pattern")
        names = {"M": "mamba", "*": "attention", "E": "moe", "-": "mlp"}
        if not isinstance(pat, str) or any(ch not in names for ch in pat):
            raise c.bad("hybrid_override_pattern", f"{pat!r}; expected a string of M, *, E, -")
        return [names[ch] for ch in pat]
    if not isinstance(types, list) or not all(t in ("mamba", "attention", "moe", "mlp") for t in types):
        raise c.bad("layers_block_type", f"{types!r}; expected a list of mamba / attention / moe / mlp")
    return list(types)


def _mamba(c: Cfg, layers: int, conv_key: str = "conv_kernel") -> Recurrent:
    nh, hd = c.int("mamba_num_heads"), c.int("mamba_head_dim")
    st, g, k = c.int("ssm_state_size"), c.int("n_groups"), c.int(conv_key)
    return Recurrent("mamba2", layers, nh * hd * st, (k - 1) * (nh * hd + 2 * g * st), nh * hd + 2 * g * st)


def _hf_target(path: Path, inv_model) -> PlanModel:
    raw, where = _hf_config(path)
    c = Cfg(raw, where)
    if isinstance(raw.get("text_config"), dict):
        c = c.sub("text_config")
    mt = str(c.get("model_type", "", "the model type"))
    fam = _plan_family(mt, str(where), "model_type", "plan_hf")
    if fam.has("plan_hf"):                                        # a family that plans itself (mimo2)
        return fam.plan_hf(path, inv_model, c, where)
    family = fam.plan_as
    hidden, heads, vocab = c.int("hidden_size"), c.int("num_attention_heads"), c.int("vocab_size")
    head_dim = c.int("head_dim", hidden // heads)
    kv = c.int("num_key_value_heads", heads)
    maxpos = c.int("max_position_embeddings", 1 << 20)
    tied = c.bool("tie_word_embeddings", False)
    recurrent: list[Recurrent] = []
    attn: list[AttnGroup] = []
    rotary = head_dim
    experts = None
    if family == "nemotron":
        types = _nemotron_pattern(c)
        n_attn, n_mamba = types.count("attention"), types.count("mamba")
        attn = [AttnGroup(n_attn, kv, head_dim)] if n_attn else []
        if n_mamba:
            recurrent.append(_mamba(c, n_mamba))
        rotary = 0                                                # NoPE attention
        inter = c.int("intermediate_size", hidden * 4)
    else:
        n = c.int("num_hidden_layers")
        types = _layer_types(c, n)
        if c.get("moe_intermediate_size", None) is not None:      # MoE: the widest FFN a row runs (transient term)
            inter = max(c.int("num_experts_per_tok") * c.int("moe_intermediate_size"),
                        c.int("shared_expert_intermediate_size", 0, minimum=0))
            experts = Experts(c.int("num_experts_per_tok"), c.int("moe_intermediate_size"))  # gathered per pair
        else:
            inter = c.int("intermediate_size")
        window = c.int("sliding_window", 0, minimum=0) or None
        full = sum(t == "full_attention" for t in types)
        swa = sum(t == "sliding_attention" for t in types)
        lin = sum(t == "linear_attention" for t in types)
        if full + swa + lin != n:
            raise c.bad("layer_types", f"{types!r}; expected full_attention, sliding_attention or linear_attention")
        attn = [g for g in (AttnGroup(full, kv, head_dim), AttnGroup(swa, kv, head_dim, window)) if g.layers]
        if family == "qwen38":
            rope = c.sub("rope_parameters")
            factor = rope.float("partial_rotary_factor", c.float("partial_rotary_factor", 1.0))
            rotary = int(head_dim * factor)
            nk, nv = c.int("linear_num_key_heads"), c.int("linear_num_value_heads")
            dk, dv, k = c.int("linear_key_head_dim"), c.int("linear_value_head_dim"), c.int("linear_conv_kernel_dim")
            if lin:
                recurrent.append(Recurrent("deltanet", lin, nv * dk * dv, (k - 1) * (2 * nk * dk + nv * dv),
                                           2 * nk * dk + nv * dv))
    mtp = _elems(inv_model, ("mtp_nextn",))
    nextn = inv_model.nextn_layers or 0
    embed = _elems(inv_model, ("token_embd",))
    return PlanModel(path.name, family, "hf", hidden, heads, vocab, inter, maxpos,
                     _elems(inv_model, exclude=("mtp_nextn",)), inv_model.total_bytes, tied or not any(
                         t.group == "output" and len(t.shape) == 2 for t in inv_model.tensors),
                     embed, tuple(attn), rotary, tuple(recurrent), mtp, nextn if mtp else 0,
                     meta={"model_type": mt, "config": str(where)}, embed_dtype=_embed_dtype(inv_model),
                     experts=experts)


def _gguf_target(path: Path, inv_model) -> PlanModel:
    from ..inventory.read import _HeaderGGUF

    g = _HeaderGGUF(path)
    arch = str(g.meta("general.architecture", ""))
    fam = _plan_family(arch, str(path), "general.architecture", "plan_gguf")
    if fam.has("plan_gguf"):
        return fam.plan_gguf(path, inv_model)
    family = fam.plan_as

    def key(k: str, default: Any = None) -> Any:
        v = g.meta(f"{arch}.{k}", default)
        if v is None:
            raise BadConfig(f"{path}: key {arch}.{k}", "missing")
        return v

    blocks = int(key("block_count"))
    nextn = int(g.meta(f"{arch}.nextn_predict_layers", 0) or 0)
    trunk = blocks - nextn
    hidden, heads = int(key("embedding_length")), key("attention.head_count")
    heads = int(max(heads) if isinstance(heads, list) else heads)
    head_dim = int(key("attention.key_length", hidden // heads))
    kv_raw = key("attention.head_count_kv", heads)
    kv_per = [int(x) for x in kv_raw] if isinstance(kv_raw, list) else [int(kv_raw)] * blocks
    ff_raw = g.meta(f"{arch}.feed_forward_length", 0)
    ff_per = [int(x) for x in ff_raw] if isinstance(ff_raw, list) else [int(ff_raw or 0)] * blocks
    recurrent: list[Recurrent] = []
    rotary = int(g.meta(f"{arch}.rope.dimension_count", head_dim) or head_dim)
    if family == "qwen38":
        interval = int(key("full_attention_interval"))
        lin = sum((i + 1) % interval != 0 for i in range(trunk))
        n_attn = trunk - lin
        st, grp, nv = int(key("ssm.state_size")), int(key("ssm.group_count")), int(key("ssm.time_step_rank"))
        inner, k = int(key("ssm.inner_size")), int(key("ssm.conv_kernel"))
        recurrent.append(Recurrent("deltanet", lin, nv * st * (inner // nv), (k - 1) * (2 * grp * st + inner),
                                   2 * grp * st + inner))
        kv = kv_per[-1] if kv_per else 0
    elif family == "nemotron":
        mamba = [i for i in range(trunk) if kv_per[i] == 0 and ff_per[i] == 0]
        n_attn = sum(kv_per[i] > 0 for i in range(trunk))
        kv = max(kv_per[:trunk]) if trunk else 0
        st, grp, k = int(key("ssm.state_size")), int(key("ssm.group_count")), int(key("ssm.conv_kernel"))
        inner = int(key("ssm.inner_size"))
        if mamba:
            recurrent.append(Recurrent("mamba2", len(mamba), inner * st, (k - 1) * (inner + 2 * grp * st),
                                       inner + 2 * grp * st))
        rotary = 0
    else:
        n_attn, kv = trunk, kv_per[0]
    attn = (AttnGroup(n_attn, kv, head_dim),) if n_attn else ()
    vocab = next((t.shape[0] for t in inv_model.tensors if t.name == "token_embd.weight"), 0)
    tied = not any(t.name == "output.weight" for t in inv_model.tensors)
    return PlanModel(path.name, family, "gguf", hidden, heads, vocab, max(ff_per or [0]),
                     int(g.meta(f"{arch}.context_length", 1 << 20) or (1 << 20)),
                     _elems(inv_model, exclude=("mtp_nextn",)), inv_model.total_bytes, tied,
                     _elems(inv_model, ("token_embd",)), attn, rotary, tuple(recurrent),
                     _elems(inv_model, ("mtp_nextn",)), nextn, meta={"arch": arch}, embed_dtype="f32")


def read_target(path: Path) -> PlanModel:
    """A target checkpoint (HF dir or ``*.gguf``) from its headers."""
    from .headers import header_model

    path = Path(path)
    if not path.exists():
        raise MissingFile(path, "no such file or directory; expected an HF checkpoint directory or a *.gguf")
    inv = header_model(path)
    return _gguf_target(path, inv) if inv.fmt == "gguf" else _hf_target(path, inv)


def _find(data: Any, key: str) -> Any:
    """The first value of ``key`` anywhere in a nested config (depth first)."""
    if isinstance(data, dict):
        if key in data and data[key] is not None:
            return data[key]
        for v in data.values():
            found = _find(v, key)
            if found is not None:
                return found
    elif isinstance(data, list):
        for v in data:
            found = _find(v, key)
            if found is not None:
                return found
    return None


def _draft_cfg(raw: dict[str, Any], where: Path) -> Cfg:
    inner = raw.get("transformer_layer_config")
    return Cfg(inner, where, "transformer_layer_config.") if isinstance(inner, dict) else Cfg(raw, where)


def read_draft(path: Path, target: PlanModel, target_path: Path | None = None) -> PlanDraft:
    """A draft checkpoint from its headers: a block draft / EAGLE-3 HF dir, or the target file itself (its
    in-file MTP layer)."""
    from .headers import header_model

    path = Path(path)
    if not path.exists():
        raise MissingFile(path, "no such file or directory; expected a drafter checkpoint")
    same = target_path is not None and path.resolve() == Path(target_path).resolve()
    fam = FAMILIES.get(target.family)
    if (not same and fam is not None and fam.has("plan_gguf_draft") and path.suffix.lower() == ".gguf"
            and header_model(path).arch == "dflash"):
        return fam.plan_gguf_draft(path, target)                  # a family's dflash-arch block draft (DSV4 DSpark)
    if fam is not None and fam.has("plan_draft"):                  # a family that plans its drafts itself (mimo2)
        return fam.plan_draft(path, target, None if same else read_target(path))
    if same:
        if not target.draft_elems:
            raise InputError(path, "is the target itself but holds no MTP / NextN tensors; expected a draft")
        ad = target.attn[0] if target.attn else AttnGroup(0, 1, target.hidden // target.heads)
        return PlanDraft(path.name, "mtp", target.draft_elems, target.draft_layers or 1, ad.kv_heads, ad.head_dim,
                         target.rotary_dim, 4, target.vocab)
    inv = header_model(path)
    if inv.fmt == "gguf":
        raise InputError(path, "a GGUF drafter: the plan reads HF draft directories (config.json + safetensors)")
    raw, where = _hf_config(path)
    spec_type = str(raw.get("speculators_model_type") or "").lower()
    archs = " ".join(str(a).lower() for a in raw.get("architectures") or [])
    kind = spec_type or ("dflash2" if "dflash2" in archs else "dspark" if "dspark" in archs
                         else "eagle3" if "eagle3" in archs else "dflash" if "dflash" in archs else "")
    if kind not in ("dflash", "dflash2", "dspark", "eagle3"):
        raise BadConfig(f"{where}: key architectures", f"{raw.get('architectures')!r}; expected a DFlash, "
                        "DFlash2, DSpark or EAGLE-3 drafter")
    c = _draft_cfg(raw, where)
    hidden, heads = c.int("hidden_size"), c.int("num_attention_heads")
    head_dim = c.int("head_dim", hidden // heads)
    if kind == "eagle3":
        k = _find(raw, "speculative_tokens")
        rows = (int(k) if isinstance(k, int) else 3) + 1
    else:
        b = raw.get("block_size", _find(raw, "block_size"))
        if not isinstance(b, int) or b < 2:
            raise BadConfig(f"{where}: key block_size", f"{b!r}; expected the draft block size >= 2")
        rows = b + 1 if kind == "dspark" else b
    names = {t.name for t in inv.tensors}
    own = kind == "dspark" and ("embed_tokens.weight" in names or "lm_head.weight" in names)
    return PlanDraft(path.name, kind, _elems(inv), c.int("num_hidden_layers"), c.int("num_key_value_heads", heads),
                     head_dim, head_dim, rows, c.int("vocab_size", target.vocab), own)
