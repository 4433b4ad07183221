"""Non-default RoPE keys of an HF config: ``rope_parameters`` (transformers 5) or ``rope_scaling`` (older files).

Read (the math is in ``kernels/ops/rope.py`` / ``reference/ops/rope.py``):
  rope_type (or ``type``) "default"     plain RoPE
  "linear"  factor (> 0, required)
  "yarn"    factor (> 0, required); original_max_position_embeddings (> 0: the top-level key of that name wins,
            as in transformers' ``standardize_rope_params``, else the dict's, else max_position_embeddings);
            beta_fast (32), beta_slow (1), attention_factor, mscale, mscale_all_dim (optional), truncate (true)
Refused with a named error (exit 2): any other rope_type ("dynamic", "longrope", "llama3", ...), a key of the
dict this harness does not act on (``partial_rotary_factor`` other than 1, ``mrope_section``, ...), and a file
whose rope_parameters and rope_scaling both name a non-default RoPE that differ.
"""

from __future__ import annotations

from bloomery_cli.formats.config import Cfg
from bloomery_gates.spec import RopeScaling

KNOWN = {
    "default": set(),
    "linear": {"factor"},
    "yarn": {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "mscale",
             "mscale_all_dim", "truncate"},
}
COMMON = {"rope_type", "type", "rope_theta"}


MAX_POSITIONS = 1 << 40
LO, HI = 1e-6, 1e6
"""yarn's numbers are taken in [1e-6, 1e6] (factor, beta_fast, beta_slow, attention_factor, mscale,
mscale_all_dim) and lengths up to 2^40: inside these d ln(L0 / (2 pi beta)) / (2 ln theta) and the mscale terms
are finite for every theta > 1 (``Cfg.rope_base``); transformers' own values are 1 to 64. A denormal beta or an
original length of 10^400 reached the math unchecked (ZeroDivisionError, OverflowError)."""


def _within(sub: Cfg, key: str, what: str) -> float:
    x = sub.float(key, what=what)
    if not LO <= x <= HI:
        raise sub.bad(key, f"{x}; expected {what} in [{LO:g}, {HI:g}]")
    return x


def _one(cfg: Cfg, key: str) -> tuple[str, Cfg]:
    sub = cfg.sub(key)
    rtype = sub.get("rope_type", None) or sub.get("type", "default")
    if rtype not in KNOWN:
        raise cfg.bad(f"{key}.rope_type", f"{rtype!r} is not supported; expected one of {sorted(KNOWN)}")
    return rtype, sub


def _checked(cfg: Cfg, key: str, rtype: str, sub: Cfg) -> None:
    prf = sub.get("partial_rotary_factor", None)
    if prf is not None and sub.float("partial_rotary_factor") != 1.0:
        raise sub.bad("partial_rotary_factor", f"{prf}; expected 1 (a Qwen3 layer rotates the whole head)")
    odd = sorted(set(sub.data) - KNOWN[rtype] - COMMON - {"partial_rotary_factor"})
    if odd:
        raise cfg.bad(f"{key}.{odd[0]}", f"not supported with rope_type {rtype!r}; expected only "
                                         f"{sorted(KNOWN[rtype] | COMMON)}")


def rope_scaling_of(cfg: Cfg) -> RopeScaling | None:
    """The config's RoPE scaling, None for default RoPE."""
    found = []
    for key in ("rope_parameters", "rope_scaling"):
        rtype, sub = _one(cfg, key)
        _checked(cfg, key, rtype, sub)
        if rtype != "default":
            found.append((key, rtype, sub))
    if not found:
        return None
    if len(found) == 2 and dict(found[0][2].data) != dict(found[1][2].data):
        raise cfg.bad("rope_scaling", "differs from rope_parameters; expected one non-default RoPE")
    key, rtype, sub = found[0]
    factor = _within(sub, "factor", "the RoPE scaling factor")
    if rtype == "linear":
        return RopeScaling(kind="linear", factor=factor)
    if cfg.get("original_max_position_embeddings", None) is not None:
        big = cfg.int("original_max_position_embeddings", maximum=MAX_POSITIONS, why="2^40 positions")
    elif sub.get("original_max_position_embeddings", None) is not None:
        big = sub.int("original_max_position_embeddings", maximum=MAX_POSITIONS, why="2^40 positions")
    else:
        big = cfg.int("max_position_embeddings", what="the context length (yarn's original length)",
                      maximum=MAX_POSITIONS, why="2^40 positions")

    def opt(name: str) -> float | None:
        return _within(sub, name, f"yarn's {name}") if sub.get(name, None) is not None else None

    return RopeScaling(kind="yarn", factor=factor, original_max_position=big,
                       beta_fast=opt("beta_fast") or 32.0, beta_slow=opt("beta_slow") or 1.0,
                       attention_factor=opt("attention_factor"), mscale=opt("mscale"),
                       mscale_all_dim=opt("mscale_all_dim"), truncate=sub.bool("truncate", True))
