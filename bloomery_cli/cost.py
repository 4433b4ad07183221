"""What a gate run cost: wall seconds per phase, the process's peak host RSS and peak device memory.

- ``peak_host_rss_bytes``: ``getrusage(RUSAGE_SELF).ru_maxrss`` (the high-water mark of the resident set,
  anonymous and file-backed pages both, since the process started), in bytes;
- ``peak_device_bytes``: ``torch.cuda.max_memory_allocated`` on a CUDA device (None elsewhere).
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


def peak_host_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024      # Linux reports KiB


def peak_device_bytes(device: torch.device) -> int | None:
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None


@dataclass
class Phases:
    """Wall seconds per named phase, in the order first entered (a phase entered twice adds up)."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str, device: torch.device | None = None) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if device is not None and device.type == "cuda":
                torch.cuda.synchronize(device)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def facts(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in self.seconds.items()}
