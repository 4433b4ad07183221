"""``--tp N``: the target split over N processes, behind the engine interface the gate already drives.

    rank 0  this process: runs the gate, the loop, the reference; holds ``TPQwen3Target`` (prefill / verify /
            commit / reset / kv_rows, ``Pass`` out) and its own shard
    rank r  a worker (``python -m bloomery_cli.parallel.tp_worker``) on device r (cuda:<base + r>, or the CPU),
            its shard

Every engine call is sent to the workers as a small command (op, start position, ids: int64 words on the
worker's stdin pipe), then every rank runs the same pass on its shard; the data (the two all-reduces per layer,
the kv gather) goes through torch.distributed: gloo on the CPU, NCCL on CUDA, rendezvous at 127.0.0.1 on a free
port. The command channel is a pipe on purpose: between two calls rank 0 may spend minutes in the host
reference, which no collective timeout should bound, and a pipe's end-of-file ends a worker at once when rank 0
exits or dies. The collectives themselves run under the process group's timeout (``BLOOMERY_TP_TIMEOUT`` seconds,
default 120): a dead worker makes rank 0's next call raise, never hang. NVLink multicast stays off in every
process (``NO_MULTICAST``).
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from bloomery_gates.errors import InputError
from bloomery_gates.kernels.families.rows import RowPasses
from bloomery_gates.registry import keys

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
FAMILIES = keys(tp=True)          # the registry says which families split
OP_EXIT, OP_RUN, OP_KV = 0, 1, 2
READY = b"READY"
_OPEN: list[TPQwen3Target] = []


def timeout_s() -> float:
    return float(os.environ.get("BLOOMERY_TP_TIMEOUT", "120"))


def check_tp(tp: int, spec: Any, device: torch.device, target: Path) -> None:
    """Refuse a split that cannot run, before any model work (InputError, exit 2)."""
    if tp == 1:
        return
    if tp < 1:
        raise InputError("--tp", f"{tp}: expected a process count >= 1")
    if spec.family not in FAMILIES:
        raise InputError("--tp", f"{target} is a {spec.family} target; tensor parallel runs the "
                                 f"{', '.join(FAMILIES)} family only")
    from bloomery_gates.kernels.families.qwen3.tp import split_sizes

    why = split_sizes(spec, tp)
    if why:
        raise InputError("--tp", f"{target}: {why}")
    import torch.distributed as dist

    if device.type == "cuda":
        base = device.index or 0
        if base + tp > torch.cuda.device_count():
            raise InputError("--tp", f"{tp} ranks from {device} need cuda:{base}..cuda:{base + tp - 1}; this machine "
                                     f"has {torch.cuda.device_count()} CUDA device(s)")
        if not dist.is_nccl_available():
            raise InputError("--tp", "this torch build has no NCCL backend")
    elif not dist.is_gloo_available():
        raise InputError("--tp", "this torch build has no gloo backend")


def make_engine(family: Any, spec: Any, device: torch.device, dtype: torch.dtype, max_len: int, rows: int | None,
                tp: int, target: Path) -> tuple[Any, dict[str, Any]]:
    """The family's engine, or with tp > 1 the split one -> (engine, load-line facts)."""
    if tp == 1:
        return family.engine(spec, device, dtype, max_len, rows=rows), {}
    engine = TPQwen3Target(spec, device, dtype, max_len, rows, tp, target)
    return engine, {"tp": tp, "backend": engine.backend}


@contextmanager
def closing() -> Iterator[None]:
    """End every TP engine started inside (its workers exit, the process group is destroyed), however it ends:
    politely after a normal end, at once (``abort``) after an exception or Ctrl-C."""
    start, ok = len(_OPEN), False
    try:
        yield
        ok = True
    finally:
        while len(_OPEN) > start:
            engine = _OPEN.pop()
            engine.close() if ok else engine.abort()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def encode(words: list[int]) -> bytes:
    """One command: its word count, then the int64 words."""
    return struct.pack(f"<q{len(words)}q", len(words), *words)


class TPQwen3Target(RowPasses):
    """Qwen3Target's interface over N ranks; rank 0's tensors (embedding, head, final norm) are the draft's view."""

    def __init__(self, spec: Any, device: torch.device, dtype: torch.dtype, max_len: int, rows: int | None,
                 world: int, target: Path):
        import torch.distributed as dist

        from bloomery_gates.kernels.families.qwen3.tp import ShardEngine

        if dist.is_initialized():
            raise RuntimeError("--tp: a torch.distributed process group is already running in this process")
        os.environ.update(NO_MULTICAST)
        self.spec, self.shape, self.rows, self.world = spec, spec.layer, rows, world
        self.device, self.dtype = torch.device(device), dtype
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        base = self.device.index or 0
        port = free_port()
        env = {**os.environ, **NO_MULTICAST, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "WORLD_SIZE": str(world), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        dname = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}[dtype]
        self.workers: list[subprocess.Popen] = []
        self.closed = False
        _OPEN.append(self)                       # before the first worker starts: an interrupt here still ends it
        for r in range(1, world):
            dev = f"cuda:{base + r}" if self.backend == "nccl" else "cpu"
            cmd = [sys.executable, "-m", "bloomery_cli.parallel.tp_worker", str(Path(target).resolve()), dev, dname,
                   str(max_len), str(rows or 0), str(r), str(world), self.backend, str(port), str(timeout_s())]
            # cwd: where this process's bloomery_cli was imported from (``-m`` puts the cwd first on sys.path);
            # a session of its own: a terminal's Ctrl-C reaches rank 0 only, which ends the workers (``abort``)
            self.workers.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                 env={**env, "RANK": str(r)}, cwd=Path(__file__).parent.parent,
                                                 start_new_session=True))
        self.shard = ShardEngine(spec, self.device, dtype, max_len, rows, 0, world)    # while the workers load
        self._wait_ready()
        dist.init_process_group(self.backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=world,
                                timeout=timedelta(seconds=timeout_s()),
                                **({"device_id": self.device} if self.backend == "nccl" else {}))
        self.embed, self.head, self.final_norm = self.shard.embed, self.shard.head, self.shard.final_norm
        self.cap = self.shard.cap
        self.length = 0

    def _wait_ready(self) -> None:
        """Each worker says READY on its stdout once its shard is built (before the rendezvous): a worker that
        cannot start ends its stdout and the run cannot start (exit 2), at once rather than at the timeout."""
        for r, w in enumerate(self.workers, start=1):
            line = w.stdout.readline()
            if line.strip() != READY:
                code = w.wait()
                raise InputError("--tp", f"worker rank {r} did not start (exit code {code}; its error is above)")

    # --- the command channel
    def _send(self, words: list[int]) -> None:
        msg = encode(words)
        for r, w in enumerate(self.workers, start=1):
            try:
                w.stdin.write(msg)
                w.stdin.flush()
            except (BrokenPipeError, OSError) as e:
                raise RuntimeError(f"--tp: worker rank {r} has exited (code {w.poll()})") from e

    # --- Qwen3Target's interface (prefill / verify / commit / reset: RowPasses, over _run)
    def kv_rows(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Every rank's kv heads of the committed rows, gathered: (k, v) [nkv, length, d] each."""
        self._send([OP_KV, layer, self.length])
        return self.shard.gather_kv(layer, self.length)

    def _run(self, ids: list[int], want_logits: bool):
        from bloomery_gates.kernels.families.qwen3.model import Pass

        if self.length + len(ids) > self.cap:
            raise ValueError(f"KV cache of {self.cap} positions is full (pass ends at {self.length + len(ids)})")
        self._send([OP_RUN, self.length, *ids])
        out = self.shard.run(ids, self.length, True)
        return Pass(out.logits.argmax(-1).tolist(), out.taps, out.logits if want_logits else None)

    def abort(self) -> None:
        """End the workers now (SIGKILL), then close: after Ctrl-C or an error a worker may sit in a collective
        waiting for rank 0, which the polite exit would wait out (the process group's timeout, 120 s)."""
        for w in self.workers:
            if w.poll() is None:
                w.kill()
        self.close()

    def close(self) -> None:
        """Tell the workers to exit, wait for them (killed past the timeout), destroy the process group."""
        if self.closed:
            return
        self.closed = True
        import torch.distributed as dist

        for w in self.workers:
            try:
                w.stdin.write(encode([OP_EXIT]))
                w.stdin.close()
            except (BrokenPipeError, OSError):
                pass
        for w in self.workers:
            try:
                w.wait(timeout=timeout_s())
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
            w.stdout.close()
        if dist.is_initialized():
            dist.destroy_process_group()
