"""Phase timers: CUDA events on a CUDA device (no host sync inside a pass), synchronised wall
clocks elsewhere. Totals are read once, at the end."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch


class PhaseTimer:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.events: dict[str, list] = defaultdict(list)
        self.walls: dict[str, float] = defaultdict(float)

    @contextmanager
    def phase(self, name: str):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self.events[name].append((start, end))
        else:
            t0 = time.perf_counter()
            yield
            self.walls[name] += time.perf_counter() - t0

    def seconds(self, name: str) -> float:
        if not self.cuda:
            return self.walls[name]
        torch.cuda.synchronize()
        return sum(s.elapsed_time(e) for s, e in self.events[name]) / 1000.0
