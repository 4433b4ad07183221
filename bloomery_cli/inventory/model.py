"""The inventory's data: groups, known names, and the dataclasses a model's inventory fills."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GROUPS = ("token_embd", "output", "attn", "ffn_dense", "router", "ffn_exps_routed", "ffn_shexp",
          "mtp_nextn", "other")
MTP_IN_FILE, MTP_SIDECAR, BLOCK_DRAFT, NONE = "MTP in-file", "MTP sidecar", "block draft", "none"

# block drafters: config architectures / speculators type / GGUF arch -> draft kind
BLOCK_DRAFT_ARCHS = {"dflashdraftmodel": "dflash", "dflash2draftmodel": "dflash2",
                     "qwen3dsparkmodel": "dspark"}
BLOCK_DRAFT_GGUF = {"dflash": "dflash/dspark", "dflash2": "dflash2", "dspark": "dspark"}
MTP_DRAFT_KINDS = frozenset({"mtp", "nextn"})

_HF_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.", "model.", "backbone.",
                "transformer.")
_HF_NEXTN_MARKERS = frozenset({"enorm", "hnorm", "eh_proj", "shared_head"})
_HF_NEXTN_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers", "n_mtp_layers")
_HF_ROUTED_KEYS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
_HF_USED_KEYS = ("num_experts_per_tok", "n_experts_per_tok", "moe_top_k", "num_experts_per_token")
_HF_SHARED_KEYS = ("n_shared_experts", "num_shared_experts", "shared_expert_count")
_SPLIT_RE = re.compile(r"^(?P<base>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$", re.IGNORECASE)
_ST_BITS = {"F64": 64, "F32": 32, "F16": 16, "BF16": 16, "I64": 64, "I32": 32, "I16": 16, "I8": 8, "U8": 8,
            "U16": 16, "U32": 32, "U64": 64, "BOOL": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8,
            "F6_E2M3": 6, "F6_E3M2": 6, "F4": 4, "C64": 64}


# ---------------------------------------------------------------------------------------------
# data


@dataclass
class TensorRow:
    name: str              # as stored in the file
    file: Path
    dtype: str             # safetensors dtype (BF16) or ggml type (Q8_0)
    shape: tuple[int, ...]  # logical [out, in] order
    nbytes: int
    group: str = "other"
    block: int | None = None


@dataclass
class ModelInventory:
    """One model: an HF dir / safetensors shard set, a GGUF, or the parts of a split GGUF."""

    label: str
    fmt: str                                  # "gguf" or "safetensors"
    files: list[Path]
    config: Path | None = None                # config.json read beside safetensors files
    tensors: list[TensorRow] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)   # shown as-is (key -> value)
    arch: str | None = None                   # GGUF general.architecture or HF model_type
    architectures: list[str] = field(default_factory=list)
    block_count: int | None = None            # GGUF <arch>.block_count (trunk + nextn) / HF num_hidden_layers
    nextn_layers: int | None = None           # declared by a key (GGUF <arch>.nextn_predict_layers, HF ...)
    n_routed: int | None = None
    n_used: int | None = None
    n_shared: int | None = None
    moe_blocks: list[int] = field(default_factory=list)
    mtp_blocks: list[int] = field(default_factory=list)
    mtp_why: str = ""
    active_bytes: int | None = None
    active_why: str = ""
    verdict: str = NONE
    why: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def groups(self) -> dict[str, tuple[int, int]]:
        """group -> (tensor count, bytes), every group in GROUPS order (zeros included)."""
        out = {g: (0, 0) for g in GROUPS}
        for t in self.tensors:
            n, b = out[t.group]
            out[t.group] = (n + 1, b + t.nbytes)
        return out

    def group_bytes(self, group: str) -> int:
        return self.groups[group][1]

    def names(self, group: str) -> list[str]:
        return [t.name for t in self.tensors if t.group == group]


@dataclass
class Inventory:
    models: list[ModelInventory]

    @property
    def verdicts(self) -> list[str]:
        return [m.verdict for m in self.models]


def _human(n: int | None) -> str:
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    return f"{n} B"
