"""``bloomery engine build``: llama.cpp's tools for the engine gate, from the tree vendored in the PyPI sdist of
llama-cpp-python 0.3.36 (commit 0c1e57098), built with cmake into a folder the user names.

    DIR/src/llama_cpp_python-0.3.36/vendor/llama.cpp     the tree (pip download of the sdist; PyPI is the only
                                                         network use, and only here)
    DIR/build/bloomery-llama-spec                        our driver (bloomery_cli/engines/native), linked statically:
                                                         that tree's libllama, ggml and llama-common
    DIR/build/tools/llama-bench/llama-bench              with ``--bench``: the bench's peer (``bench_binary``)
CPU: 206 s with 2 jobs in a clean CI run (longer on busy cores); CUDA (``--cuda``, sm_90): 311 s, 15 jobs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from bloomery_gates.errors import InputError

VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}"
DRIVER = "bloomery-llama-spec"
SOURCE = Path(__file__).resolve().parent / "native"      # CMakeLists.txt + spec_driver.cpp (package data)


def tree(out: Path) -> Path:
    return out / "src" / SDIST / "vendor" / "llama.cpp"


def driver(out: Path) -> Path:
    return out / "build" / DRIVER


BENCH = "build/tools/llama-bench/llama-bench"      # where the CMake project (native/CMakeLists.txt) puts it


def bench_binary(out: Path) -> Path:
    return out / BENCH


def tree_of(drv: Path) -> Path:
    """The llama.cpp tree a driver was built from (LLAMA_CPP_DIR in its CMakeCache.txt): its converter lives there."""
    cache = drv.parent / "CMakeCache.txt"
    if cache.is_file():
        for line in cache.read_text(errors="replace").splitlines():
            if line.startswith("LLAMA_CPP_DIR:"):
                return Path(line.split("=", 1)[1])
    return tree(drv.parent.parent)


def _run(cmd: list[str], log, what: str) -> None:
    t0 = time.perf_counter()
    print(f"engine build: {what} ...", flush=True)
    r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise InputError(cmd[0], f"{what} failed (exit {r.returncode}); its output is in {log.name}")
    print(f"engine build: {what} took {time.perf_counter() - t0:.0f} s", flush=True)


def fetch(out: Path, log) -> Path:
    """The sdist's llama.cpp tree under out/src (downloaded once)."""
    if (tree(out) / "CMakeLists.txt").is_file():
        return tree(out)
    src = out / "src"
    src.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(src),
          f"llama-cpp-python=={VERSION}"], log, f"pip download llama-cpp-python=={VERSION} (sdist)")
    with tarfile.open(src / f"{SDIST}.tar.gz") as tar:
        tar.extractall(src, filter="data")
    return tree(out)


def local_tree(source: Path, out: Path, log) -> Path:
    """``--source``: a llama.cpp tree (a folder with CMakeLists.txt) used in place, or a .tar.gz of one (the sdist,
    or a trimmed copy of its vendor/llama.cpp) extracted under out/src: for a machine without PyPI."""
    if (source / "CMakeLists.txt").is_file():
        return source
    if not source.is_file():
        raise InputError(source, "no llama.cpp tree or .tar.gz there")
    dst = out / "src" / source.name.removesuffix(".tar.gz")

    def found() -> Path | None:
        for cand in (dst, *dst.glob("*"), *dst.glob("*/vendor/llama.cpp")):
            if (cand / "CMakeLists.txt").is_file() and (cand / "ggml").is_dir():
                print(f"engine build: llama.cpp tree {cand}", file=log, flush=True)
                return cand
        return None

    tree_dir = found() if dst.is_dir() else None
    if tree_dir is None:                 # absent, or a partial extraction left behind: extract it (again)
        shutil.rmtree(dst, ignore_errors=True)
        dst.mkdir(parents=True)
        with tarfile.open(source) as tar:
            tar.extractall(dst, filter="data")
        tree_dir = found()
    if tree_dir is None:
        raise InputError(source, "holds no llama.cpp tree (CMakeLists.txt beside ggml/)")
    return tree_dir


def stale(build_dir: Path, llama: Path, log) -> None:
    """A build folder configured from another checkout's driver source or another llama.cpp tree is removed
    (cmake refuses a second source folder for one build folder); an up-to-date one is reused incrementally."""
    cache = build_dir / "CMakeCache.txt"
    if not cache.is_file():
        return
    text = cache.read_text(errors="replace")
    if f"CMAKE_HOME_DIRECTORY:INTERNAL={SOURCE}\n" not in text or f"LLAMA_CPP_DIR:PATH={llama}\n" not in text:
        print(f"engine build: {build_dir} was configured from other sources: rebuilt", file=log, flush=True)
        shutil.rmtree(build_dir)


def build(out: Path, cuda: bool = False, arch: str = "90", jobs: int = 2, bench: bool = False,
          source: Path | None = None) -> Path:
    """Configure and build the driver (and llama-bench with ``bench``); returns the driver's path. Output of pip /
    cmake goes to out/build.log."""
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise InputError(tool, "not found on PATH; the llama.cpp build needs cmake and a C++17 compiler")
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "build.log", "a") as log:
        llama = local_tree(source, out, log) if source is not None else fetch(out, log)
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        flags = [f"-DLLAMA_CPP_DIR={llama}", "-DCMAKE_BUILD_TYPE=Release"]
        if cuda:
            flags += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={arch}"]
        stale(out / "build", llama, log)
        _run(["cmake", "-S", str(SOURCE), "-B", str(out / "build"), *gen, *flags], log, "cmake configure")
        targets = [DRIVER] + (["llama-bench"] if bench else [])
        _run(["cmake", "--build", str(out / "build"), "--target", *targets, "-j", str(jobs)], log,
             f"cmake build {' '.join(targets)} ({'CUDA sm_' + arch if cuda else 'CPU'}, {jobs} jobs)")
    return driver(out)
