"""EAGLE-3 drafters in the speculators layout (DRAFTERS.md section 5; RedHatAI / speculators 0.9 checkpoints):
``Eagle3Spec`` from an HF directory, checked to fit the target.

config.json, as speculators' ``Eagle3SpeculatorConfig.save_pretrained`` writes it:
  speculators_model_type "eagle3" (required); transformer_layer_config: the HF config of the one draft layer,
  model_type "qwen3" (per-head q_norm / k_norm) or "llama" (none; head_dim defaults to hidden / heads,
  num_key_value_heads to num_attention_heads), num_hidden_layers 1, vocab_size = the target's, hidden_size =
  the target's, the usual layer keys (RoPE yarn / linear read by ``formats.rope_scaling``; refused as
  unsupported: other RoPE types, sliding window, biases, an activation other than silu); draft_vocab_size;
  eagle_aux_hidden_state_layer_ids (absent: speculators' and vLLM's default [2, L // 2, L - 3], refused when
  those are not distinct); norm_before_residual, norm_output
  (false when absent); norm_before_fc and fc_norm must be false, target_hidden_size null or H;
  speculators_config.proposal_methods[default_proposal_method].speculative_tokens = the chain length K
  (proposal_type "greedy"; K = 3, speculators' default ttt_steps, when speculators_config is absent).

Tensors (no ``model.`` prefix): fc.weight [H, n*H] (n = number of aux ids), layers.0.{hidden_norm,
input_layernorm, post_attention_layernorm}.weight [H], layers.0.self_attn.{q,k,v}_proj.weight
[heads*head_dim, 2H], o_proj [H, heads*head_dim], layers.0.self_attn.{q,k}_norm.weight [head_dim] (qwen3 layer
only), layers.0.mlp.{gate,up,down}_proj, norm.weight [H], lm_head.weight [draft_vocab_size, H]; d2t
[draft_vocab_size] int64 (required when draft_vocab_size != the target vocab) and t2d [V] bool (optional),
read by ``formats.eagle3_vocab``. An ``embed_tokens.weight`` copy must equal the target's embedding;
``verifier_*`` tensors (training-only) are ignored.
"""

from __future__ import annotations

from pathlib import Path

from bloomery_cli.formats.config import Cfg
from bloomery_cli.formats.eagle3_vocab import check_embedding, draft_to_target
from bloomery_cli.formats.hf_dir import open_safetensors_dir, read_config
from bloomery_cli.formats.lazy import check_shapes
from bloomery_cli.formats.mtp import Subset
from bloomery_gates.errors import BadConfig, BadTensor, Mismatch, Refused
from bloomery_gates.spec import Eagle3Spec, LayerShape, ModelSpec

from ..families.qwen3.reader import Shapes, layer_shape_from_hf

SPECULATORS_TYPE = "eagle3"
LAYER_TYPES = ("qwen3", "llama")
SUPPORTED_LAYERS = 1
DEFAULT_SPECULATIVE_TOKENS = 3
L0 = "layers.0."


def default_aux_layer_ids(num_target_layers: int) -> tuple[int, ...]:
    """speculators' (``resolve_target_layer_ids``) and vLLM's default: [2, L // 2, L - 3]."""
    L = num_target_layers
    return (2, L // 2, L - 3)


def draft_layer(tl: Cfg) -> tuple[LayerShape, bool]:
    """The draft layer's numbers and whether it carries q/k norms, from ``transformer_layer_config``."""
    model_type = tl.get("model_type", what=f"one of {list(LAYER_TYPES)}")
    if model_type not in LAYER_TYPES:
        raise tl.bad("model_type", f"{model_type!r} is not supported; expected one of {list(LAYER_TYPES)}")
    data = dict(tl.data)
    if model_type == "llama":
        if tl.bool("mlp_bias", False):
            raise tl.bad("mlp_bias", "true is not supported; expected false (no MLP biases)")
        heads = tl.int("num_attention_heads")
        data.setdefault("num_key_value_heads", heads)
        if data.get("head_dim") is None:
            data["head_dim"] = tl.int("hidden_size") // heads
    return layer_shape_from_hf(Cfg(data, tl.where, tl.prefix)), model_type == "qwen3"


def _speculative_tokens(cfg: Cfg) -> int:
    """K from speculators_config: the proposal method named by default_proposal_method (greedy only)."""
    if cfg.get("speculators_config", None) is None:
        return DEFAULT_SPECULATIVE_TOKENS
    sc = cfg.sub("speculators_config")
    algorithm = sc.get("algorithm", SPECULATORS_TYPE)
    if algorithm != SPECULATORS_TYPE:
        raise sc.bad("algorithm", f"{algorithm!r}; expected \"{SPECULATORS_TYPE}\"")
    methods = sc.get("proposal_methods", what="a list of proposal methods")
    if not isinstance(methods, list) or not methods or not all(isinstance(m, dict) for m in methods):
        raise sc.bad("proposal_methods", f"{methods!r}; expected a non-empty list of objects")
    default = sc.get("default_proposal_method", methods[0].get("proposal_type"))
    chosen = [i for i, m in enumerate(methods) if m.get("proposal_type") == default]
    if not chosen:
        raise sc.bad("default_proposal_method", f"{default!r} names none of the proposal_methods' proposal_type "
                                                f"{[m.get('proposal_type') for m in methods]}")
    method = Cfg(methods[chosen[0]], sc.where, f"{sc.prefix}proposal_methods[{chosen[0]}].")
    if default != "greedy":
        raise Refused(sc.where, f"{sc.prefix}default_proposal_method {default!r}: the EAGLE-3 kernels draft one "
                                "greedy chain (proposal_type \"greedy\")")
    return method.int("speculative_tokens", what="the number of drafted tokens per window")


def _flags(cfg: Cfg, H: int) -> tuple[bool, bool]:
    """(norm_before_residual, norm_output); the variants the kernels do not implement are refused."""
    for key, what in (("norm_before_fc", "one RMSNorm over the concatenated aux rows before fc"),
                      ("fc_norm", "a per-aux-layer RMSNorm before fc")):
        if cfg.bool(key, False):
            raise Refused(cfg.where, f"key {key} true ({what}) is not implemented by the EAGLE-3 kernels; "
                                     "expected false")
    th = cfg.get("target_hidden_size", None)
    if th is not None and th != H:
        raise cfg.bad("target_hidden_size", f"{th!r}; expected null or the draft hidden size {H} "
                                             "(a draft narrower than its target is not implemented)")
    return cfg.bool("norm_before_residual", False), cfg.bool("norm_output", False)


def eagle3_shapes(layer: LayerShape, qk_norm: bool, n_aux: int, draft_vocab: int) -> Shapes:
    """Every tensor an EAGLE-3 drafter must carry (float tensors; d2t / t2d are checked apart)."""
    H, d, I = layer.hidden_size, layer.head_dim, layer.intermediate_size
    q, kv, a = layer.num_heads * d, layer.num_kv_heads * d, L0 + "self_attn."
    shapes: Shapes = {
        "fc.weight": ((H, n_aux * H), f"[hidden_size, {n_aux}*hidden_size] ({n_aux} aux hidden states)"),
        L0 + "hidden_norm.weight": ((H,), "[hidden_size]"),
        L0 + "input_layernorm.weight": ((H,), "[hidden_size]"),
        a + "q_proj.weight": ((q, 2 * H), "[num_heads*head_dim, 2*hidden_size] (input [embedding ; hidden])"),
        a + "k_proj.weight": ((kv, 2 * H), "[num_kv_heads*head_dim, 2*hidden_size]"),
        a + "v_proj.weight": ((kv, 2 * H), "[num_kv_heads*head_dim, 2*hidden_size]"),
        a + "o_proj.weight": ((H, q), "[hidden_size, num_heads*head_dim]"),
        L0 + "post_attention_layernorm.weight": ((H,), "[hidden_size]"),
        L0 + "mlp.gate_proj.weight": ((I, H), "[intermediate_size, hidden_size]"),
        L0 + "mlp.up_proj.weight": ((I, H), "[intermediate_size, hidden_size]"),
        L0 + "mlp.down_proj.weight": ((H, I), "[hidden_size, intermediate_size]"),
        "norm.weight": ((H,), "[hidden_size]"),
        "lm_head.weight": ((draft_vocab, H), "[draft_vocab_size, hidden_size]"),
    }
    if qk_norm:
        shapes[a + "q_norm.weight"] = ((d,), "[head_dim]")
        shapes[a + "k_norm.weight"] = ((d,), "[head_dim]")
    return shapes


def _aux_ids(cfg: Cfg, target: ModelSpec, mismatch) -> tuple[int, ...]:
    L, key = target.num_layers, "eagle_aux_hidden_state_layer_ids"
    if cfg.get(key, None) is None:
        ids, how = default_aux_layer_ids(L), f"speculators' default [2, L//2, L-3] for L = {L}, {key} being absent"
    else:
        ids, how = tuple(cfg.int_list(key, "a list of target layer ids")), f"from {key}"
    if not ids or len(set(ids)) != len(ids):
        raise mismatch(f"aux layer ids {list(ids)} ({how}): expected distinct ids" +
                       ("; write eagle_aux_hidden_state_layer_ids explicitly" if cfg.get(key, None) is None else ""))
    bad = [i for i in ids if not 0 <= i <= L]
    if bad:
        raise mismatch(f"aux layer ids {list(ids)} ({how}): {bad} outside 0..{L} (id l reads the hidden state "
                       f"entering target layer l; {L} = the last layer's output)")
    return ids


def eagle3_from_hf(directory: Path, target: ModelSpec) -> Eagle3Spec:
    """An EAGLE-3 drafter from ``directory``, checked to fit ``target`` (``Mismatch`` naming both)."""
    cfg = Cfg(read_config(directory), directory / "config.json")
    tensors = open_safetensors_dir(directory)  # headers only
    kind = cfg.get("speculators_model_type", what=f"\"{SPECULATORS_TYPE}\" (a speculators EAGLE-3 checkpoint)")
    if kind != SPECULATORS_TYPE:
        raise cfg.bad("speculators_model_type", f"{kind!r}; expected \"{SPECULATORS_TYPE}\"")

    def mismatch(problem: str) -> Mismatch:
        return Mismatch(f"draft {directory} vs target {target.source}", problem)

    tl = cfg.sub("transformer_layer_config")
    if not tl.data:
        raise cfg.bad("transformer_layer_config", "missing; expected the HF config of the draft layer")
    layer, qk_norm = draft_layer(tl)
    depth = tl.int("num_hidden_layers")
    found = sorted({int(n.split(".")[1]) for n in tensors if n.startswith("layers.") and n.split(".")[1].isdigit()})
    if depth != SUPPORTED_LAYERS:
        raise Refused(directory, f"{tl.prefix}num_hidden_layers = {depth}: the EAGLE-3 kernels implement "
                                 f"{SUPPORTED_LAYERS} draft layer")
    if found and found != [0]:
        raise BadTensor(f"{directory}: tensors layers.*", f"layer indices {found}; expected only layers.0 "
                                                          f"({tl.prefix}num_hidden_layers = 1)")
    H, V = target.hidden_size, target.vocab_size
    if layer.hidden_size != H:
        raise mismatch(f"{tl.prefix}hidden_size {layer.hidden_size} != target hidden size {H}; expected equal "
                       "(the draft reads the target's hidden rows and embedding)")
    if tl.int("vocab_size") != V:
        raise mismatch(f"{tl.prefix}vocab_size {tl.int('vocab_size')} != target vocab {V}; expected equal "
                       "(it is the verifier's vocabulary)")
    draft_vocab = cfg.int("draft_vocab_size", what="the draft head's vocabulary size")
    if draft_vocab > V:
        raise mismatch(f"draft_vocab_size {draft_vocab} > target vocab {V}; expected <= {V}")
    before_residual, norm_output = _flags(cfg, H)
    ids = _aux_ids(cfg, target, mismatch)
    if not qk_norm and any(n.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")) for n in tensors):
        raise BadConfig(f"{directory / 'config.json'}: key {tl.prefix}model_type",
                        "\"llama\" (no q/k norms), but the file holds layers.0.self_attn.q_norm / k_norm; "
                        "expected \"qwen3\" for a layer with q/k norms")
    shapes = eagle3_shapes(layer, qk_norm, len(ids), draft_vocab)
    if "fc.weight" in tensors and tensors.shape_of("fc.weight") != shapes["fc.weight"][0]:
        fc = list(tensors.shape_of("fc.weight"))
        raise mismatch(f"fc.weight shape {fc}; expected [{H}, {len(ids)}*{H}] ({len(ids)} aux layer ids "
                       f"{list(ids)} of the target hidden size {H})")
    check_shapes(tensors, shapes, directory)
    check_embedding(tensors, target, directory)
    d2t = draft_to_target(tensors, draft_vocab, V, directory)
    return Eagle3Spec(kind="eagle3", source=directory, layer=layer, qk_norm=qk_norm, aux_layer_ids=ids,
                      draft_vocab_size=draft_vocab, vocab_size=V, norm_before_residual=before_residual,
                      norm_output=norm_output, speculative_tokens=_speculative_tokens(cfg),
                      tensors=Subset(tensors, list(shapes)), d2t=d2t)
