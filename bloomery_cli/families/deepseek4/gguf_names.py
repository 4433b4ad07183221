"""deepseek4 tensor names: the HF checkpoint's (this repo's reader, ``reader.py``) <-> llama.cpp's GGUF (arch
``deepseek4``; ``src/llama-arch.cpp`` names, ``conversion/deepseek.py`` ``DeepseekV4Model`` mapping, llama.cpp
0c1e57098). Shared by the GGUF writer (``fixture_gguf``) and the readers (``reader_gguf``, ``reader_mtp_gguf``).

Every name is a plain rename (transformers' ``deepseek_v4`` conversion mapping renames DeepSeek's own names without
permuting a row, and llama.cpp's converter reads DeepSeek's names), except:

* the routed experts: HF ``mlp.experts.gate_up_proj`` [E, 2 ff, H] = [gate | up] rows (transformers concatenates
  w1, w3) <-> ``ffn_gate_exps`` / ``ffn_up_exps`` [E, ff, H]; ``down_proj`` [E, H, ff] <-> ``ffn_down_exps``;
* the MTP block: ``e_proj`` / ``h_proj`` [H, H] <-> ``nextn.eh_proj`` [H, 2H] = [e | h] columns, embedding first;
  its ``hc_head`` <-> the MTP file's root ``output_hc_*``.
"""

from __future__ import annotations

from pathlib import Path

ARCH = "deepseek4"
SQRT_SOFTPLUS = 4                       # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS
RATIOS = {0: "sliding", 4: "csa", 128: "hca"}     # the only compress ratios llama.cpp's loader accepts
KIND_RATIO = {v: k for k, v in RATIOS.items()}

GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
          "lm_head.weight": "output.weight", "model.hc_head.hc_fn": "output_hc_fn.weight",
          "model.hc_head.hc_base": "output_hc_base.weight", "model.hc_head.hc_scale": "output_hc_scale.weight"}
_CP, _IX = "self_attn.compressor.", "self_attn.compressor.indexer."
BLOCK = {"input_layernorm.weight": "attn_norm.weight", "self_attn.sinks": "attn_sinks.weight",
         "self_attn.q_a_proj.weight": "attn_q_a.weight", "self_attn.q_a_norm.weight": "attn_q_a_norm.weight",
         "self_attn.q_b_proj.weight": "attn_q_b.weight", "self_attn.kv_proj.weight": "attn_kv.weight",
         "self_attn.kv_norm.weight": "attn_kv_a_norm.weight", "self_attn.o_a_proj.weight": "attn_output_a.weight",
         "self_attn.o_b_proj.weight": "attn_output_b.weight",
         "attn_hc.fn": "hc_attn_fn.weight", "attn_hc.base": "hc_attn_base.weight",
         "attn_hc.scale": "hc_attn_scale.weight",
         "ffn_hc.fn": "hc_ffn_fn.weight", "ffn_hc.base": "hc_ffn_base.weight", "ffn_hc.scale": "hc_ffn_scale.weight",
         _CP + "kv_proj.weight": "attn_compressor_kv.weight", _CP + "gate_proj.weight": "attn_compressor_gate.weight",
         _CP + "position_bias": "attn_compressor_ape.weight", _CP + "kv_norm.weight": "attn_compressor_norm.weight",
         _IX + "kv_proj.weight": "indexer_compressor_kv.weight",
         _IX + "gate_proj.weight": "indexer_compressor_gate.weight",
         _IX + "position_bias": "indexer_compressor_ape.weight",
         _IX + "kv_norm.weight": "indexer_compressor_norm.weight",
         _IX + "q_b_proj.weight": "indexer.attn_q_b.weight", _IX + "scorer.weights_proj.weight": "indexer.proj.weight",
         "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate.weight": "ffn_gate_inp.weight",
         "mlp.gate.e_score_correction_bias": "exp_probs_b.bias", "mlp.gate.tid2eid": "ffn_gate_tid2eid.weight",
         "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
         "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
         "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight"}
EXPS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
NEXTN = {"enorm.weight": "nextn.enorm.weight", "hnorm.weight": "nextn.hnorm.weight",
         "norm.weight": "nextn.shared_head_norm.weight"}
EH_PROJ = "nextn.eh_proj.weight"
MTP_HEAD = {"hc_head.hc_fn": "output_hc_fn.weight", "hc_head.hc_base": "output_hc_base.weight",
            "hc_head.hc_scale": "output_hc_scale.weight"}
MTP_KEEP = ("token_embd.weight", "output_norm.weight", "output.weight")   # the converter's --mtp keeps these


def mtp_name(main: Path) -> Path:
    """The converter's MTP file beside ``main``: ``mtp-<name>.gguf``."""
    return Path(main).with_name("mtp-" + Path(main).name)
