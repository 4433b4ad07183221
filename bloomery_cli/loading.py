"""Entry points that turn checkpoint paths into validated specs (see docs/INTERFACES.md).

- ``load_target(path)``: a Qwen3 target from an HF directory (config.json + safetensors, one file or
  shards) or a llama.cpp ``*.gguf`` file.
- ``load_dflash(path, target)``: a DFlash drafter from an HF directory, checked to fit ``target``; likewise
  ``load_dflash2`` and ``load_dspark``. A directory whose config.json has ``speculators_model_type`` is read in
  the speculators layout (``formats.speculators_drafts``), any other in the z-lab / DeepSpec layout.
- ``load_tokenizer(path)``: the ``tokenizer.json`` in the target directory or beside the GGUF.

Every user error is a ``bloomery_gates.errors.InputError`` subclass whose one-line message names the
file, key or tensor and what was expected. Tensors stay lazy (memory-mapped) until indexed. Pickle
checkpoints are refused; nothing in a checkpoint directory is imported or executed.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from bloomery_cli.files import exists
from bloomery_cli.formats.dflash import dflash_from_hf
from bloomery_cli.formats.dflash2 import dflash2_from_hf
from bloomery_cli.formats.dspark import dspark_from_hf
from bloomery_cli.formats.gguf_file import GGUFFile, is_gguf
from bloomery_cli.formats.hf_dir import read_config, refuse_pickle
from bloomery_cli.formats.speculators import speculators_kind
from bloomery_cli.formats.speculators_drafts import (
    dflash2_from_speculators,
    dflash_from_speculators,
    dspark_from_speculators,
)
from bloomery_cli.formats.tokenizer import load_tokenizer as _load_tokenizer
from bloomery_gates.errors import InputError, MissingFile
from bloomery_gates.registry import family, of_gguf, of_hf
from bloomery_gates.spec import DFlash2Spec, DFlashSpec, DSparkSpec, Eagle3Spec, ModelSpec, MTPSpec

from .families.mimo2.reader_gguf import is_mimo2_gguf
from .fixturegen.derived import stored_or_derived

DEFAULT = "qwen3"     # the reader a file of no known type is handed to (its error names what it expected)

__all__ = ["load_target", "load_dflash", "load_dflash2", "load_dspark", "load_mtp", "load_eagle3", "load_tokenizer",
           "load_mimo2_mtp"]

def _existing(path: str | Path, role: str) -> Path:
    p = stored_or_derived(Path(path).expanduser())          # a derived fixture (the target's GGUF) made on demand
    if not exists(p, role):
        raise MissingFile(p, f"no such file or directory; expected the {role}")
    if p.is_file():
        refuse_pickle(p)
    return p

def load_target(path: str | Path) -> ModelSpec:
    """The target model at ``path``: an HF directory or a ``*.gguf`` file, read by the reader of the family its
    ``model_type`` / ``general.architecture`` names in the registry (``bloomery_gates.registry``). A type no
    family reads goes to the qwen3 reader, whose error names what it expected."""
    p = _existing(path, "target checkpoint (an HF directory or a .gguf file)")
    if p.is_dir():
        mt = read_config(p).get("model_type") if (p / "config.json").is_file() else None
        return (of_hf(mt) or family(DEFAULT)).read_hf(p)
    if is_gguf(p):
        return (of_gguf(GGUFFile(p).meta("general.architecture", None)) or family(DEFAULT)).read_gguf(p)
    raise InputError(p, "expected an HF directory (config.json + *.safetensors) or a .gguf file")

def load_dflash(path: str | Path, target: ModelSpec) -> DFlashSpec:
    """The DFlash drafter in the HF directory ``path``; raises ``Mismatch`` if it does not fit ``target``."""
    p = _existing(path, "DFlash draft directory")
    if not p.is_dir():
        raise InputError(p, "expected the DFlash draft's HF directory (config.json + *.safetensors)")
    return dflash_from_speculators(p, target) if speculators_kind(p) else dflash_from_hf(p, target)

def load_tokenizer(path: str | Path) -> Tokenizer:
    """``tokenizers.Tokenizer`` for the target at ``path`` (``MissingFile`` if tokenizer.json is absent)."""
    return _load_tokenizer(_existing(path, "target checkpoint"))

def load_dspark(path: str | Path, target: ModelSpec) -> DSparkSpec:
    """The DSpark drafter (DeepSpec layout) in the HF directory ``path``; ``Mismatch`` if it does not fit."""
    p = _existing(path, "DSpark draft directory")
    if not p.is_dir():
        raise InputError(p, "expected the DSpark draft's HF directory (config.json + *.safetensors)")
    return dspark_from_speculators(p, target) if speculators_kind(p) else dspark_from_hf(p, target)

def load_dflash2(path: str | Path, target: ModelSpec) -> DFlash2Spec:
    """The DFlash2 drafter in the HF directory ``path``; raises ``Mismatch`` if it does not fit ``target``."""
    p = _existing(path, "DFlash2 draft directory")
    if not p.is_dir():
        raise InputError(p, "expected the DFlash2 draft's HF directory (config.json + *.safetensors)")
    return dflash2_from_speculators(p, target) if speculators_kind(p) else dflash2_from_hf(p, target)

def load_mtp(path: str | Path, target: ModelSpec) -> MTPSpec:
    """The MTP / NextN head shipped in ``path`` (an HF directory or a qwen35 GGUF, usually the target's own
    checkpoint) for the qwen38 ``target``; named errors when absent, incomplete or unfit (formats/mtp.py)."""
    from bloomery_cli.formats.mtp import mtp_from_file

    return mtp_from_file(_existing(path, "checkpoint holding the MTP head (an HF directory or a .gguf file)"), target)

def load_eagle3(path: str | Path, target: ModelSpec) -> Eagle3Spec:
    """The EAGLE-3 drafter (speculators ``eagle3`` layout) in the HF directory ``path``; named errors when it
    cannot be acted on or does not fit ``target`` (formats/eagle3.py)."""
    from bloomery_cli.formats.eagle3 import eagle3_from_hf

    p = _existing(path, "EAGLE-3 draft directory (speculators layout)")
    if not p.is_dir():
        raise InputError(p, "expected the EAGLE-3 draft's HF directory (config.json + *.safetensors)")
    return eagle3_from_hf(p, target)

def load_mimo2_mtp(path: str | Path, target: ModelSpec):
    """The MTP layers shipped in the mimo2 checkpoint ``path`` (usually the target's own directory) for the mimo2
    ``target``; named errors when absent, incomplete or unfit (families/mimo2/reader_mtp.py)."""
    from .families.mimo2.reader_mtp import mimo2_mtp_from_file

    p = _existing(path, "mimo2 checkpoint holding the MTP layers (an HF directory or a mimo2 .gguf)")
    if not p.is_dir() and not is_mimo2_gguf(p):
        raise InputError(p, "expected the mimo2 checkpoint's HF directory (config.json + *.safetensors) or its "
                            "llama.cpp GGUF (arch mimo2)")
    return mimo2_mtp_from_file(p, target)
