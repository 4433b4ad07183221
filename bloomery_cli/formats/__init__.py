"""Checkpoint readers: HF directories (safetensors), GGUF files, tokenizers, and the spec builders.

Modules: ``hf_dir`` (config.json + safetensors shards, lazy), ``gguf_file`` (GGUF metadata + on-demand
dequantization), ``tokenizer``, ``config`` (typed config access), ``lazy`` (the lazy tensor mapping and
shape checks), ``qwen3`` (target specs), ``dflash`` (DFlash draft specs). Use ``bloomery_cli.loading``.
"""
