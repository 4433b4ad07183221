"""llama.cpp as an engine under the gate: the gate's target and draft as GGUF, llama.cpp's plain and speculative
greedy runs over the gate's prompt ids (our driver, bloomery_cli/engines/native/spec_driver.cpp), written as a record.

GGUF: the target is the fixture's own GGUF (written by our writers from the same weights; tier 3 checks them
against transformers), as an F32 copy for an f32 gate (ggml's CPU matmul on BF16 weights would round the
activations to bf16) and as stored (BF16) for a bf16 gate; the KV cache in the gate's dtype. An in-file MTP head
is its own draft (``--spec-type draft-mtp``). Block drafts go through llama.cpp's own converter from the same
tree (``convert_hf_to_gguf.py DRAFT --target-model-dir TARGET``), run in a child process with one setting of
ours: our fixtures' trained tokenizer has no registered pre-tokenizer hash, so the converter's
``get_vocab_base_pre`` falls back to "qwen2" (the fixture tokenizer's pre-tokenizer) instead of raising. Token
ids cross as ids; the tokenizer's text side is never used.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bloomery_gates.errors import InputError

from . import build
from .record import Header, PromptRun, Record, Window

ENGINE = f"llama.cpp 0c1e57098 (llama-cpp-python {build.VERSION} sdist)"
ACCEPTANCE = ("llama.cpp's own: n_accept / n_drafted over the drafted run (llama-speculative-simple's 'accept'; "
              "a prefix re-verified after a checkpoint restore counts as drafted and accepted), and the server's "
              "mean acceptance length 1 + n_accept / verify steps")
ENV = "BLOOMERY_LLAMA_CPP"


class EngineAborted(Exception):
    """llama.cpp exited non-zero on a run: a failed check (the engine could not run what it was given), not bad
    input of ours."""


@dataclass(frozen=True)
class Pair:
    """How llama.cpp runs a gate's pair: its spec type, the draft's GGUF source, or why it cannot."""

    spec_type: str = ""
    draft: str = "convert"          # convert (llama.cpp's converter) | target (an in-file MTP head) | file (the gate's
    #                                 draft is already a GGUF in the converter's layout: passed as is) | mtp-file (the
    #                                 converter's separate mtp-<name>.gguf beside the target GGUF, passed as -md)
    why_not: str = ""
    gguf: str = ""                  # the fixture GGUF llama.cpp runs when not <gate target>.gguf; the judge's
                                    # target (and an mtp-file draft) are then read from it


PAIRS: dict[str, Pair] = {
    "qwen3-dflash": Pair("draft-dflash"), "qwen3-dspark": Pair("draft-dspark"),
    "qwen3-dflash2": Pair("draft-dflash"),       # llama.cpp has no dflash2 type: its converter writes the arch dflash
    "qwen38-mtp": Pair("draft-mtp", "target"),
    "qwen38-dflash": Pair("draft-dflash"), "qwen38-dspark": Pair("draft-dspark"),
    "qwen38-dflash2": Pair("draft-dflash"),
    "qwen3-eagle3": Pair(why_not="llama.cpp's converter refuses our EAGLE-3 fixture: \"Can not map tensor "
                                 "'model.layers.0.self_attn.k_norm.weight'\" (its Eagle3 mapping has no q/k norm)"),
    "mimo2-mtp": Pair("draft-mtp", "target"),
    "qwen35moe-mtp": Pair(why_not="no GGUF of the qwen35moe fixture target is bundled"),
    "qwen35moe-dflash": Pair(why_not="no GGUF of the qwen35moe fixture target is bundled"),
    "qwen3yarn-dflash": Pair(why_not="no GGUF of the qwen3yarn fixture target is bundled"),
    "qwen3-dflash-swa": Pair(why_not="llama.cpp's DFlash graph has no sliding-window draft layers"),
    "qwen3-dflash-swa-spec": Pair(why_not="llama.cpp's DFlash graph has no sliding-window draft layers"),
    "qwen4exp-mtp": Pair(why_not="llama.cpp has no MTP graph for qwen4exp (no nextn tensor in its QWEN4EXP list; "
                                 "its converter drops mtp.*); its trunk runs fixtures/qwen4exp-tiny.gguf, checked "
                                 "by --oracle (docs/ORACLES.md: its QSA width defect)"),
    "glm5next-mtp": Pair(why_not="llama.cpp's glm5-next NextN graph throws \"not implemented yet\"; its trunk runs "
                                 "fixtures/glm5next-tiny.gguf (expert groups included), checked by --oracle"),
    "ds4-mtp": Pair("draft-mtp", "mtp-file", gguf="ds4-tiny-lc.gguf"),   # ds4-tiny's HCA rate 16: llama.cpp refuses it
    "ds4-dspark": Pair("draft-dspark", "file", gguf="ds4-tiny-lc.gguf"),  # the draft distilled on ds4-tiny
}


def why_not(gate: str) -> str:
    """Why llama.cpp cannot run the gate's pair ("" when it can)."""
    return PAIRS.get(gate, Pair(why_not="not mapped to a llama.cpp speculative type")).why_not


def pair(gate: str) -> Pair:
    """How llama.cpp runs the gate's pair; an InputError (exit 2) saying why when it cannot."""
    if why_not(gate):
        raise InputError(f"--engine llama.cpp {gate}", f"llama.cpp cannot run this pair: {why_not(gate)}")
    return PAIRS[gate]


def find_driver(where: Path | None) -> Path:
    """The driver in ``--llama-cpp DIR`` (a `bloomery engine build --out DIR` folder, or its build/), else in
    $BLOOMERY_LLAMA_CPP, else in ~/.cache/bloomery/llama.cpp."""
    base = where or Path(os.environ.get(ENV, Path.home() / ".cache" / "bloomery" / "llama.cpp"))
    for cand in (base / build.DRIVER, build.driver(base)):
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
    raise InputError(f"--llama-cpp {base}", f"no {build.DRIVER} there; build it with `bloomery engine build --out "
                                            f"{base}` (add --cuda for a GPU build)")


def target_gguf(gguf: Path, dtype: str, work: Path) -> Path:
    if dtype == "f32":
        from ..llamacpp_run import f32_copy
        return f32_copy(gguf, work / "target-f32.gguf")
    return gguf


def convert_draft(llama: Path, draft: Path, target: Path, dtype: str, work: Path) -> Path:
    """llama.cpp's converter on the HF draft folder (child process); the draft GGUF in the gate's dtype."""
    out = work / f"draft-{dtype}.gguf"
    code = ("import runpy, sys\n"
            "tree = sys.argv[1]\n"
            "sys.path[:0] = [tree, tree + '/gguf-py']\n"
            "import conversion.base as base\n"
            "orig = base.TextModel.get_vocab_base_pre\n"
            "def pre(self, tok):\n"
            "    try:\n"
            "        return orig(self, tok)\n"
            "    except NotImplementedError:\n"
            "        return 'qwen2'\n"
            "base.TextModel.get_vocab_base_pre = pre\n"
            "sys.argv = [tree + '/convert_hf_to_gguf.py'] + sys.argv[2:]\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    r = subprocess.run([sys.executable, "-c", code, str(llama), str(draft), "--target-model-dir", str(target),
                        "--outtype", dtype, "--outfile", str(out)],
                       capture_output=True, text=True)
    if r.returncode != 0 or not out.is_file():
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise InputError(draft, f"llama.cpp's converter could not write it as GGUF: {last}")
    return out


def run_driver(drv: Path, args: list[str], prompts: list[list[int]], n: int, work: Path, tag: str,
               threads: int) -> list[dict]:
    ids = work / "prompts.txt"
    ids.write_text("\n".join(" ".join(str(i) for i in p) for p in prompts) + "\n")
    out = work / f"{tag}.jsonl"
    cmd = [str(drv), "--bl-prompts", str(ids), "--bl-out", str(out), "--bl-n", str(n), "--temp", "0",
           "-t", str(threads), *args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        lines = [x for x in r.stderr.strip().splitlines() if "GGML_ASSERT" in x or "error" in x.lower()]
        tail = " | ".join((lines or r.stderr.strip().splitlines())[-2:])
        raise EngineAborted(f"llama.cpp's {tag} run aborted (exit {r.returncode}): {tail}")
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def run(gate, target_hf: Path, target_gguf_path: Path, draft_hf: Path, prompts: list[list[int]], n: int, dtype: str,
        device: str, width: int, drv: Path, threads: int, progress=print) -> Record:
    """llama.cpp's plain and drafted greedy runs of the pair over ``prompts`` as a Record."""
    p = pair(gate.name)
    llama = build.tree_of(drv)
    with tempfile.TemporaryDirectory(prefix="bloomery-llamacpp-") as tmp:
        work = Path(tmp)
        tgt = target_gguf(target_gguf_path, dtype, work)
        ctx = max(len(x) for x in prompts) + n + width + 8
        base = ["-m", str(tgt), "-c", str(ctx), "-b", str(ctx), "-ub", str(ctx), "-ctk", dtype, "-ctv", dtype,
                "-ngl", "0" if device == "cpu" else "99", "-fa", "off" if device == "cpu" else "on"]
        progress(f"engine: llama.cpp plain greedy run, {len(prompts)} prompts x {n} ids")
        plain = run_driver(drv, [*base, "--bl-plain"], prompts, n, work, "plain", threads)
        if p.draft == "target":
            dft = tgt
        elif p.draft == "file":
            dft = draft_hf
        elif p.draft == "mtp-file":
            from ..families.deepseek4.gguf_names import mtp_name
            from ..llamacpp_run import f32_copy
            src = mtp_name(target_gguf_path)
            dft = f32_copy(src, work / "mtp-f32.gguf") if dtype == "f32" else src
        else:
            if not (llama / "convert_hf_to_gguf.py").is_file():
                raise InputError(llama, "no convert_hf_to_gguf.py: the driver's folder is not a `bloomery engine "
                                        "build` folder (its src/ holds the converter)")
            progress("engine: llama.cpp's converter writes the draft as GGUF")
            dft = convert_draft(llama, draft_hf, target_hf, dtype, work)
        spec = [*base, "-md", str(dft), "--spec-type", p.spec_type, "--spec-draft-n-max", str(width),
                "--spec-draft-n-min", "0", "-ctkd", dtype, "-ctvd", dtype, "-ngld", "0" if device == "cpu" else "99"]
        progress(f"engine: llama.cpp speculative greedy run ({p.spec_type}, up to {width} drafts a window)")
        drafted = run_driver(drv, spec, prompts, n, work, "drafted", threads)
    runs = []
    for i, (a, b) in enumerate(zip(plain, drafted, strict=True)):
        wins = [Window(w[0], w[1], w[2], list(w[3])) for w in b["windows"]]
        runs.append(PromptRun(i, list(prompts[i]), a["ids"], b["ids"], wins,
                              {"n_drafted": b["n_drafted"], "n_accept": b["n_accept"], "reverify": b["reverify"]}))
    settings = {"spec_type": p.spec_type, "draft_gguf": p.draft, "kv_cache": dtype, "threads": threads,
                "target_gguf": str(target_gguf_path), "f32_copy": dtype == "f32"}
    return Record(Header(ENGINE, gate.name, dtype, device, n, width, ACCEPTANCE, settings), runs)
