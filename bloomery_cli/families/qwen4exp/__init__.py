"""qwen4exp (Qwen3.8-Flash-Next): its HF, GGUF and separate-MTP-GGUF readers and its plan terms."""
