"""The qwen4exp family's device engine (kernels/ops wired) (its registry entry: bloomery_gates/registry.py)."""
