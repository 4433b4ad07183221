"""llama.cpp as ``bloomery bench``'s peer: its plain decode on the bench's own weights, measured in the same run.

    bloomery engine build --out DIR --bench [--cuda]                     (llama.cpp's llama-bench, same tree)
    bloomery bench qwen3-dflash --shape qwen3-8b --device cuda --llama-cpp DIR

What it measures: llama.cpp's ``llama-bench`` tg test, batch 1, one token a pass, at depth D = the bench's prompt
length (D tokens already in the KV cache, prefilled before the timing) over N = the bench's ``-n`` generated
tokens, 3 repetitions; its tok/s is their mean (stddev beside it). CUDA: every layer on the card (``-ngl 99``)
and flash attention on (``-fa 1``); CPU: ``-ngl 0 -fa 0`` and as many threads as torch uses. llama.cpp keeps
its default f16 KV cache and its own choice of kernels; weights are the bench's tensors bit for bit in the run
dtype (bf16, f16 or f32; norms F32), written as a GGUF with no vocabulary (``tokenizer.ggml.model =
"no_vocab"``; llama-bench feeds random ids) into a temporary folder that is removed afterwards. Our figure
beside it is the bench's plain decode (timed from the end of the prefill over the n-1 ids after the first).

The GGUF goes through the fixtures' writers (``fixturegen.export_gguf.write_target_gguf`` for qwen3, arch
``qwen3``; ``fixturegen.qwen38_target.write_qwen38_gguf`` for qwen38, arch ``qwen35``), streamed: one tensor on
the host at a time, so an 8B bf16 model (16 GB) costs one tensor of host memory and 16 GB of disk.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from bloomery_gates.errors import InputError
from bloomery_gates.registry import FAMILIES, keys

if TYPE_CHECKING:
    from bloomery_gates.spec import ModelSpec

LLAMA_CPP_HELP = ("A `bloomery engine build --out DIR --bench` folder: also llama.cpp's llama-bench, plain decode on "
                  "the same weights (a GGUF in a temporary folder) at depth --prompt-len over -n tokens.")
KEEP = ("build_commit", "backends", "gpu_info", "cpu_info", "model_type", "model_size", "n_threads",
        "n_gpu_layers", "flash_attn", "type_k", "type_v", "samples_ts")


def find_llama_bench(folder: Path) -> Path:
    """llama-bench inside a ``bloomery engine build --out DIR --bench`` folder (``engines.build.bench_binary``);
    an InputError naming the folder and where it looked when there is none."""
    from ..engines.build import BENCH, bench_binary

    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(folder, "not a folder; expected a `bloomery engine build --out DIR --bench` folder")
    path = bench_binary(folder)
    if path.is_file() and os.access(path, os.X_OK):
        return path
    raise InputError(folder, f"no llama-bench at {BENCH}; build it with "
                             f"`bloomery engine build --out {folder} --bench` (add --cuda for the GPU)")


def gguf_arch(tspec: ModelSpec) -> str:
    """The llama.cpp arch the bench's target is written as (the registry's GGUF arch: qwen3 -> ``qwen3``, qwen38 ->
    ``qwen35``), for the families whose GGUF this writer knows (``llama_bench`` in the registry)."""
    fam = FAMILIES.get(tspec.family)
    if fam is None or not fam.llama_bench:
        raise InputError(f"--llama-cpp ({tspec.source})", f"family {tspec.family!r}: the llama.cpp peer writes "
                                                          f"{' or '.join(keys(llama_bench=True))} targets only")
    return fam.gguf_archs[0]


def write_gguf(tspec: ModelSpec, tensors: Mapping[str, torch.Tensor], path: Path, dtype: str) -> Path:
    """``tensors`` (HF names, ``tspec``'s layout; ``mtp.*`` left out) as a GGUF llama.cpp loads without a
    vocabulary, matrices in ``dtype`` (bf16, f16, f32), streamed to ``path``."""
    name = f"bloomery-bench-{Path(str(tspec.source)).name}"
    ls = tspec.layer
    if gguf_arch(tspec) == "qwen3":
        from ..fixturegen.export_gguf import write_target_gguf
        from ..fixturegen.train import TargetShape

        shape = TargetShape(ls.hidden_size, tspec.num_layers, ls.num_heads, ls.num_kv_heads, ls.head_dim,
                            ls.intermediate_size, tspec.vocab_size, ls.rms_eps, ls.rope_theta, tspec.max_position)
        return write_target_gguf(path, shape, tensors, None, name, dtype)
    from ..families.qwen38.fixture import Qwen38Shape, write_qwen38_gguf

    hy = tspec.hybrid
    shape38 = Qwen38Shape(ls.hidden_size, tuple(hy.layer_types), ls.num_heads, ls.num_kv_heads, ls.head_dim,
                          ls.intermediate_size, tspec.vocab_size, hy.linear_num_key_heads, hy.linear_num_value_heads,
                          hy.linear_key_head_dim, hy.linear_value_head_dim, hy.linear_conv_kernel_dim,
                          hy.partial_rotary_factor, ls.rms_eps, ls.rope_theta, tspec.max_position)
    trunk = {k: v for k, v in tensors.items() if not k.startswith("mtp.")}
    return write_qwen38_gguf(path, shape38, trunk, None, 0, name, dtype=dtype)


def bench_command_line(llama_bench: Path, gguf: Path, depth: int, n: int, device: str,
                       threads: int | None = None) -> list[str]:
    """llama-bench's arguments: tg N at depth D, 3 repetitions, JSON; all layers on the card with flash attention
    (``cuda`` / ``cuda:i``, the i-th CUDA device) or none (``cpu``, ``threads`` threads)."""
    cmd = [str(llama_bench), "-m", str(gguf), "-p", "0", "-n", str(n), "-d", str(depth)]
    if str(device).startswith("cuda"):
        cmd += ["-fa", "1", "-ngl", "99"]
        if ":" in str(device):
            cmd += ["-dev", f"CUDA{str(device).split(':', 1)[1]}"]
    else:
        cmd += ["-fa", "0", "-ngl", "0"] + (["-t", str(threads)] if threads else [])
    return cmd + ["-o", "json", "-r", "3"]


def run_llama_bench(llama_bench: Path, gguf: Path, depth: int, n: int, device: str, threads: int | None = None,
                    timeout: float = 3600.0) -> dict[str, Any]:
    """Run llama-bench (``bench_command_line``) and read its JSON: tok/s mean and stddev, depth, n, the command
    line and the test's conditions (``KEEP``). A missing binary, a failed run or output without the test is an
    InputError naming llama-bench and what went wrong (the tail of its stderr)."""
    llama_bench = Path(llama_bench)
    if not (llama_bench.is_file() and os.access(llama_bench, os.X_OK)):
        raise InputError(llama_bench, "no llama-bench executable here (bloomery engine build --bench)")
    cmd = bench_command_line(llama_bench, gguf, depth, n, device, threads)
    line = shlex.join(cmd)
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise InputError(llama_bench, f"still running after {timeout:.0f} s: {line}") from None
    except OSError as e:
        raise InputError(llama_bench, f"could not run ({e.strerror}): {line}") from None
    if res.returncode != 0:
        tail = " | ".join(res.stderr.strip().splitlines()[-3:])
        raise InputError(llama_bench, f"exit {res.returncode}: {line}: {tail}")
    try:
        tests = json.loads(res.stdout)
    except json.JSONDecodeError as e:
        raise InputError(llama_bench, f"output is not JSON ({e.msg}): {res.stdout[:200]!r}") from None
    tg = [t for t in tests if isinstance(t, dict) and t.get("n_prompt") == 0 and t.get("n_gen") == n]
    if not tg:
        raise InputError(llama_bench, f"no tg{n} test in its JSON output: {line}")
    t = tg[0]
    return {"tok_s": float(t["avg_ts"]), "tok_s_std": float(t["stddev_ts"]), "depth": int(t["n_depth"]),
            "n": int(t["n_gen"]), "command": line} | {k: t[k] for k in KEEP if k in t}


def llama_peer(llama_bench: Path, tspec: ModelSpec, dtype: str, depth: int, n: int, device: str,
               threads: int | None = None) -> dict[str, Any]:
    """Write ``tspec``'s tensors as a GGUF into a temporary folder (removed afterwards, also on an error), run
    llama-bench on it at ``depth`` over ``n`` tokens; its record with the write's seconds and bytes."""
    with tempfile.TemporaryDirectory(prefix="bloomery-bench-llamacpp-") as tmp:
        path = Path(tmp) / "target.gguf"
        t0 = time.perf_counter()
        write_gguf(tspec, tspec.tensors, path, dtype)
        write_s, size = time.perf_counter() - t0, path.stat().st_size
        out = run_llama_bench(llama_bench, path, depth, n, device, threads)
    return out | {"gguf_write_s": write_s, "gguf_bytes": size, "gguf_arch": gguf_arch(tspec)}


def compare(rec: dict[str, Any], llama_bench: Path, tspec: ModelSpec, dtype: str, depth: int, n: int,
            device: torch.device | str, log: Callable[[str], None]) -> None:
    """The bench's peer step: ``rec["llamacpp"]`` (``llama_peer``) and ``rec["ours_vs_llamacpp"]`` = our plain
    tok/s over llama.cpp's, and its line; with the host step's chains (ids identical) run before it, also
    ``rec["ours_chain_vs_llamacpp"]``, the fastest chain's tok/s over llama.cpp's. A failure is logged and
    recorded (``llamacpp_error``), not fatal: the rest of the bench still counts."""
    dev = torch.device(device)
    threads = torch.get_num_threads() if dev.type == "cpu" else None
    try:
        peer = llama_peer(llama_bench, tspec, dtype, depth, n, str(dev), threads)
    except (InputError, OSError, ValueError, KeyError) as e:
        log(f"llama.cpp failed: {str(e)[:400]}")
        rec["llamacpp_error"] = str(e)
        return
    rec["llamacpp"] = peer
    rec["ours_vs_llamacpp"] = ratio = rec["plain"]["tok_s"] / peer["tok_s"]
    log(f"llama.cpp plain: {peer['tok_s']:.1f} tok/s at depth {peer['depth']} (ours / llama.cpp = {ratio:.2f})")
    chains = [c for c in rec.get("host", {}).get("chains", []) if c.get("ids_identical")]
    if chains:                                  # our chained plain decode (same ids), measured earlier in this run
        best = max(chains, key=lambda c: c["tok_s"])
        rec["ours_chain_vs_llamacpp"] = best["tok_s"] / peer["tok_s"]
        log(f"llama.cpp vs our chained plain decode k={best['k']}: {best['tok_s']:.1f} tok/s "
            f"(ours / llama.cpp = {rec['ours_chain_vs_llamacpp']:.2f})")
    log(f"llama.cpp tok_s_std={peer['tok_s_std']:.1f} n={peer['n']} gguf_write_s={peer['gguf_write_s']:.1f} "
        f"gguf_bytes={peer['gguf_bytes']} command: {peer['command']}")
