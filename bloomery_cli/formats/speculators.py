"""Block drafters in the speculators layout (DRAFTERS.md section 5): the config and tensors every kind shares.

The speculators package (vLLM project, written against 0.9.0) saves a drafter as config.json + safetensors,
and vLLM's speculators config loader reads the same file; RedHatAI and the speculators converters publish
it. The per-kind readers (``formats.speculators_drafts``) turn it into the same ``DFlashSpec`` /
``DFlash2Spec`` / ``DSparkSpec`` as the z-lab and DeepSpec readers, so kernels, reference and gates are
unchanged. config.json, top level, as ``SpeculatorModelConfig.save_pretrained`` writes it:

    speculators_model_type      "dflash" | "dflash2" | "dspark": decides the kind (``architectures`` is a name
                                only: DFlashSpeculator, DFlash2DraftModel, DSparkSpeculator, DSparkDraftModel occur)
    transformer_layer_config    the draft stack's HF Qwen3 config (model_type "qwen3" or absent): the layer keys
                                of ``formats.qwen3.layer_shape_from_hf``, num_hidden_layers = draft depth,
                                vocab_size = the verifier's vocabulary (= the target's)
    draft_vocab_size            required (speculators' default 32000 is never assumed); must equal the target
                                vocab: a reduced draft vocabulary is refused (below)
    block_size                  B, default 8 (speculators' default)
    aux_hidden_state_layer_ids  required; HF ``hidden_states`` indices a (0 = the embedding output, a = the output
                                of target layer a - 1); the spec's target_layer_ids are a - 1 (-1: the
                                embedding). a = L (the last layer) is refused: HF's hidden_states[L] is taken
                                after the final norm, vLLM's capture before it, and speculators trains on it as
                                the verifier's last hidden state, not as a feature
    mask_token_id               required, < target vocab
    sample_from_anchor          default false for dflash / dflash2 (B-1 drafts, rows 1..B-1), true for dspark
                                (B anchor-first drafts); the other value is refused
    target_hidden_size          null or the draft hidden size (the kernels read same-width features)
    sliding_window_non_causal   a bool (default false, as DFlashSpeculatorConfig): with sliding layers in a "dflash"
                                drafter's transformer_layer_config (layer_types, sliding_window), the block is
                                seen whole (true) or causally (false), speculators' rule (``formats.sliding``);
                                inert without sliding layers. DFlash2 / DSpark sliding layers are refused
    speculators_config          optional: algorithm == speculators_model_type; every proposal method greedy with
                                verifier_accept_k 1 (exact top-1 match, the verify rule the gates prove) and
                                speculative_tokens <= the drafts a block gives (the gate drafts the full block;
                                fewer is a width choice, which never changes a token); verifier: a name only
    bookkeeping (inert)         speculators_version, transformers_version, auto_map (data, never acted on),
                                torch_dtype / dtype, and the generic HF PretrainedConfig keys in ``INERT``

Every other top-level key is a ``BadConfig`` naming it: a key this harness cannot act on is never ignored.

Tensors: the z-lab / DeepSpec names (fc.weight [H, n*H], hidden_norm, norm, layers.{i}.*, the kind's own).
speculators reloads some tensors from the verifier and, saving, leaves them out; an older or hand-made file
may still carry them: embed_tokens.weight [V, H], lm_head.weight [V, H] (full vocabulary), verifier_lm_head
.weight [V, H], verifier_norm.weight [H]. Each present one must equal the target's (embedding, head, final-norm
weight as stored), else ``BadTensor``; the spec then holds the drafter's own tensors only (the kernels use the
target's embedding and head). d2t [Vd] (draft id -> target id = id + d2t[id]) and t2d [V] (bool)
exist for a reduced draft vocabulary only, which the kernels do not build (they draft over the target's full
vocabulary and read the target's head): ``draft_vocab_size`` != V is refused naming it, and with a full
vocabulary d2t / t2d must be the identity (all 0 / all true). Any other tensor is a ``BadTensor``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from bloomery_cli.formats.config import Cfg
from bloomery_cli.formats.hf_dir import open_safetensors_dir, read_config
from bloomery_cli.formats.lazy import LazyTensors, Shapes, check_shapes, layer_bound
from bloomery_cli.formats.sliding import speculators_windows
from bloomery_gates.errors import BadTensor, InputError, Mismatch
from bloomery_gates.spec import LayerShape, ModelSpec

from ..families.qwen3.reader import layer_shape_from_hf

KINDS = ("dflash", "dflash2", "dspark")
KEY = "speculators_model_type"
WRITTEN_FOR = "0.9.0"
DEFAULT_BLOCK = 8

# keys of every speculators block drafter that this reader acts on (or checks)
COMMON = ("speculators_model_type", "transformer_layer_config", "draft_vocab_size", "block_size",
          "aux_hidden_state_layer_ids", "mask_token_id", "sample_from_anchor", "target_hidden_size",
          "sliding_window_non_causal", "speculators_config")
# bookkeeping with no effect on the drafter's math: speculators' own and HF PretrainedConfig's generic keys
INERT = ("architectures", "auto_map", "speculators_version", "transformers_version", "torch_dtype", "dtype",
         "_name_or_path", "model_type", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
         "decoder_start_token_id", "tie_word_embeddings", "use_cache", "return_dict", "output_hidden_states",
         "output_attentions", "torchscript", "pruned_heads", "chunk_size_feed_forward", "is_encoder_decoder",
         "is_decoder", "add_cross_attention", "tie_encoder_decoder", "cross_attention_hidden_size",
         "finetuning_task", "id2label", "label2id", "tokenizer_class", "prefix", "problem_type",
         "task_specific_params", "max_anchors", "num_anchors")
# verifier-owned tensors speculators reloads from the verifier (and leaves out when it saves)
VERIFIER_OWNED = ("embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight", "verifier_norm.weight")
VOCAB_MAPS = ("d2t", "t2d")


def speculators_kind(directory: Path) -> str | None:
    """The ``speculators_model_type`` of ``directory/config.json`` (None when the key is absent: not this layout)."""
    data = read_config(directory)
    value = data.get(KEY)
    return None if value is None else str(value)


@dataclass(frozen=True)
class SpecConfig:
    """What every speculators block drafter's config says, checked against the target.

    ``target_layer_ids`` are z-lab's ids (aux - 1; -1 the embedding output); ``drafts`` the drafts a block gives
    (B - 1, or B for sample_from_anchor); ``cfg`` the top level, ``tl`` transformer_layer_config."""

    cfg: Cfg
    tl: Cfg
    kind: str
    layer: LayerShape
    num_layers: int
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    drafts: int
    tensors: Any
    windows: tuple[int | None, ...] = ()
    window_rule: str = "query"                   # the spec's (``DFlashSpec.window_rule``); "query" when no windows


def read_config_checked(directory: Path, kind: str, target: ModelSpec, extra_keys: tuple[str, ...],
                        min_block: int) -> SpecConfig:
    """config.json of a speculators ``kind`` drafter in ``directory`` (tensor headers opened, not read)."""
    cfg = Cfg(read_config(directory), directory / "config.json")
    got = cfg.get(KEY, what=f'"{kind}"')
    if got != kind:
        raise cfg.bad(KEY, f"{got!r}; expected {kind!r} (this gate's drafter; speculators kinds read here: "
                           f"{', '.join(KINDS)})")
    known = set(COMMON) | set(INERT) | set(extra_keys)
    unknown = sorted(k for k in cfg.data if k not in known)
    if unknown:
        read = ", ".join(sorted(known - set(INERT)))
        raise cfg.bad(unknown[0], f"not a key of the speculators {WRITTEN_FOR} {kind} layout that this reader "
                                  f"acts on; refused rather than ignored (read: {read})")
    if not isinstance(cfg.data.get("transformer_layer_config"), dict):
        raise cfg.bad("transformer_layer_config", f"{cfg.data.get('transformer_layer_config')!r}; expected an "
                                                  "object: the draft stack's HF Qwen3 config")
    tl = cfg.sub("transformer_layer_config")
    if tl.get("model_type", "qwen3") != "qwen3":
        raise tl.bad("model_type", f"{tl.get('model_type')!r}; expected \"qwen3\" (the draft layers the kernels build)")
    layer = layer_shape_from_hf(tl, sliding=kind == "dflash")
    tensors = open_safetensors_dir(directory)  # headers only
    depth = tl.int("num_hidden_layers", what="the draft depth", **layer_bound(tensors, "layers."))
    windows = speculators_windows(tl, depth) if kind == "dflash" else ()
    H, V = target.hidden_size, target.vocab_size

    def mismatch(problem: str) -> Mismatch:
        return Mismatch(f"draft {directory} vs target {target.source}", problem)

    if layer.hidden_size != H:
        raise mismatch(f"transformer_layer_config.hidden_size {layer.hidden_size} != target hidden size {H}; "
                       "expected equal (the draft reads the target's embeddings and features)")
    th = cfg.get("target_hidden_size", None)
    if th is not None and cfg.int("target_hidden_size") != H:
        raise mismatch(f"target_hidden_size {th} != target hidden size {H}; expected null or {H}")
    tv = tl.int("vocab_size", what="the verifier's vocabulary size")
    if tv != V:
        raise mismatch(f"transformer_layer_config.vocab_size {tv} != target vocab {V}; expected equal")
    dv = cfg.int("draft_vocab_size", what="the draft vocabulary size (speculators' default 32000 is not assumed)")
    if dv != V:
        raise cfg.bad("draft_vocab_size", f"{dv}: a reduced draft vocabulary (lm_head [{dv}, H], d2t: target id = "
                                          f"draft id + d2t[draft id]) is not built; the kernels draft over the "
                                          f"target's full vocabulary; expected {V}")
    anchor_default = kind == "dspark"
    anchor = cfg.bool("sample_from_anchor", anchor_default)
    if anchor != anchor_default:
        rows = "B anchor-first drafts (row k predicts s+k+1)" if anchor else "B-1 drafts from rows 1..B-1"
        raise cfg.bad("sample_from_anchor", f"{str(anchor).lower()} ({rows}) is not built for {kind}; expected "
                                            f"{str(anchor_default).lower()}")
    rule = "anchor-bidir" if cfg.bool("sliding_window_non_causal", False) else "anchor"
    block = cfg.int("block_size", DEFAULT_BLOCK, what="the draft block size", minimum=min_block)
    drafts = block if anchor else block - 1
    mask = cfg.int("mask_token_id", what="the mask token id", minimum=0)
    if mask >= V:
        raise mismatch(f"mask_token_id {mask} >= target vocab {V}; expected an id < {V}")
    _check_proposals(cfg, kind, drafts, block)
    ids = layer_ids(cfg, tensors, target, mismatch)
    return SpecConfig(cfg=cfg, tl=tl, kind=kind, layer=layer, num_layers=depth, block_size=block, mask_token_id=mask,
                      target_layer_ids=ids, drafts=drafts, tensors=tensors, windows=windows,
                      window_rule=rule if windows else "query")


def _check_proposals(cfg: Cfg, kind: str, drafts: int, block: int) -> None:
    """speculators_config (optional): algorithm, greedy proposals the gate's verify rule covers."""
    if cfg.get("speculators_config", None) is None:
        return
    sc = cfg.sub("speculators_config")
    unknown = sorted(set(sc.data) - {"algorithm", "proposal_methods", "default_proposal_method", "verifier"})
    if unknown:
        raise sc.bad(unknown[0], "not a speculators_config key of the speculators layout; refused rather than ignored")
    algo = sc.get("algorithm", what=f'"{kind}"')
    if algo != kind:
        raise sc.bad("algorithm", f"{algo!r}; expected {kind!r} (the speculators_model_type)")
    methods = sc.get("proposal_methods", [])
    if not isinstance(methods, list):
        raise sc.bad("proposal_methods", f"{methods!r}; expected a list of proposal configs")
    for i, m in enumerate(methods):
        if not isinstance(m, dict):
            raise sc.bad(f"proposal_methods[{i}]", f"{m!r}; expected an object")
        pm = Cfg(m, cfg.where, f"{sc.prefix}proposal_methods[{i}].")
        extra = sorted(set(m) - {"proposal_type", "speculative_tokens", "verifier_accept_k", "accept_tolerance"})
        if extra:
            raise pm.bad(extra[0], "not a greedy proposal key; refused rather than ignored")
        if pm.get("proposal_type", "greedy") != "greedy":
            raise pm.bad("proposal_type", f"{m.get('proposal_type')!r}; expected \"greedy\" (one chain)")
        if pm.int("verifier_accept_k", 1) != 1:
            raise pm.bad("verifier_accept_k", f"{m['verifier_accept_k']}: accepting a draft inside the verifier's "
                                              "top k is not lossless; expected 1 (exact top-1 match, the gates' rule)")
        pm.float("accept_tolerance", 0.0, positive=False)
        n = pm.int("speculative_tokens", 5, what="the drafts proposed per pass")
        if n > drafts:
            raise pm.bad("speculative_tokens", f"{n}, more than the {drafts} drafts a block of {block} gives; "
                                               f"expected <= {drafts}")
    default = sc.get("default_proposal_method", None)
    if default is not None and not isinstance(default, str):
        raise sc.bad("default_proposal_method", f"{default!r}; expected a proposal type name")
    verifier = sc.get("verifier", None)
    if verifier is not None and not isinstance(verifier, dict):
        raise sc.bad("verifier", f"{verifier!r}; expected an object (name_or_path, architectures)")


def layer_ids(cfg: Cfg, tensors, target: ModelSpec, mismatch) -> tuple[int, ...]:
    """aux_hidden_state_layer_ids (HF hidden_states indices) -> z-lab target layer ids a - 1, checked against the
    target's depth L (0 <= a < L) and fc.weight [H, n*H] (n = number of ids)."""
    H, L = target.hidden_size, target.num_layers
    aux = cfg.int_list("aux_hidden_state_layer_ids", "a list of HF hidden_states indices (0 = the embedding output)")
    if not aux:
        raise cfg.bad("aux_hidden_state_layer_ids", "[]; expected at least one layer index")
    if L in aux:
        raise mismatch(f"aux_hidden_state_layer_ids {aux} lists {L}, the target's last layer: HF's hidden_states[{L}] "
                       "is post-final-norm, vLLM's capture pre-norm, and speculators trains on it as the verifier's "
                       f"last hidden state, not as a feature; expected indices 0..{L - 1}")
    bad = [a for a in aux if not 0 <= a < L]
    if bad:
        raise mismatch(f"aux_hidden_state_layer_ids {aux}: {bad} outside 0..{L - 1} (0 = the embedding output, a = "
                       f"the output of target layer a-1)")
    if "fc.weight" not in tensors:
        raise BadTensor(f"{cfg.where}: tensor fc.weight", f"missing; expected shape [{H}, {len(aux)}*{H}]")
    fc = tensors.shape_of("fc.weight")
    if tuple(fc) != (H, len(aux) * H):
        raise mismatch(f"fc.weight shape {list(fc)}; expected [{H}, {len(aux) * H}] ({len(aux)} features from "
                       f"aux_hidden_state_layer_ids {aux}, hidden size {H})")
    return tuple(a - 1 for a in aux)


def _raw(tensors, name: str) -> torch.Tensor:
    """A tensor as stored, any dtype (d2t is int64, t2d bool: the float-only reader refuses those)."""
    try:
        with safe_open(str(tensors.file_of(name)), framework="pt") as f:
            return f.get_tensor(name)
    except (OSError, RuntimeError, MemoryError, SafetensorError) as exc:
        raise InputError(tensors.file_of(name), f"cannot read tensor {name}: {exc}") from None


class Subset(LazyTensors):
    """The drafter's own tensors of a file (``names``), lazily: verifier-owned copies and identity vocabulary
    maps, once checked, are left out, so the spec holds exactly what the kernels and the reference read."""

    def __init__(self, base: LazyTensors, names: list[str]):
        super().__init__()
        self.base, self.names = base, [n for n in names if n in base]

    def _names(self) -> list[str]:
        return self.names

    def _load(self, name: str) -> torch.Tensor:
        return self.base[name]

    def shape_of(self, name: str) -> tuple[int, ...]:
        return self.base.shape_of(name)

    def dtype_of(self, name: str) -> str:
        return self.base.dtype_of(name)

    def element_bytes(self, name: str) -> int:
        return self.base.element_bytes(name)

    def file_of(self, name: str) -> Path:
        return self.base.file_of(name)

    def check_dtype(self, name: str) -> None:
        self.base.check_dtype(name)


def check_tensors(sc: SpecConfig, shapes: Shapes, target: ModelSpec, directory: Path) -> Subset:
    """Every expected tensor with its shape; verifier-owned copies equal to the target's; d2t / t2d the
    identity; nothing else in the file. Returns the expected tensors alone (a lazy view)."""
    tensors, H, V = sc.tensors, target.hidden_size, target.vocab_size
    check_shapes(tensors, shapes, directory)
    owned = {"embed_tokens.weight": ("model.embed_tokens.weight", (V, H)),
             "lm_head.weight": (None, (V, H)), "verifier_lm_head.weight": (None, (V, H)),
             "verifier_norm.weight": ("model.norm.weight", (H,))}
    for name, (tname, shape) in owned.items():
        if name not in tensors or name in shapes:
            continue
        check_shapes(tensors, {name: (shape, "(a verifier-owned copy)")}, directory)
        want = target.head_weight() if tname is None else target.tensors[tname]
        if not torch.equal(tensors[name].float(), want.float()):
            raise BadTensor(tensors.label(name), "differs from the target's; speculators reloads it from the "
                                                 "verifier (so the file's copy is not what it runs); expected equal")
    for name, shape, identity in (("d2t", (V,), lambda t: bool((t == 0).all())),
                                  ("t2d", (V,), lambda t: bool(t.bool().all()))):
        if name not in tensors:
            continue
        t = _raw(tensors, name)
        if tuple(t.shape) != shape or not identity(t):
            raise BadTensor(tensors.label(name), f"shape {list(t.shape)}, not the identity map of a full "
                                                 f"{V}-token vocabulary; a reduced draft vocabulary is not built")
    allowed = set(shapes) | set(VERIFIER_OWNED) | set(VOCAB_MAPS)
    extra = sorted(n for n in tensors if n not in allowed)
    if extra:
        raise BadTensor(tensors.label(extra[0]), f"not read by a speculators {sc.kind} drafter of this config; "
                                                 f"refused rather than ignored ({len(extra)} such tensors)")
    return Subset(tensors, list(shapes))

