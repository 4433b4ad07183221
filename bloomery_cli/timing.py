"""Phase timers: CUDA events on a CUDA device (no host sync inside a pass), synchronised wall
clocks elsewhere, and when the draft runs on a device of its own (``--draft-device``): CUDA events on one card
do not see the other's work, so every phase is a wall clock with both devices synchronised at its ends.
Totals are read once, at the end."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch


class PhaseTimer:
    def __init__(self, device: torch.device, other: torch.device | None = None):
        self.devices = [d for d in (device, other) if d is not None and d.type == "cuda"]
        self.split = other is not None and torch.device(other) != torch.device(device)
        self.cuda = device.type == "cuda" and not self.split
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
            self._sync()
            t0 = time.perf_counter()
            yield
            self._sync()
            self.walls[name] += time.perf_counter() - t0

    def _sync(self) -> None:
        if self.split:
            for d in self.devices:
                torch.cuda.synchronize(d)

    def seconds(self, name: str) -> float:
        if not self.cuda:
            return self.walls[name]
        torch.cuda.synchronize()
        return sum(s.elapsed_time(e) for s, e in self.events[name]) / 1000.0
