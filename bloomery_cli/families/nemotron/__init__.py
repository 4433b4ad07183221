"""The nemotron family's readers, plan terms, oracles and fixture builders (its registry entry:
bloomery_gates/registry.py)."""
