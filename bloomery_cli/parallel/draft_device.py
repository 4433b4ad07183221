"""The draft on a device of its own (``--draft-device DEV``): its weights, its KV / context store and its own copies
of what it shares with the target (embedding, head, final-norm gain) live on DEV; the target's taps cross once per
window, the proposals (host ids) come back.

    per window:  taps [L+1, R, H] on the target's device  ->  only the layers the draft reads, kept rows only,
                 copied into a buffer [L+1, R, H] on DEV (the layers it does not read stay NaN, so a wrong
                 declaration poisons the draft's (r) lines instead of passing silently)
                 bytes crossed = kept * |layers| * H * element size        (the ids back: k * 8 bytes)

The crossing is timed apart (synchronised wall clocks on both devices) and ``speculative.generate`` takes it out
of the commit phase: the draft share stays the draft's own work, the transfer share is reported beside it. With
DEV the target's own device the copy is a same-device copy and the path is the same (the CPU tests use that).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from bloomery_gates.errors import InputError
from bloomery_gates.registry import keys

FAMILIES = keys(draft_device=True)    # targets whose drafts read only the view below (the registry says)
KINDS = ("dflash", "dflash2", "dspark", "eagle3", "mtp")


def parse_device(flag: str, device: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:<i>`` (that card must exist) -> torch.device; else InputError (exit 2)."""
    if device == "cpu":
        return torch.device("cpu")
    if device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit()):
        if not torch.cuda.is_available():
            raise InputError(flag, f"{device} asked for, but CUDA is not available on this machine")
        dev = torch.device(device)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InputError(flag, f"{device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return dev
    raise InputError(flag, f"{device!r}: expected cpu, cuda or cuda:<i>")


def check_supported(gate_name: str, family: str, kind: str) -> None:
    """Refuse, before any model work, a pair whose draft reads more of the target than ``TargetView`` holds."""
    if family not in FAMILIES or kind not in KINDS:
        raise InputError("--draft-device", f"gate {gate_name} ({family} target, {kind} draft) does not support a "
                                           f"draft device of its own (supported: {', '.join(FAMILIES)} targets with "
                                           f"{', '.join(KINDS)} drafts)")


def tap_layers(kind: str, draft_spec: Any, n_taps: int) -> tuple[int, ...]:
    """The taps (indices into L+1, 0 = embeddings) a draft reads from a window's verify."""
    if kind in ("dflash", "dflash2", "dspark"):
        return tuple(sorted({l + 1 for l in draft_spec.target_layer_ids}))   # context_features: taps[l + 1]
    if kind == "eagle3":
        return tuple(sorted({0, *draft_spec.aux_layer_ids}))                  # token rows + aux_features: taps[l]
    if kind == "mtp":
        return (0, n_taps - 1)                                                # token rows + the last hidden
    raise ValueError(f"no tap declaration for draft kind {kind}")


class TargetView:
    """What a draft reads from its target engine, with the tensors on the draft's device (the draft's own copies:
    counted as draft bytes). ``copied_bytes`` is 0 when DEV is the target's device (``.to`` then shares)."""

    def __init__(self, engine: Any, device: torch.device):
        self.device, self.dtype, self.spec, self.shape = device, engine.dtype, engine.spec, engine.shape
        self.embed, self.head = engine.embed.to(device), engine.head.to(device)
        final = getattr(engine, "final_norm", None)          # None: a target without one (qwen4exp: HC mixer)
        self.final_norm = None if final is None else final.to(device)
        own = [t for t, src in ((self.embed, engine.embed), (self.head, engine.head), (self.final_norm, final))
               if t is not None and t.data_ptr() != src.data_ptr()]
        seen = {t.data_ptr(): t for t in own}                                   # a tied head is one copy
        self.copied_bytes = sum(t.numel() * t.element_size() for t in seen.values())


@dataclass
class Crossing:
    """What crossed, summed since the last ``take``."""

    windows: int = 0
    bytes: int = 0
    seconds: float = 0.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class CrossDraft:
    """A draft bound to a ``TargetView`` on its own device, behind the loop's Draft interface: ``prompt`` and
    ``accept`` move the declared taps (``tap_layers``) across once, ``propose`` runs on DEV and returns host ids.
    Every other attribute (stores, specs, state reads) is the inner draft's."""

    def __init__(self, inner: Any, layers: tuple[int, ...], source: torch.device):
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "layers", layers)
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "buf", None)
        object.__setattr__(self, "crossed", Crossing())
        object.__setattr__(self, "prompt_crossed", Crossing())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.inner, name, value)

    def _cross(self, taps: torch.Tensor, rows: int, fresh: bool, into: Crossing) -> torch.Tensor:
        """taps [L+1, >= rows, ...] -> [L+1, rows, ...] on DEV with the declared layers' first ``rows`` rows (a row
        is [H], or [S, H] for a target whose taps are its residual streams)."""
        dev = self.inner.device
        n, tail = taps.shape[0], taps.shape[2:]
        buf = self.buf
        if fresh or buf is None or buf.shape[1] < rows or buf.shape[2:] != tail:
            buf = torch.full((n, rows, *tail), float("nan"), device=dev, dtype=taps.dtype)
            if not fresh:
                object.__setattr__(self, "buf", buf)
        _sync(self.source)
        t0 = time.perf_counter()
        for j in self.layers:
            buf[j, :rows].copy_(taps[j, :rows])
        _sync(dev)
        into.seconds += time.perf_counter() - t0
        into.bytes += rows * len(self.layers) * tail.numel() * taps.element_size()
        into.windows += 1
        return buf[:, :rows]

    def prompt(self, taps: torch.Tensor) -> None:
        # a fresh buffer: a chained draft keeps views of its prompt rows until its first propose
        self.inner.prompt(self._cross(taps, taps.shape[1], True, self.prompt_crossed))

    def accept(self, kept: int, taps: torch.Tensor) -> None:
        self.inner.accept(kept, self._cross(taps, kept, False, self.crossed))

    def propose(self, anchor: int, *args: Any, **kwargs: Any) -> Any:
        return self.inner.propose(anchor, *args, **kwargs)

    def take_crossing(self) -> Crossing:
        """The windows' crossing since the last call (the loop takes it once per run)."""
        got = self.crossed
        object.__setattr__(self, "crossed", Crossing())
        return got


def bind(make_draft, kind: str, draft_spec: Any, engine: Any, max_len: int, device: torch.device,
         **options: Any) -> tuple[CrossDraft, dict[str, Any]]:
    """Build the draft on ``device`` against a view of ``engine`` -> (the crossing draft, load-line facts)."""
    view = TargetView(engine, device)
    inner = make_draft(draft_spec, view, max_len, **options)
    n_taps = engine.spec.num_layers + 1
    layers = tap_layers(kind, getattr(inner, "run_spec", draft_spec), n_taps)
    width = getattr(engine, "tap_width", engine.shape.hidden_size)      # S * H where the taps are S streams
    row = len(layers) * width * torch.empty((), dtype=engine.dtype).element_size()
    facts = {"draft_device": str(device), "draft_shared_copy_bytes": view.copied_bytes,
             "cross_layers": list(layers), "cross_bytes_per_kept_row": row}
    return CrossDraft(inner, layers, engine.device), facts
