"""The qwen35moe family's readers, plan terms, oracles and fixture builders (its registry entry:
bloomery_gates/registry.py)."""
