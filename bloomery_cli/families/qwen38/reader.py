"""qwen38 targets (Qwen3.5 / 3.6 / 3.8 dense hybrid): ``Qwen38Spec`` from an HF directory or a GGUF.

HF (model_type "qwen3_5_text", as ``Qwen3_5ForCausalLM`` saves it, tensors ``model.*``; or "qwen3_5", the
shipped multimodal wrapper, numbers under ``text_config``, tensors ``model.language_model.*`` renamed to
``model.*``, ``model.visual.*`` ignored). Keys: hidden_size, num_hidden_layers, num_attention_heads,
num_key_value_heads, head_dim, intermediate_size, vocab_size, linear_num_key_heads,
linear_num_value_heads, linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim; layer_types
(default: every ``full_attention_interval``-th layer (4) full, as HF); rms_norm_eps (1e-6); rope_theta
and partial_rotary_factor in rope_parameters or at the top (10000, 0.25); max_position_embeddings
(32768); tie_word_embeddings (false); mtp_num_hidden_layers (0; ``mtp.*`` tensors pass through untouched).
Refused: rope_type other than "default", attention_bias true, hidden_act other than "silu".

GGUF (arch "qwen35", as llama.cpp's converter writes it; tensors renamed to HF names here, the
converter's transforms undone): ``GGUF_LAYER`` below is the name table. Transforms: every ``*norm``
weight carries the converter's +1 (the (1+w) gain baked in) except ``ssm_norm`` -> w = stored - 1;
``ssm_a`` holds -exp(A_log) -> A_log = log(-ssm_a) (float64, rounded once to float32); ``ssm_dt.bias`` is
dt_bias; ``ssm_conv1d`` [C, K] -> [C, 1, K]; when nk != nv the value heads are stored tiled
(v_j of key group i at j*nk + i) and are put back grouped (i*r + j) in attn_qkv's V rows, attn_gate,
ssm_alpha/beta rows, ssm_a, ssm_dt, ssm_conv1d's V channels and ssm_out's columns. Keys (``qwen35.``):
block_count (trunk + nextn_predict_layers), embedding_length, feed_forward_length, context_length,
attention.{head_count, head_count_kv, key_length, layer_norm_rms_epsilon}, rope.{freq_base,
dimension_count, dimension_sections}, ssm.{conv_kernel, state_size (dk), group_count (nk), time_step_rank (nv),
inner_size (nv dv)}, full_attention_interval (4) or attention.recurrent_layers. Next-token blocks
blk.{L+j}.* become ``mtp.layers.{j}.*`` and blk.{L}.nextn.{eh_proj, enorm, hnorm, shared_head_norm} become
mtp.{fc, pre_fc_norm_embedding, pre_fc_norm_hidden, norm} (+1 undone; nextn.embed_tokens /
shared_head_head, when present, become mtp.embed_tokens / mtp.lm_head). ``rope.dimension_sections`` (required,
as llama.cpp's loader requires it) must send every rotary pair to a text position stream under llama.cpp's
interleaved rope, so that the file is plain partial RoPE as computed here; any other layout is a ``BadConfig``
naming the key (``formats.rope_sections``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from bloomery_gates.errors import BadConfig, BadTensor, Refused
from bloomery_gates.registry import family
from bloomery_gates.spec import HybridShape, LayerShape, Qwen38Spec

from ...formats.config import Cfg
from ...formats.gguf_file import GGUFFile, is_gguf
from ...formats.hf_dir import model_config, open_safetensors_dir, read_config
from ...formats.lazy import LazyTensors, check_shapes, layer_bound
from ...formats.rope_sections import sections_problem
from ..qwen3.reader import _rope_theta, check_layer

FAMILY = "qwen38"
SUPPORTED_MODEL_TYPES = family(FAMILY).hf_model_types     # the registry names them
SUPPORTED_GGUF_ARCHS = family(FAMILY).gguf_archs
LAYER_TYPES = ("linear_attention", "full_attention")
Shapes = dict[str, tuple[tuple[int, ...], str]]
Fn = Callable[[torch.Tensor], torch.Tensor]

# llama.cpp block tensor name -> HF name under model.layers.{i}. (one table, read here, written by fixturegen)
GGUF_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_qkv.weight": "linear_attn.in_proj_qkv.weight",
    "attn_gate.weight": "linear_attn.in_proj_z.weight",
    "ssm_alpha.weight": "linear_attn.in_proj_a.weight",
    "ssm_beta.weight": "linear_attn.in_proj_b.weight",
    "ssm_conv1d.weight": "linear_attn.conv1d.weight",
    "ssm_a": "linear_attn.A_log",
    "ssm_dt.bias": "linear_attn.dt_bias",
    "ssm_norm.weight": "linear_attn.norm.weight",
    "ssm_out.weight": "linear_attn.out_proj.weight",
    # MoE FFNs (arch qwen35moe, formats.qwen35moe): separate ffn_{gate,up}_exps are fused on read (FusedGateUp)
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_up_exps.weight": "mlp.experts.gate_up_proj",
    "ffn_down_exps.weight": "mlp.experts.down_proj",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
}
GGUF_NEXTN = {"nextn.eh_proj.weight": "fc.weight", "nextn.enorm.weight": "pre_fc_norm_embedding.weight",
              "nextn.hnorm.weight": "pre_fc_norm_hidden.weight", "nextn.shared_head_norm.weight": "norm.weight",
              "nextn.embed_tokens.weight": "embed_tokens.weight", "nextn.shared_head_head.weight": "lm_head.weight"}
GGUF_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
               "output.weight": "lm_head.weight"}


def gguf_name(hf: str, trunk: int) -> str:
    """The llama.cpp name of an HF-named qwen38 tensor (``trunk`` = number of trunk layers)."""
    inv_layer = {v: k for k, v in GGUF_LAYER.items()}
    inv_global = {v: k for k, v in GGUF_GLOBAL.items()}
    inv_nextn = {v: k for k, v in GGUF_NEXTN.items()}
    if hf in inv_global:
        return inv_global[hf]
    for prefix, base in (("model.layers.", 0), ("mtp.layers.", trunk)):
        if hf.startswith(prefix):
            i, rest = hf[len(prefix):].split(".", 1)
            if rest in inv_layer:
                return f"blk.{base + int(i)}.{inv_layer[rest]}"
    if hf.startswith("mtp.") and hf[4:] in inv_nextn:
        return f"blk.{trunk}.{inv_nextn[hf[4:]]}"
    raise KeyError(f"no GGUF name for tensor {hf}")


MTP_INPUT_NORMS = ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight")


def baked_plus_one(hf_name: str) -> bool:
    """True where llama.cpp's converter stores w + 1: every zero-centred norm, i.e. every ``*norm.weight`` but the
    DeltaNet's gated ``linear_attn.norm``, and the MTP input norms (``nextn.enorm`` / ``nextn.hnorm``)."""
    if hf_name in MTP_INPUT_NORMS:
        return True
    return hf_name.endswith("norm.weight") and not hf_name.endswith("linear_attn.norm.weight")


def regroup_v(x: torch.Tensor, dim: int, nk: int, nv: int, width: int, to_tiled: bool) -> torch.Tensor:
    """Value heads along ``dim`` (nv blocks of ``width``) between HF's grouped order (key head i's r = nv/nk
    value heads together) and llama.cpp's tiled order; ``to_tiled`` picks the direction."""
    r = nv // nk
    shape = list(x.shape)
    dim %= len(shape)
    a, b = (nk, r) if to_tiled else (r, nk)
    x = x.reshape(*shape[:dim], a, b, width, *shape[dim + 1:])
    return x.transpose(dim, dim + 1).reshape(shape)


class MappedTensors(LazyTensors):
    """public name -> ``fn(inner[source])``, lazily; shapes from ``shapes`` (or the source's own)."""

    def __init__(self, inner: LazyTensors, table: dict[str, tuple[str, Fn | None, tuple[int, ...] | None]]):
        super().__init__()
        self.inner, self.table = inner, table

    def _names(self) -> list[str]:
        return list(self.table)

    def __contains__(self, name: object) -> bool:
        return name in self.table

    def shape_of(self, name: str) -> tuple[int, ...]:
        src, _, shape = self.table[name]
        return shape if shape is not None else self.inner.shape_of(src)

    def dtype_of(self, name: str) -> str:
        return self.inner.dtype_of(self.table[name][0])

    def element_bytes(self, name: str) -> int:
        return self.inner.element_bytes(self.table[name][0])

    def file_of(self, name: str) -> Path:
        return self.inner.file_of(self.table[name][0])

    def label(self, name: str) -> str:
        src = self.table[name][0]
        return f"{self.inner.label(src)} (= {name})" if src != name else self.inner.label(src)

    def check_dtype(self, name: str) -> None:
        self.inner.check_dtype(self.table[name][0])

    def _load(self, name: str) -> torch.Tensor:
        src, fn, _ = self.table[name]
        x = self.inner[src]
        return fn(x) if fn is not None else x


def _shapes_from_cfg(cfg: Cfg, layers: int) -> tuple[LayerShape, HybridShape]:
    if cfg.get("hidden_act", "silu") != "silu":
        raise cfg.bad("hidden_act", f"{cfg.get('hidden_act')!r} is not supported; expected \"silu\"")
    if cfg.bool("attention_bias", False):
        raise cfg.bad("attention_bias", "true is not supported; expected false")
    layer = LayerShape(cfg.int("hidden_size"), cfg.int("num_attention_heads"), cfg.int("num_key_value_heads"),
                       cfg.int("head_dim"), cfg.int("intermediate_size"), cfg.float("rms_norm_eps", 1e-6),
                       _rope_theta(cfg))
    check_layer(layer, cfg, "num_attention_heads", "num_key_value_heads")
    types = cfg.get("layer_types", None)
    if types is None:
        every = cfg.int("full_attention_interval", 4)
        types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or any(t not in LAYER_TYPES for t in types):
        raise cfg.bad("layer_types", f"{types!r}; expected {layers} entries, each one of {list(LAYER_TYPES)}")
    rope = cfg.sub("rope_parameters")
    prf = (cfg.float("partial_rotary_factor", 0.25) if rope.get("partial_rotary_factor", None) is None
           else rope.float("partial_rotary_factor"))
    hy = HybridShape(tuple(types), prf, int(layer.head_dim * prf), cfg.int("linear_num_key_heads"),
                     cfg.int("linear_num_value_heads"), cfg.int("linear_key_head_dim"),
                     cfg.int("linear_value_head_dim"), cfg.int("linear_conv_kernel_dim"),
                     cfg.int("mtp_num_hidden_layers", 0, minimum=0))
    _check_hybrid(cfg, layer, hy)
    return layer, hy


def _check_hybrid(cfg: Cfg, layer: LayerShape, hy: HybridShape) -> None:
    if hy.linear_num_value_heads % hy.linear_num_key_heads:
        raise cfg.bad("linear_num_value_heads", f"{hy.linear_num_value_heads} is not a multiple of "
                                                f"linear_num_key_heads {hy.linear_num_key_heads}")
    if hy.rotary_dim < 2 or hy.rotary_dim % 2 or hy.rotary_dim > layer.head_dim:
        raise cfg.bad("partial_rotary_factor", f"{hy.partial_rotary_factor} gives rotary dim {hy.rotary_dim}; "
                                               f"expected an even number in [2, head_dim {layer.head_dim}]")


def tensor_shapes(layer: LayerShape, hy: HybridShape, num_layers: int, vocab: int, tied: bool) -> Shapes:
    """Every tensor a qwen38 trunk must carry (HF names) with its exact shape."""
    H, d, I = layer.hidden_size, layer.head_dim, layer.intermediate_size
    nv, c = hy.linear_num_value_heads, hy.conv_dim
    s: Shapes = {"model.embed_tokens.weight": ((vocab, H), "[vocab_size, hidden_size]"),
                 "model.norm.weight": ((H,), "[hidden_size]")}
    if not tied:
        s["lm_head.weight"] = ((vocab, H), "[vocab_size, hidden_size] (tie_word_embeddings is false)")
    for i in range(num_layers):
        p = f"model.layers.{i}."
        s.update({p + "input_layernorm.weight": ((H,), "[hidden_size]"),
                  p + "post_attention_layernorm.weight": ((H,), "[hidden_size]"),
                  p + "mlp.gate_proj.weight": ((I, H), "[intermediate_size, hidden_size]"),
                  p + "mlp.up_proj.weight": ((I, H), "[intermediate_size, hidden_size]"),
                  p + "mlp.down_proj.weight": ((H, I), "[hidden_size, intermediate_size]")})
        if hy.is_linear(i):
            a = p + "linear_attn."
            s.update({a + "in_proj_qkv.weight": ((c, H), "[2*key_dim + value_dim, hidden_size]"),
                      a + "in_proj_z.weight": ((hy.value_dim, H), "[value_dim, hidden_size]"),
                      a + "in_proj_a.weight": ((nv, H), "[linear_num_value_heads, hidden_size]"),
                      a + "in_proj_b.weight": ((nv, H), "[linear_num_value_heads, hidden_size]"),
                      a + "conv1d.weight": ((c, 1, hy.linear_conv_kernel_dim), "[conv_dim, 1, linear_conv_kernel_dim]"),
                      a + "A_log": ((nv,), "[linear_num_value_heads]"),
                      a + "dt_bias": ((nv,), "[linear_num_value_heads]"),
                      a + "norm.weight": ((hy.linear_value_head_dim,), "[linear_value_head_dim]"),
                      a + "out_proj.weight": ((H, hy.value_dim), "[hidden_size, value_dim]")})
        else:
            a = p + "self_attn."
            s.update({a + "q_proj.weight": ((2 * layer.num_heads * d, H), "[2*num_heads*head_dim (q+gate), hidden]"),
                      a + "k_proj.weight": ((layer.num_kv_heads * d, H), "[num_kv_heads*head_dim, hidden_size]"),
                      a + "v_proj.weight": ((layer.num_kv_heads * d, H), "[num_kv_heads*head_dim, hidden_size]"),
                      a + "o_proj.weight": ((H, layer.num_heads * d), "[hidden_size, num_heads*head_dim]"),
                      a + "q_norm.weight": ((d,), "[head_dim]"), a + "k_norm.weight": ((d,), "[head_dim]")})
    return s


def is_qwen38(path: Path) -> bool:
    """Whether ``path`` (an HF dir or a GGUF) declares a qwen38 model (model_type / general.architecture)."""
    if path.is_dir():
        return (path / "config.json").is_file() and read_config(path).get("model_type") in SUPPORTED_MODEL_TYPES
    return is_gguf(path) and GGUFFile(path).meta("general.architecture", None) in SUPPORTED_GGUF_ARCHS


def qwen38_from_hf(directory: Path) -> Qwen38Spec:
    """A qwen38 target from ``config.json`` + safetensors in ``directory``."""
    top, cfg = model_config(directory, SUPPORTED_MODEL_TYPES)
    tensors = open_safetensors_dir(directory)
    stored = layer_bound(tensors, "model.layers.", "model.language_model.layers.")   # either layout
    num_layers = cfg.int("num_hidden_layers", what="the layer count", **stored)
    layer, hy = _shapes_from_cfg(cfg, num_layers)
    vocab = cfg.int("vocab_size")
    tied = cfg.bool("tie_word_embeddings", top.bool("tie_word_embeddings", False))
    if "model.language_model.embed_tokens.weight" in tensors:      # the multimodal wrapper's layout
        table = {n.replace("model.language_model.", "model.", 1): (n, None, None) for n in tensors
                 if not n.startswith("model.visual.")}
        tensors = MappedTensors(tensors, table)
    check_shapes(tensors, tensor_shapes(layer, hy, num_layers, vocab, tied), directory)
    return Qwen38Spec(family=FAMILY, source=directory, source_format="hf", layer=layer, num_layers=num_layers,
                      vocab_size=vocab, tie_word_embeddings=tied,
                      max_position=cfg.int("max_position_embeddings", 32768), tensors=tensors, hybrid=hy)


def _gguf_table(names: list[str], trunk: int, hy: HybridShape,
                hy_hidden: int = 0) -> dict[str, tuple[str, Fn | None, tuple | None]]:
    nk, nv, dv = hy.linear_num_key_heads, hy.linear_num_value_heads, hy.linear_value_head_dim
    table: dict[str, tuple[str, Fn | None, tuple | None]] = {}
    for g in names:
        if g in GGUF_GLOBAL:
            hf = GGUF_GLOBAL[g]
        else:
            parts = g.split(".", 2)
            if len(parts) < 3 or parts[0] != "blk" or not parts[1].isdigit():
                continue
            i, rest = int(parts[1]), parts[2]
            if rest in GGUF_NEXTN and i >= trunk:
                hf = "mtp." + GGUF_NEXTN[rest]
            elif rest in GGUF_LAYER:
                hf = (f"model.layers.{i}." if i < trunk else f"mtp.layers.{i - trunk}.") + GGUF_LAYER[rest]
            else:
                continue
        fns: list[Fn] = []
        if baked_plus_one(hf):
            fns.append(lambda x: x - 1.0)
        if hf.endswith("linear_attn.A_log"):
            fns.append(lambda x: torch.log(-x.double()).float())
        if nk != nv and ".linear_attn." in hf:
            fns.append(_untile_fn(hf, hy, nk, nv, dv))
        if hf.endswith("linear_attn.conv1d.weight"):
            fns.append(lambda x: x.reshape(x.shape[0], 1, x.shape[-1]))
        shape = (hy.conv_dim, 1, hy.linear_conv_kernel_dim) if hf.endswith("conv1d.weight") else None
        if hf.endswith("mlp.shared_expert_gate.weight"):              # GGUF {H} -> HF [1, H]
            fns.append(lambda x: x.reshape(1, -1))
            shape = (1, hy_hidden) if hy_hidden else None
        table[hf] = (g, _chain(fns), shape)
    return table


def _untile_fn(hf: str, hy: HybridShape, nk: int, nv: int, dv: int) -> Fn:
    kd2 = 2 * hy.key_dim

    def back(x: torch.Tensor, dim: int, width: int) -> torch.Tensor:
        return regroup_v(x, dim, nk, nv, width, to_tiled=False)

    if hf.endswith("in_proj_qkv.weight") or hf.endswith("conv1d.weight"):
        return lambda x: torch.cat([x[:kd2], back(x[kd2:], 0, dv)], 0)
    if hf.endswith("in_proj_z.weight"):
        return lambda x: back(x, 0, dv)
    if hf.endswith("out_proj.weight"):
        return lambda x: back(x, 1, dv)
    if hf.endswith(("in_proj_a.weight", "in_proj_b.weight", "A_log", "dt_bias")):
        return lambda x: back(x, 0, 1)
    return lambda x: x


def _chain(fns: list[Fn]) -> Fn | None:
    if not fns:
        return None

    def run(x: torch.Tensor) -> torch.Tensor:
        for f in fns:
            x = f(x)
        return x
    return run


def qwen38_from_gguf(path: Path, variant=None) -> Qwen38Spec:
    """A qwen38 target from a llama.cpp GGUF (arch "qwen35"; tensors renamed to HF names, float32). ``variant``
    (``formats.qwen35moe.GGUF_VARIANT``): another arch of the same hybrid, its own FFN keys, tensors and spec."""
    f = GGUFFile(path)
    arch = f.meta("general.architecture", None)
    archs = variant.archs if variant is not None else SUPPORTED_GGUF_ARCHS
    if arch is None:
        raise BadConfig(f"{path}: key general.architecture", f"missing; expected {archs[0]!r}")
    if arch not in archs:
        raise Refused(path, f"general.architecture is {arch!r}; this reader supports {list(archs)}")
    a = f"{arch}."
    meta = {k: f.meta(k) for k in f.meta_keys() if k.startswith(a)}
    cfg = Cfg(meta, path)
    H, heads = cfg.int(a + "embedding_length"), cfg.int(a + "attention.head_count")
    nextn = cfg.int(a + "nextn_predict_layers", 0, minimum=0)
    trunk = cfg.int(a + "block_count", what="the layer count", **layer_bound(f.tensor_names(), "blk.")) - nextn
    if trunk < 1:
        raise cfg.bad(a + "block_count", f"{trunk + nextn} with nextn_predict_layers {nextn}; expected a trunk")
    moe = variant.moe(cfg, a) if variant is not None else None
    ff = moe.expert_ff if moe is not None else cfg.int(a + "feed_forward_length")
    layer = LayerShape(H, heads, cfg.int(a + "attention.head_count_kv", heads),
                       cfg.int(a + "attention.key_length", H // heads), ff,
                       cfg.float(a + "attention.layer_norm_rms_epsilon"), cfg.float(a + "rope.freq_base", 10000.0))
    check_layer(layer, cfg, a + "attention.head_count", a + "attention.head_count_kv")
    recurrent = meta.get(a + "attention.recurrent_layers")
    if recurrent is None:
        every = cfg.int(a + "full_attention_interval", 4)
        recurrent = [bool((i + 1) % every) for i in range(trunk)]
    if not isinstance(recurrent, list) or len(recurrent) < trunk:
        raise cfg.bad(a + "attention.recurrent_layers", f"{recurrent!r}; expected one flag per layer")
    nv, rope_dim = cfg.int(a + "ssm.time_step_rank"), cfg.int(a + "rope.dimension_count")
    inner = cfg.int(a + "ssm.inner_size")
    if inner % nv:
        raise cfg.bad(a + "ssm.inner_size", f"{inner} is not a multiple of ssm.time_step_rank {nv}")
    hy = HybridShape(tuple("linear_attention" if recurrent[i] else "full_attention" for i in range(trunk)),
                     rope_dim / layer.head_dim, rope_dim, cfg.int(a + "ssm.group_count"), nv,
                     cfg.int(a + "ssm.state_size"), inner // nv, cfg.int(a + "ssm.conv_kernel"), nextn)
    _check_hybrid(cfg, layer, hy)
    problem = sections_problem(cfg.get(a + "rope.dimension_sections", what="4 rope section sizes (llama.cpp's "
                                       "qwen35 loader requires the key)"), rope_dim, layer.head_dim)
    if problem:
        raise cfg.bad(a + "rope.dimension_sections", problem)
    raw = f.tensors(rename=lambda n: n)
    if variant is not None:
        raw = variant.wrap(raw)
    if "token_embd.weight" not in raw:
        raise BadTensor(f"{path}: tensor token_embd.weight", "missing; expected [vocab, embedding_length]")
    vocab = raw.shape_of("token_embd.weight")[0]
    tensors = MappedTensors(raw, _gguf_table(list(raw), trunk, hy, H))
    tied = "lm_head.weight" not in tensors
    expected = tensor_shapes(layer, hy, trunk, vocab, tied) if moe is None else \
        variant.shapes(layer, hy, moe, trunk, vocab, tied)
    for name, (shape, why) in expected.items():
        if name not in tensors:
            raise BadTensor(f"{path}: tensor {gguf_name(name, trunk)} (= {name})",
                            f"missing; expected shape {list(shape)} {why}")
    check_shapes(tensors, expected, path)
    fields = dict(source=path, source_format="gguf", layer=layer, num_layers=trunk, vocab_size=vocab,
                  tie_word_embeddings=tied, max_position=cfg.int(a + "context_length"), tensors=tensors, hybrid=hy)
    return Qwen38Spec(family=FAMILY, **fields) if moe is None else variant.spec(moe=moe, **fields)

