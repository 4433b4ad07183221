"""Tier 3 (CONTRACT.md): outside implementations run on the same weights (transformers, speculators, llama.cpp)."""
