"""``bloomery plan``: context and memory of a target with its draft as one term, and the ctx-first rule."""
