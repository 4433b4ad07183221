"""The deepseek4 family's float64 reference (reference/ops wired) (its registry entry: bloomery_gates/registry.py)."""
