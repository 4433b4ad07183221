"""qwen35moe targets (Qwen3.5 / 3.6-MoE): ``Qwen35MoeSpec`` from an HF directory or a llama.cpp GGUF.

The qwen38 hybrid (``formats.qwen38``: the same keys, layer types, DeltaNet and gated attention, mtp.*) with every
FFN a mixture of experts (HF ``Qwen3_5MoeSparseMoeBlock``). HF model_type "qwen3_5_moe_text" (as
``Qwen3_5MoeForCausalLM`` saves it, tensors ``model.*``) or "qwen3_5_moe" (the multimodal wrapper: numbers under
``text_config``, tensors ``model.language_model.*`` renamed to ``model.*``, ``model.visual.*`` ignored).

MoE keys: num_experts (E), num_experts_per_tok (k), moe_intermediate_size (ff), shared_expert_intermediate_size
(the shared expert's width). The router always renormalises (HF has no ``norm_topk_prob`` for this family: a
``norm_topk_prob`` false is refused); every layer is sparse (``mlp_only_layers`` non-empty or
``decoder_sparse_step`` other than 1 is refused). Tensors per layer, under ``model.layers.{i}.mlp.``:
    gate.weight [E, H]; experts.gate_up_proj [E, 2 ff, H] and experts.down_proj [E, H, ff] (fused, as HF saves
    them) or per expert experts.{e}.{gate,up,down}_proj.weight (stacked here into the fused names, lazily);
    shared_expert.{gate,up}_proj.weight [sff, H], shared_expert.down_proj.weight [H, sff]; shared_expert_gate.weight
    [1, H]. The MTP layer ``mtp.layers.0.mlp.*`` has the same set.

GGUF (arch "qwen35moe", llama.cpp's converter): qwen38's keys and names (``formats.qwen38``: +1 on the norms, ssm_a,
the V-head tiling when value heads outnumber key heads, block_count = trunk + nextn_predict_layers, blk.{L}.nextn.*)
plus ``qwen35moe.{expert_count, expert_used_count, expert_feed_forward_length, expert_shared_feed_forward_length}``
and per block ffn_gate_inp {H, E}, ffn_{gate,up}_exps {H, ff, E} (or the fused ffn_gate_up_exps {H, 2ff, E}),
ffn_down_exps {ff, H, E}, ffn_{gate,up,down}_shexp, ffn_gate_inp_shexp {H} (HF [1, H]).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from bloomery_gates.registry import family
from bloomery_gates.spec import HybridShape, LayerShape, MoEShape, Qwen35MoeSpec

from ...formats.config import Cfg
from ...formats.gguf_file import GGUFFile, is_gguf
from ...formats.hf_dir import model_config, open_safetensors_dir, read_config
from ...formats.lazy import LazyTensors, check_shapes, layer_bound
from ..qwen38.reader import MappedTensors, Shapes, _shapes_from_cfg, qwen38_from_gguf
from ..qwen38.reader import tensor_shapes as qwen38_shapes

FAMILY = "qwen35moe"
SUPPORTED_MODEL_TYPES = family(FAMILY).hf_model_types     # the registry names them
SUPPORTED_GGUF_ARCHS = family(FAMILY).gguf_archs
PER_EXPERT = ("gate_proj", "up_proj", "down_proj")


def moe_shape(cfg: Cfg) -> MoEShape:
    """The MoE numbers of a qwen3_5_moe text config (refusing the keys this family does not act on)."""
    e, k = cfg.int("num_experts", minimum=1), cfg.int("num_experts_per_tok", minimum=1)
    if k > e:
        raise cfg.bad("num_experts_per_tok", f"{k} is more than num_experts {e}; expected <= {e}")
    if not cfg.bool("norm_topk_prob", True):
        raise cfg.bad("norm_topk_prob", "false is not supported; Qwen3.5-MoE always renormalises (expected true)")
    if cfg.get("mlp_only_layers", None) not in (None, []):
        raise cfg.bad("mlp_only_layers", f"{cfg.get('mlp_only_layers')!r}: dense layers are not supported; expected []")
    if cfg.int("decoder_sparse_step", 1) != 1:
        raise cfg.bad("decoder_sparse_step", f"{cfg.get('decoder_sparse_step')}: expected 1 (every layer sparse)")
    shared = cfg.int("shared_expert_intermediate_size", minimum=0)
    return MoEShape(num_experts=e, top_k=k, expert_ff=cfg.int("moe_intermediate_size", minimum=1),
                    shared_ff=shared or None, shared_gated=bool(shared), router="softmax")


def moe_layer_shapes(prefix: str, hidden: int, moe: MoEShape) -> Shapes:
    """The MoE FFN tensors of one layer (``prefix`` ends in "mlp.")."""
    H, E, ff = hidden, moe.num_experts, moe.expert_ff
    s: Shapes = {prefix + "gate.weight": ((E, H), "[num_experts, hidden_size]"),
                 prefix + "experts.gate_up_proj": ((E, 2 * ff, H), "[num_experts, 2*moe_intermediate_size, hidden]"),
                 prefix + "experts.down_proj": ((E, H, ff), "[num_experts, hidden_size, moe_intermediate_size]")}
    if moe.shared_ff:
        sff, sp = moe.shared_ff, prefix + "shared_expert."
        s.update({sp + "gate_proj.weight": ((sff, H), "[shared_expert_intermediate_size, hidden_size]"),
                  sp + "up_proj.weight": ((sff, H), "[shared_expert_intermediate_size, hidden_size]"),
                  sp + "down_proj.weight": ((H, sff), "[hidden_size, shared_expert_intermediate_size]"),
                  prefix + "shared_expert_gate.weight": ((1, H), "[1, hidden_size]")})
    return s


def tensor_shapes(layer: LayerShape, hy: HybridShape, moe: MoEShape, num_layers: int, vocab: int, tied: bool,
                  prefix: str = "model.layers.") -> Shapes:
    """Every tensor a qwen35moe trunk must carry: qwen38's, with each layer's dense MLP replaced by the MoE set."""
    s = {n: v for n, v in qwen38_shapes(layer, hy, num_layers, vocab, tied).items() if ".mlp." not in n}
    if prefix != "model.layers.":
        s = {n.replace("model.layers.", prefix, 1): v for n, v in s.items() if n.startswith("model.layers.")}
    for i in range(num_layers):
        s.update(moe_layer_shapes(f"{prefix}{i}.mlp.", layer.hidden_size, moe))
    return s


class StackedExperts(LazyTensors):
    """``inner`` with per-expert tensors ``...experts.{e}.{gate,up,down}_proj.weight`` presented as the fused
    ``...experts.gate_up_proj`` [E, 2 ff, H] (gate rows, then up rows) and ``...experts.down_proj`` [E, H, ff],
    stacked on first access; every other name passes through."""

    def __init__(self, inner: LazyTensors, num_experts: int):
        super().__init__()
        self.inner, self.e = inner, num_experts
        self.fused: dict[str, list[str]] = {}
        hidden: set[str] = set()
        stored: dict[str, set[str]] = {}         # per layer: the expert indices its names hold
        for n in inner:
            head, sep, rest = n.partition(".experts.")
            idx = rest.split(".", 1)[0]
            if sep and idx.isdigit() and rest.endswith(".weight"):
                stored.setdefault(head, set()).add(idx)
        for head, have in stored.items():       # before any table sized by the config's claim is built
            if num_experts > len(have):
                from bloomery_gates.errors import BadTensor
                raise BadTensor(f"{inner.file_of(next(iter(inner)))}: tensor {head}.experts.<e>.*",
                                f"num_experts is {num_experts} but the file stores {len(have)} experts for this "
                                "layer; expected every expert stored")
        for n in inner:
            head, sep, rest = n.partition(".experts.")
            idx = rest.split(".", 1)[0]
            if sep and idx.isdigit() and rest.endswith(".weight"):
                hidden.add(n)
                base = head + ".experts."
                if base + "gate_up_proj" not in self.fused:
                    self.fused[base + "gate_up_proj"] = [f"{base}{j}.{w}.weight" for j in range(num_experts)
                                                         for w in PER_EXPERT[:2]]
                    self.fused[base + "down_proj"] = [f"{base}{j}.down_proj.weight" for j in range(num_experts)]
        self.names = [n for n in inner if n not in hidden] + list(self.fused)

    def _names(self) -> list[str]:
        return self.names

    def _sources(self, name: str) -> list[str]:
        return self.fused.get(name, [name])

    def _present(self, name: str) -> list[str]:
        missing = [s for s in self._sources(name) if s not in self.inner]
        if missing:
            from bloomery_gates.errors import BadTensor
            raise BadTensor(f"{self.inner.file_of(next(iter(self.inner)))}: tensor {missing[0]}",
                            f"missing; expected all {self.e} experts stored per expert")
        return self._sources(name)

    def shape_of(self, name: str) -> tuple[int, ...]:
        if name not in self.fused:
            return self.inner.shape_of(name)
        src = self._present(name)
        one = self.inner.shape_of(src[0])
        return (self.e, 2 * one[0], one[1]) if name.endswith("gate_up_proj") else (self.e, *one)

    def dtype_of(self, name: str) -> str:
        return self.inner.dtype_of(self._sources(name)[0])

    def file_of(self, name: str) -> Path:
        return self.inner.file_of(self._sources(name)[0])

    def label(self, name: str) -> str:
        src = self._sources(name)
        return self.inner.label(src[0]) + (f" (and {len(src) - 1} more, = {name})" if len(src) > 1 else "")

    def check_dtype(self, name: str) -> None:
        for s in self._sources(name):
            self.inner.check_dtype(s)

    def _load(self, name: str) -> torch.Tensor:
        src = self._present(name)
        if name not in self.fused:
            return self.inner[name]
        parts = [self.inner[s] for s in src]
        if name.endswith("gate_up_proj"):
            return torch.stack([torch.cat(parts[2 * j:2 * j + 2], 0) for j in range(self.e)])
        return torch.stack(parts)


def is_qwen35moe(path: Path) -> bool:
    """Whether ``path`` (an HF directory or a GGUF) declares a qwen3_5_moe model (model_type / architecture)."""
    if path.is_dir():
        return (path / "config.json").is_file() and read_config(path).get("model_type") in SUPPORTED_MODEL_TYPES
    return is_gguf(path) and GGUFFile(path).meta("general.architecture", None) in SUPPORTED_GGUF_ARCHS


class FusedGateUp(LazyTensors):
    """GGUF tensors with each ``blk.i.ffn_gate_exps`` / ``blk.i.ffn_up_exps`` pair (numpy [E, ff, H] each) presented as
    ``blk.i.ffn_gate_up_exps.weight`` [E, 2 ff, H] (gate rows first, as HF's gate_up_proj), on first access."""

    def __init__(self, inner: LazyTensors):
        super().__init__()
        self.inner = inner
        self.pairs = {n.replace("ffn_gate_exps", "ffn_gate_up_exps"): (n, n.replace("ffn_gate_exps", "ffn_up_exps"))
                      for n in inner if n.endswith("ffn_gate_exps.weight")}
        used = {x for pair in self.pairs.values() for x in pair if x in inner}
        self.names = [n for n in inner if n not in used] + list(self.pairs)

    def _names(self) -> list[str]:
        return self.names

    def _src(self, name: str) -> str:
        return self.pairs[name][0] if name in self.pairs else name

    def shape_of(self, name: str) -> tuple[int, ...]:
        if name not in self.pairs:
            return self.inner.shape_of(name)
        g, u = (self.inner.shape_of(x) if x in self.inner else None for x in self.pairs[name])
        if u is None or tuple(g) != tuple(u):
            from bloomery_gates.errors import BadTensor
            raise BadTensor(f"{self.inner.file_of(self.pairs[name][0])}: tensor {self.pairs[name][1]}",
                            f"{'missing' if u is None else f'shape {list(u)}'}; expected the shape of "
                            f"{self.pairs[name][0]} {list(g)}")
        return (g[0], 2 * g[1], g[2])

    def dtype_of(self, name: str) -> str:
        return self.inner.dtype_of(self._src(name))

    def file_of(self, name: str) -> Path:
        return self.inner.file_of(self._src(name))

    def label(self, name: str) -> str:
        return self.inner.label(self._src(name)) + (" (+ ffn_up_exps)" if name in self.pairs else "")

    def check_dtype(self, name: str) -> None:
        for x in self.pairs.get(name, (name,)):
            self.inner.check_dtype(x)

    def _load(self, name: str) -> torch.Tensor:
        if name not in self.pairs:
            return self.inner[name]
        self.shape_of(name)
        g, u = self.pairs[name]
        return torch.cat([self.inner[g], self.inner[u]], dim=1)


def gguf_moe_shape(cfg: Cfg, a: str) -> MoEShape:
    """The MoE numbers of a qwen35moe GGUF (llama.cpp's keys)."""
    e, k = cfg.int(a + "expert_count", minimum=1), cfg.int(a + "expert_used_count", minimum=1)
    if k > e:
        raise cfg.bad(a + "expert_used_count", f"{k} is more than expert_count {e}; expected <= {e}")
    shared = cfg.int(a + "expert_shared_feed_forward_length", 0, minimum=0)
    return MoEShape(num_experts=e, top_k=k, expert_ff=cfg.int(a + "expert_feed_forward_length", minimum=1),
                    shared_ff=shared or None, shared_gated=bool(shared), router="softmax")


@dataclass(frozen=True)
class GGUFVariant:
    """What ``formats.qwen38.qwen38_from_gguf`` needs to read another arch of the hybrid."""

    archs: tuple[str, ...]
    moe: Callable[[Cfg, str], MoEShape]
    wrap: Callable[[LazyTensors], LazyTensors]
    shapes: Callable[..., Shapes]
    spec: Callable[..., Qwen35MoeSpec]


GGUF_VARIANT = GGUFVariant(SUPPORTED_GGUF_ARCHS, gguf_moe_shape, FusedGateUp, tensor_shapes,
                           lambda **kw: Qwen35MoeSpec(family=FAMILY, **kw))


def qwen35moe_from_gguf(path: Path) -> Qwen35MoeSpec:
    """A qwen35moe target from a llama.cpp GGUF (arch "qwen35moe"): qwen38's GGUF reader (names, the converter's
    transforms undone, V heads regrouped) with the MoE keys and tensors (``GGUF_VARIANT``)."""
    return qwen38_from_gguf(path, GGUF_VARIANT)


def qwen35moe_from_hf(directory: Path) -> Qwen35MoeSpec:
    """A qwen35moe target from ``config.json`` + safetensors in ``directory``."""
    top, cfg = model_config(directory, SUPPORTED_MODEL_TYPES)
    tensors: LazyTensors = open_safetensors_dir(directory)
    stored = layer_bound(tensors, "model.layers.", "model.language_model.layers.")
    num_layers = cfg.int("num_hidden_layers", what="the layer count", **stored)
    moe = moe_shape(cfg)
    # qwen38's reader takes the attention / DeltaNet numbers; the MLP width it reads is the expert width here
    dense_view = Cfg({**cfg.data, "intermediate_size": moe.expert_ff}, cfg.where, cfg.prefix)
    layer, hy = _shapes_from_cfg(dense_view, num_layers)
    vocab = cfg.int("vocab_size")
    tied = cfg.bool("tie_word_embeddings", top.bool("tie_word_embeddings", False))
    if "model.language_model.embed_tokens.weight" in tensors:
        table = {n.replace("model.language_model.", "model.", 1): (n, None, None) for n in tensors
                 if not n.startswith("model.visual.")}
        tensors = MappedTensors(tensors, table)
    if any(".experts.0." in n for n in tensors):
        tensors = StackedExperts(tensors, moe.num_experts)
    check_shapes(tensors, tensor_shapes(layer, hy, moe, num_layers, vocab, tied), directory)
    return Qwen35MoeSpec(family=FAMILY, source=directory, source_format="hf", layer=layer, num_layers=num_layers,
                         vocab_size=vocab, tie_word_embeddings=tied,
                         max_position=cfg.int("max_position_embeddings", 32768), tensors=tensors, hybrid=hy, moe=moe)
