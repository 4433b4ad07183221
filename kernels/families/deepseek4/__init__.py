"""The deepseek4 family's torch engine (kernels/ops wired) (its registry entry: bloomery_gates/registry.py)."""
