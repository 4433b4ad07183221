"""Names of the qwen3 fixture entries (files and folders under fixtures/)."""

TARGET_DIR = "qwen3-tiny"
TARGET_GGUF = "qwen3-tiny.gguf"
DRAFT_DIR = "qwen3-tiny-dflash-b8"
TOKENIZER = "tokenizer.json"
PROMPTS = "prompts.jsonl"
