"""Speculative sampling at T > 0: the verify rule, its exact proof, the gate's (s) check."""
