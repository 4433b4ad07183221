"""deepseek4 GGUF files as llama.cpp's converter writes them (``conversion/deepseek.py`` ``DeepseekV4Model``,
llama.cpp 0c1e57098): the main file (arch ``deepseek4``, no MTP) and, with ``--mtp``, the separate MTP file
``mtp-<name>.gguf``; and the fixture ``ds4-tiny-lc`` built from ``ds4-tiny``.

    OMP_NUM_THREADS=1 python -m bloomery_cli.families.deepseek4.fixture_gguf --out fixtures      # build + register
    python -m bloomery_cli.families.deepseek4.fixture_gguf --out fixtures --gguf-out DIR [--experts bf16]

Keys (``deepseek4.`` prefix), in the converter's order: TextModel's (block_count, context_length,
embedding_length, attention.head_count, attention.head_count_kv = 1, the YaRN ``rope.scaling.*`` of the compress
rope when the config has one, rope.freq_base, attention.layer_norm_rms_epsilon, expert_count, expert_used_count,
expert_gating_func = 4 (sqrt-softplus), attention.key_length = attention.value_length = head_dim, file_type), then
DeepseekV4Model's (rope.dimension_count = qk_rope_head_dim, attention.q_lora_rank, attention.sliding_window,
expert_feed_forward_length, expert_shared_count, expert_weights_scale, expert_weights_norm, swiglu_clamp_exp[B],
swiglu_clamp_shexp[B], attention.indexer.{head_count, key_length, top_k}, attention.output_group_count,
attention.output_lora_rank, attention.compress_ratios[L + n] (one per layer plus 0 per MTP layer, as DeepSeek's
config carries them), attention.compress_rope_freq_base, hyper_connection.{count, sinkhorn_iterations, epsilon},
hash_layer_count, embedding_length_out = H * hc), and in the MTP file ``nextn_predict_layers``. B = block_count: L
in the main file, L + n in the MTP file.

Tensors (``gguf_names``): 2-D BF16 as stored, 1-D F32, ``ffn_gate_tid2eid`` I32 {k, V}, ``nextn.eh_proj`` Q8_0
(forced by the converter), routed experts MXFP4 (the converter repacks DeepSeek's FP4 losslessly; from an FP4
spec this writer repacks the same bytes, from a float spec it quantizes with gguf-py, or keeps them BF16 with
``experts="bf16"``, which the converter never writes). The main file leaves every ``mtp.*`` out; the MTP file
keeps token_embd / output_norm / output, the MTP block at ``blk.L`` and its HC head as the root ``output_hc_*``.

The fixture (``ds4-tiny-lc``): llama.cpp refuses compress ratios other than 0 / 4 / 128 (deepseek4.cpp
``load_arch_tensors``) and ds4-tiny's HCA rate is 16, so ds4-tiny cannot be written as is. ``ds4-tiny-lc`` is
ds4-tiny with its HCA layer at rate 128: the HCA compressor's position bias [16, D] tiled to [128, D] (row j =
trained row j mod 16), every other tensor unchanged, experts MXFP4 (quantized from the trained bf16). Not
retrained: a derived model (HCA entries from position 128 on), exact and deterministic, the same in both files.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from tokenizers import Tokenizer

from bloomery_gates.spec import Deepseek4Spec

from ...fixturegen.export_gguf import put_tensor, write_tokenizer
from ...fixturegen.gguf_main import export_main
from ...fixturegen.install import MAX_FIXTURE_BYTES
from ...fixturegen.manifest import Manifest, verified
from .gguf_names import ARCH, BLOCK, EH_PROJ, GLOBAL, KIND_RATIO, MTP_HEAD, NEXTN, SQRT_SOFTPLUS, mtp_name

SOURCE, NAME = "ds4-tiny", "ds4-tiny-lc"
Q = gguf.GGMLQuantizationType


def _keys(w: gguf.GGUFWriter, spec: Deepseek4Spec, name: str, mtp: int, ftype: int) -> None:
    a, at, m, ls = f"{ARCH}.", spec.attn, spec.moe, spec.layer
    blocks = spec.num_layers + mtp
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name)
    w.add_uint32(a + "block_count", blocks)
    w.add_uint32(a + "context_length", spec.max_position)
    w.add_uint32(a + "embedding_length", ls.hidden_size)
    w.add_uint32(a + "attention.head_count", at.num_heads)
    w.add_uint32(a + "attention.head_count_kv", 1)
    s = at.compress_scaling
    if s is not None:
        if s.kind != "yarn":
            raise ValueError(f"compress rope scaling {s.kind!r}: the converter writes yarn only")
        w.add_string(a + "rope.scaling.type", "yarn")
        w.add_float32(a + "rope.scaling.factor", float(s.factor))
        w.add_uint32(a + "rope.scaling.original_context_length", int(s.original_max_position))
        w.add_float32(a + "rope.scaling.yarn_beta_fast", float(s.beta_fast))
        w.add_float32(a + "rope.scaling.yarn_beta_slow", float(s.beta_slow))
    w.add_float32(a + "rope.freq_base", float(at.rope_theta))
    w.add_float32(a + "attention.layer_norm_rms_epsilon", float(ls.rms_eps))
    w.add_uint32(a + "expert_count", m.num_experts)
    w.add_uint32(a + "expert_used_count", m.top_k)
    w.add_uint32(a + "expert_gating_func", SQRT_SOFTPLUS)
    w.add_uint32(a + "attention.key_length", at.head_dim)
    w.add_uint32(a + "attention.value_length", at.head_dim)
    w.add_file_type(ftype)
    w.add_uint32(a + "rope.dimension_count", at.rope_dim)
    w.add_uint32(a + "attention.q_lora_rank", at.q_lora_rank)
    w.add_uint32(a + "attention.sliding_window", at.window)
    w.add_uint32(a + "expert_feed_forward_length", m.expert_ff)
    w.add_uint32(a + "expert_shared_count", 1)
    w.add_float32(a + "expert_weights_scale", float(m.routed_scale))
    w.add_bool(a + "expert_weights_norm", True)
    w.add_array(a + "swiglu_clamp_exp", [float(spec.swiglu_limit)] * blocks)
    w.add_array(a + "swiglu_clamp_shexp", [float(spec.swiglu_limit)] * blocks)
    w.add_uint32(a + "attention.indexer.head_count", at.index_heads)
    w.add_uint32(a + "attention.indexer.key_length", at.index_head_dim)
    w.add_uint32(a + "attention.indexer.top_k", at.index_topk)
    w.add_uint32(a + "attention.output_group_count", at.o_groups)
    w.add_uint32(a + "attention.output_lora_rank", at.o_lora_rank)
    w.add_array(a + "attention.compress_ratios", ratios(spec) + [0] * max(spec.mtp_layers, mtp))
    w.add_float32(a + "attention.compress_rope_freq_base", float(at.compress_theta))
    w.add_uint32(a + "hyper_connection.count", spec.hc.count)
    w.add_uint32(a + "hyper_connection.sinkhorn_iterations", spec.hc.sinkhorn_iters)
    w.add_float32(a + "hyper_connection.epsilon", float(spec.hc.eps))
    w.add_uint32(a + "hash_layer_count", sum(k == "hash" for k in spec.mlp_types))
    w.add_uint32(a + "embedding_length_out", ls.hidden_size * spec.hc.count)
    if mtp:
        w.add_uint32(a + "nextn_predict_layers", mtp)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def ratios(spec: Deepseek4Spec) -> list[int]:
    """llama.cpp's compress_ratios of the trunk (ValueError where a rate is not one llama.cpp accepts)."""
    rate = {"sliding": 0, "csa": spec.attn.csa_rate, "hca": spec.attn.hca_rate}
    out = [rate[k] for k in spec.layer_types]
    for k, r in zip(spec.layer_types, out, strict=True):
        if r != KIND_RATIO[k]:
            raise ValueError(f"{k} rate {r}: llama.cpp's deepseek4 loader accepts only ratios 0 / 4 (CSA) / 128 "
                             "(HCA); write a derived spec (for_llamacpp) or refuse")
    n_hash = sum(k == "hash" for k in spec.mlp_types)
    if any(k != "hash" for k in spec.mlp_types[:n_hash]):
        raise ValueError(f"mlp_types {spec.mlp_types}: llama.cpp takes hash layers first (hash_layer_count)")
    return out


def _put(w: gguf.GGUFWriter, name: str, t: torch.Tensor, kind: str = "auto") -> None:
    """One tensor in the converter's type: I32 tables, Q8_0 / MXFP4 quantized, 2-D+ BF16, 1-D F32."""
    t = t.detach().to("cpu")
    if kind == "i32":
        w.add_tensor(name, t.to(torch.int32).numpy())
    elif kind in ("q8_0", "mxfp4"):
        qt = Q.Q8_0 if kind == "q8_0" else Q.MXFP4
        w.add_tensor(name, gguf.quants.quantize(t.float().numpy(), qt), raw_dtype=qt)
    else:
        put_tensor(w, name, t, False)


def mxfp4_blocks(codes: torch.Tensor, scales: torch.Tensor) -> np.ndarray:
    """HF / DeepSeek FP4 ([..., R, K/2] codes, element 2j low nibble; [..., R, K/32] e8m0) -> ggml block_mxfp4 bytes
    [..., R, K/32 * 17]: per 32 weights the scale byte, then 16 bytes, byte j = element j | element j+16 << 4.
    Lossless: the same e2m1 codes and e8m0 exponents (ggml doubles the code values and halves the scale)."""
    c, s = codes.view(torch.uint8), scales.view(torch.uint8)
    lead, nb = c.shape[:-1], s.shape[-1]
    src = c.reshape(*lead, nb, 16)
    vals = torch.stack((src & 0x0F, src >> 4), dim=-1).reshape(*lead, nb, 32)
    qs = vals[..., :16] | (vals[..., 16:] << 4)
    return torch.cat((s.unsqueeze(-1), qs), dim=-1).reshape(*lead, nb * 17).numpy()


def _experts(w: gguf.GGUFWriter, spec: Deepseek4Spec, blk: int, hf: str, T: Any, experts: str) -> None:
    ff = spec.moe.expert_ff
    gu, dn = T[hf + "mlp.experts.gate_up_proj"], T[hf + "mlp.experts.down_proj"]
    parts = {"ffn_gate_exps.weight": (gu[:, :ff], "gate"), "ffn_down_exps.weight": (dn, "down"),
             "ffn_up_exps.weight": (gu[:, ff:], "up")}          # the converter's order: w1, w2, w3
    for g, (x, what) in parts.items():
        name = f"blk.{blk}.{g}"
        if spec.experts_mxfp4:
            sc = T[hf + ("mlp.experts.down_proj" if what == "down" else "mlp.experts.gate_up_proj") + "_scale_inv"]
            sc = sc if what == "down" else (sc[:, :ff] if what == "gate" else sc[:, ff:])
            w.add_tensor(name, mxfp4_blocks(x.contiguous(), sc.contiguous()), raw_dtype=Q.MXFP4)
        else:
            _put(w, name, x.contiguous(), "mxfp4" if experts == "mxfp4" else "auto")


def _block(w: gguf.GGUFWriter, spec: Deepseek4Spec, blk: int, hf: str, T: Any, experts: str, hash_layer: bool
           ) -> None:
    if hash_layer:
        _put(w, f"blk.{blk}.ffn_gate_tid2eid.weight", T[hf + "mlp.gate.tid2eid"], "i32")
    _experts(w, spec, blk, hf, T, experts)
    for src, dst in BLOCK.items():
        if hf + src not in T or src == "mlp.gate.tid2eid" or (hash_layer and src.endswith("correction_bias")):
            continue                     # the converter drops a hash layer's gate.bias (unused by its graph)
        _put(w, f"blk.{blk}.{dst}", T[hf + src])


def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _ftype(spec: Deepseek4Spec, experts: str) -> int:
    return int(gguf.LlamaFileType.MOSTLY_MXFP4_MOE if spec.experts_mxfp4 or experts == "mxfp4"
               else gguf.LlamaFileType.MOSTLY_BF16)


def write_main(path: Path, spec: Deepseek4Spec, tok: Tokenizer, name: str = NAME, experts: str = "mxfp4",
               drop: tuple[str, ...] = ()) -> Path:
    """The main GGUF (the converter without ``--mtp``: no ``mtp.*``). ``drop``: GGUF names left out (tests)."""
    T = spec.tensors
    w = gguf.GGUFWriter(str(path), ARCH)
    _keys(w, spec, name, 0, _ftype(spec, experts))
    write_tokenizer(w, tok, pad=False)
    inner = _Dropping(w, drop)
    for i in range(spec.num_layers):
        _block(inner, spec, i, f"model.layers.{i}.", T, experts, spec.mlp_types[i] == "hash")
    for src, dst in GLOBAL.items():
        src = src if src in T else ("model.embed_tokens.weight" if src == "lm_head.weight" else src)
        _put(inner, dst, T[src])
    _finish(w)
    return path


def write_mtp(path: Path, spec: Deepseek4Spec, tok: Tokenizer, name: str = NAME, experts: str = "mxfp4",
              drop: tuple[str, ...] = ()) -> Path:
    """The MTP file (the converter with ``--mtp``): block_count L + 1, nextn_predict_layers 1, blk.L = mtp.0.*,
    nextn.eh_proj = [e_proj | h_proj] (Q8_0), the MTP's hc_head as output_hc_*, token_embd / output_norm / output."""
    T, L = spec.tensors, spec.num_layers
    if spec.mtp_layers != 1 or "mtp.0.e_proj.weight" not in T:
        raise ValueError(f"{spec.source}: no MTP block (num_nextn_predict_layers {spec.mtp_layers})")
    w = gguf.GGUFWriter(str(path), ARCH)
    _keys(w, spec, name, 1, _ftype(spec, experts))
    write_tokenizer(w, tok, pad=False)
    inner = _Dropping(w, drop)
    _experts(inner, spec, L, "mtp.0.", T, experts)
    _put(inner, f"blk.{L}.{EH_PROJ}", torch.cat((T["mtp.0.e_proj.weight"], T["mtp.0.h_proj.weight"]), 1), "q8_0")
    for src, dst in NEXTN.items():
        _put(inner, f"blk.{L}.{dst}", T["mtp.0." + src])
    for src, dst in MTP_HEAD.items():
        _put(inner, dst, T["mtp.0." + src])
    for src, dst in BLOCK.items():
        if "mtp.0." + src in T:
            _put(inner, f"blk.{L}.{dst}", T["mtp.0." + src])
    head = "lm_head.weight" if "lm_head.weight" in T else "model.embed_tokens.weight"
    for src, dst in (("model.embed_tokens.weight", "token_embd.weight"), ("model.norm.weight", "output_norm.weight"),
                     (head, "output.weight")):
        _put(inner, dst, T[src])
    _finish(w)
    return path


class _Dropping:
    """A GGUFWriter whose add_tensor skips names ending in one of ``drop`` (the FAIL-first plants)."""

    def __init__(self, w: gguf.GGUFWriter, drop: tuple[str, ...]):
        self.w, self.drop = w, drop

    def add_tensor(self, name: str, *a: Any, **k: Any) -> None:
        if not any(name.endswith(d) for d in self.drop):
            self.w.add_tensor(name, *a, **k)


def _pad_front(x: torch.Tensor, groups: int, width: int, dim: int) -> torch.Tensor:
    """``x`` with each of its ``groups`` blocks along ``dim`` zero-padded at the FRONT to ``width`` (the leading,
    un-roped channels of a head)."""
    parts = x.chunk(groups, dim)
    pad = [list(p.shape) for p in parts]
    out = []
    for p, shape in zip(parts, pad, strict=True):
        shape[dim] = width - p.shape[dim]
        out += [torch.zeros(shape, dtype=p.dtype), p]
    return torch.cat(out, dim)


def for_llamacpp(spec: Deepseek4Spec, hca_rate: int = 128, index_head_dim: int = 64) -> Deepseek4Spec:
    """``spec`` made loadable by llama.cpp's deepseek4 graph (module docstring), the same function where exact:

    * HCA layers at compress rate ``hca_rate``: each HCA compressor position bias [r, D] tiled to [hca_rate, D]
      (row j = row j mod r). A changed model: each HCA entry pools 128 rows, the first at position 128.
    * the indexer head width di -> ``index_head_dim`` (llama.cpp rotates the indexer's q and keys by a Hadamard
      block of at least 64 channels, llama-kv-cache.cpp ``build_input_k_rot``: di must be a multiple of 64): zero
      channels in front of each head's di (the rope stays on the trailing channels) in q_b, the compressor's
      kv / gate rows and position bias; the compressor norm gain times sqrt(di / di') so the normed keys keep
      their values (up to eps). The scores then scale by sqrt(di / di') > 0 uniformly: the top-k is unchanged.

    Every other tensor is the same object."""
    a = spec.attn
    old, di = a.hca_rate, a.index_head_dim
    if hca_rate % old or index_head_dim < di or (index_head_dim != di and index_head_dim % 64):
        raise ValueError(f"HCA rate {old} -> {hca_rate}, indexer width {di} -> {index_head_dim}: not derivable")
    T = dict(spec.tensors.items())
    for i, k in enumerate(spec.layer_types):
        p = f"model.layers.{i}.self_attn.compressor."
        if k == "hca":
            T[p + "position_bias"] = T[p + "position_bias"].repeat(hca_rate // old, 1)
        if k == "csa" and index_head_dim != di:
            ix = p + "indexer."
            for n in ("kv_proj.weight", "gate_proj.weight"):
                T[ix + n] = _pad_front(T[ix + n], 2, index_head_dim, 0)
            T[ix + "position_bias"] = _pad_front(T[ix + "position_bias"], 2, index_head_dim, 1)
            T[ix + "q_b_proj.weight"] = _pad_front(T[ix + "q_b_proj.weight"], a.index_heads, index_head_dim, 0)
            norm = T[ix + "kv_norm.weight"]
            g = norm.float() * (di / index_head_dim) ** 0.5
            T[ix + "kv_norm.weight"] = torch.cat([torch.ones(index_head_dim - di), g]).to(norm.dtype)
    return replace(spec, attn=replace(a, hca_rate=hca_rate, index_head_dim=index_head_dim), tensors=T)


def export(fixtures: Path, out: Path | None = None, experts: str = "mxfp4") -> tuple[Path, Path]:
    """``ds4-tiny-lc.gguf`` and ``mtp-ds4-tiny-lc.gguf`` from ``fixtures/ds4-tiny`` (module docstring), read back
    through the harness's readers; into ``out`` unregistered, or into ``fixtures`` and its manifest."""
    from ...loading import load_target

    src = load_target(fixtures / SOURCE)
    spec = for_llamacpp(src)
    tok = Tokenizer.from_file(str(fixtures / SOURCE / "tokenizer.json"))
    where = out or fixtures
    main = where / f"{NAME}.gguf"
    done = []
    for dst, fn in ((main, write_main), (mtp_name(main), write_mtp)):
        tmp = dst.with_name(dst.name + ".tmp")
        fn(tmp, spec, tok, experts=experts)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dst)
        done.append(dst)
    check_readback(main, mtp_name(main), spec)
    if out is not None:
        return main, mtp_name(main)
    man = Manifest.read(fixtures)
    man.add_files(fixtures, done)
    if man.stored_bytes > MAX_FIXTURE_BYTES:
        for d in done:
            d.unlink()
        raise RuntimeError(f"fixtures would store {man.stored_bytes} bytes, over {MAX_FIXTURE_BYTES}")
    man.models[NAME] = {
        "files": sorted(d.name for d in done), "architecture": "deepseek4 GGUF (llama.cpp's converter layout)",
        "from": f"{SOURCE}/model.safetensors through for_llamacpp: the HCA layer's compressor position bias "
                "tiled 16 -> 128 rows (llama.cpp accepts compress ratios 0 / 4 / 128 only); the indexer head width "
                "8 -> 64, zero channels in front of each head (llama.cpp's Hadamard rotation of the indexer needs "
                "a multiple of 64), its compressor norm gain x sqrt(8/64); not retrained",
        "experts": experts, "shape": {"compress_ratios": ratios(spec), "sliding_window": spec.attn.window,
                                      "index_head_dim": spec.attn.index_head_dim, "hca_first_entry_at": 128},
        "gguf_export": {"command": "python -m bloomery_cli.families.deepseek4.fixture_gguf --out fixtures",
                        "layout": "llama.cpp converter (conversion/deepseek.py DeepseekV4Model), main file without "
                                  "MTP + mtp-<name>.gguf (--mtp), eh_proj Q8_0, routed experts MXFP4"}}
    man.write(fixtures)
    verified(fixtures, "deepseek4 GGUF export")
    return main, mtp_name(main)


def check_readback(main: Path, mtp: Path | None, spec: Deepseek4Spec) -> None:
    """Every trunk tensor (and MTP tensor, with ``mtp``) of ``spec`` read back through the GGUF readers: equal, to
    the bit, except the ones the converter quantizes (MXFP4 experts from float, Q8_0 eh_proj: within their format's
    step). Shapes equal. RuntimeError naming the first difference."""
    from .reader_gguf import deepseek4_from_gguf
    from .reader_mtp_gguf import deepseek4_mtp_from_gguf

    got = deepseek4_from_gguf(main)
    want = {n: spec.tensors[n] for n in spec.tensors if not n.startswith("mtp.")}
    if not spec.tie_word_embeddings and "lm_head.weight" not in want:
        raise RuntimeError("spec has no lm_head")
    want.setdefault("lm_head.weight", spec.tensors["model.embed_tokens.weight"])
    for n in [n for n in want if n.endswith("e_score_correction_bias")]:
        if spec.mlp_types[int(n.split(".")[2])] == "hash":
            del want[n]                            # the converter drops a hash layer's unused bias
    quantized = got.experts_mxfp4 and not spec.experts_mxfp4
    _compare(got.tensors, want, main, quantized)
    if (got.attn, got.layer_types, got.mlp_types, got.hc, got.moe.top_k) != \
            (spec.attn, spec.layer_types, spec.mlp_types, spec.hc, spec.moe.top_k):
        raise RuntimeError(f"{main}: shapes read back {got.attn}, {got.layer_types}; expected {spec.attn}")
    if mtp is not None:
        d = deepseek4_mtp_from_gguf(mtp, got)
        want = {n: spec.tensors[n] for n in spec.tensors if n.startswith("mtp.")}
        _compare(d.tensors, want, mtp, quantized, q8=("mtp.0.e_proj.weight", "mtp.0.h_proj.weight"))


def _compare(got: Any, want: dict[str, torch.Tensor], where: Path, quantized: bool, q8: tuple[str, ...] = ()) -> None:
    if quantized:                                   # float experts written MXFP4: compared by shape here
        want = {n: w for n, w in want.items() if ".experts." not in n}
        got_names = {n for n in got if ".experts." not in n}
    else:
        got_names = set(got)
    if got_names != set(want):
        raise RuntimeError(f"{where}: tensor set differs: {sorted(got_names ^ set(want))[:6]}")
    for n, w in want.items():
        g = got[n]
        if n in q8:                                 # Q8_0: 8-bit codes, per 32 a scale max|x| / 127
            step = float(w.float().abs().max()) / 127
            ok = bool(((g.float() - w.float()).abs() <= step).all())
        else:
            ok = torch.equal(g.float() if g.is_floating_point() else g, w.float() if w.is_floating_point() else w)
        if not ok:
            raise RuntimeError(f"{where}: {n} does not read back as written")


def main(argv: list[str] | None = None) -> int:
    return export_main(argv, __doc__, SOURCE, export, "experts", ("mxfp4", "bf16"),
                       "--experts bf16 only with --gguf-out (the bundled files are the converter's MXFP4 layout)",
                       gguf_out_help="write the two files into this folder, unregistered")


if __name__ == "__main__":
    raise SystemExit(main())
