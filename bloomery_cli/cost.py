"""What a gate run cost: wall seconds per phase, the process's peak host RSS and peak device memory.

- ``peak_host_rss_bytes``: ``getrusage(RUSAGE_SELF).ru_maxrss`` (the high-water mark of the resident set,
  anonymous and file-backed pages both, since the process started), in bytes;
- ``peak_device_bytes``: ``torch.cuda.max_memory_allocated`` on a CUDA device (None elsewhere).
"""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass, field

import torch


def peak_host_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024      # Linux reports KiB


def peak_device_bytes(device: torch.device) -> int | None:
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None


@dataclass
class Phases:
    """Wall seconds per named phase, in order: ``lap(name)`` ends phase ``name`` (it began at the previous lap,
    or at construction); on a CUDA device the lap synchronises first, so queued work counts where it ran."""

    seconds: dict[str, float] = field(default_factory=dict)
    _last: float = field(default_factory=time.perf_counter)

    def lap(self, name: str, device: torch.device | None = None) -> None:
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._last
        self._last = now

    def facts(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in self.seconds.items()}
