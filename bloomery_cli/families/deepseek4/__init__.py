"""deepseek4 (DeepSeek V4): its HF reader and its transformers oracle."""
