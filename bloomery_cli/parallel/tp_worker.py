"""A ``--tp`` worker (rank r >= 1, started by ``bloomery_cli.parallel.tp``): load the target, hold shard r, run every
command rank 0 sends on stdin until OP_EXIT or end-of-file (rank 0 gone), then leave the process group.

    python -m bloomery_cli.parallel.tp_worker TARGET DEVICE DTYPE MAX_LEN ROWS RANK WORLD BACKEND PORT TIMEOUT_S
"""

from __future__ import annotations

import os
import signal
import struct
import sys
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO

import torch


def read_command(stream: BinaryIO) -> list[int] | None:
    """The next command's int64 words, or None at end-of-file."""
    head = stream.read(8)
    if len(head) < 8:
        return None
    (n,) = struct.unpack("<q", head)
    body = stream.read(8 * n)
    if len(body) < 8 * n:
        return None
    return list(struct.unpack(f"<{n}q", body))


def main(argv: list[str]) -> int:
    import torch.distributed as dist

    from bloomery_gates.kernels.families.qwen3.tp import ShardEngine

    from ..gatekit import DTYPES
    from ..loading import load_target
    from .tp import NO_MULTICAST, OP_EXIT, OP_KV, OP_RUN, READY

    os.environ.update(NO_MULTICAST)
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # Ctrl-C to the process group: rank 0 ends the workers
    target, device, dtype, max_len, rows, rank, world, backend, port, timeout = argv
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    spec = load_target(Path(target))
    shard = ShardEngine(spec, dev, DTYPES[dtype], int(max_len), int(rows) or None, int(rank), int(world), head=False)
    sys.stdout.buffer.write(READY + b"\n")                   # rank 0 waits for this before the rendezvous
    sys.stdout.buffer.flush()
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=int(rank), world_size=int(world),
                            timeout=timedelta(seconds=float(timeout)),
                            **({"device_id": dev} if backend == "nccl" else {}))
    try:
        stdin = sys.stdin.buffer
        while True:
            cmd = read_command(stdin)
            if cmd is None or cmd[0] == OP_EXIT:
                return 0
            if cmd[0] == OP_RUN:
                shard.run(cmd[2:], cmd[1], False)
            elif cmd[0] == OP_KV:
                shard.gather_kv(cmd[1], cmd[2])
            else:
                raise ValueError(f"unknown command {cmd[0]}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
