"""Sliding-window layers of a DFlash draft: ``layer_types`` + ``sliding_window``, z-lab layout (``draft_windows``,
vLLM's rule, below) and speculators layout (``speculators_windows``, speculators' rule, there).

The rule is vLLM's (``qwen3_dflash._resolve_layer_attention``, what serves z-lab's Qwen3.5/3.6 and gemma-4
drafters): a layer whose ``layer_types`` entry is "sliding_attention" attends with window W = the top-level
``sliding_window`` and is causal (``dflash_config.causal`` absent), so a block row at absolute position p sees
the keys at positions j with

    p - W < j <= p          (context rows j < s and block rows s..s+B-1 alike: the block's own rows count)

i.e. W keys including itself (flash-attention's window (W-1, 0)). A "full_attention" layer keeps DFlash's rule
(every context row, the whole block). The mask is ``reference/ops/attention.sliding_mask`` /
``kernels/ops/attention.sliding_mask``.

Refused with a named error (exit 2): a layer_types list whose length is not the draft depth or with another
entry; sliding layers without a positive integer sliding_window; use_sliding_window true without layer_types;
dflash_config.causal given explicitly beside sliding layers (vLLM then overrides the causality of every layer);
dflash_config.use_swa, swa_window_size, attention_sink_bias (vLLM's other SWA keys, not implemented).
"""

from __future__ import annotations

from bloomery_cli.formats.config import Cfg

TYPES = ("full_attention", "sliding_attention")


def draft_windows(cfg: Cfg, dcfg: Cfg, depth: int) -> tuple[int | None, ...]:
    """Per draft layer, its window W or None (full attention); () when every layer is full."""
    for key in ("use_swa", "swa_window_size", "attention_sink_bias"):
        if dcfg.get(key, None) not in (None, False):
            raise dcfg.bad(key, f"{dcfg.get(key)!r} is not supported; expected it absent (sliding layers are read "
                                "from layer_types and sliding_window)")
    types = cfg.get("layer_types", None)
    if types is None:
        if cfg.bool("use_sliding_window", False):
            raise cfg.bad("use_sliding_window", "true without layer_types; expected layer_types naming each layer")
        return ()
    if not isinstance(types, list) or len(types) != depth or any(t not in TYPES for t in types):
        raise cfg.bad("layer_types", f"{types!r}; expected {depth} entries (num_hidden_layers), each one of "
                                     f"{list(TYPES)}")
    if "sliding_attention" not in types:
        return ()
    if "causal" in dcfg.data:
        raise dcfg.bad("causal", f"{dcfg.get('causal', None)!r} beside sliding layers is not supported; expected it "
                                 "absent (sliding layers causal, full layers bidirectional, as vLLM reads it)")
    w = cfg.int("sliding_window", what="the sliding window (layer_types has sliding_attention)", minimum=1)
    return tuple(w if t == "sliding_attention" else None for t in types)


def speculators_windows(tl: Cfg, depth: int) -> tuple[int | None, ...]:
    """The speculators layout's sliding layers (a "dflash" drafter): ``transformer_layer_config.layer_types`` and
    ``sliding_window``, as speculators' ``DFlashDraftModel`` reads them. Its rule (``create_anchor_block_mask_mod``)
    differs from vLLM's: every block row sees the W context rows s - W..s-1 before the block start, and the block
    causally, or whole with the top-level ``sliding_window_non_causal`` true (the caller's ``window_rule``).
    ``use_sliding_window`` is inert there (speculators' trainer writes it beside layer_types); without layer_types
    it is refused, as are a wrong length, another entry and a missing or non-positive sliding_window."""
    types = tl.get("layer_types", None)
    if types is None:
        if tl.bool("use_sliding_window", False):
            raise tl.bad("use_sliding_window", "true without layer_types; expected layer_types naming each layer")
        return ()
    if not isinstance(types, list) or len(types) != depth or any(t not in TYPES for t in types):
        raise tl.bad("layer_types", f"{types!r}; expected {depth} entries (num_hidden_layers), each one of "
                                    f"{list(TYPES)}")
    if "sliding_attention" not in types:
        return ()
    w = tl.int("sliding_window", what="the sliding window (layer_types has sliding_attention)", minimum=1)
    return tuple(w if t == "sliding_attention" else None for t in types)
