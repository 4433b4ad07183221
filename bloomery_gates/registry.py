"""The family registry: one entry per target family, the only place that lists families.

An entry says what a family is called (key, aliases), how a file is recognised as one (HF ``model_type``, GGUF
``general.architecture``), what it can do (an MTP head in its file, tensor parallel, a draft on a device of its
own, a hybrid recurrent state, how ``plan`` counts it) and where its code lives. Loading, inventory, plan, the
draft device, TP, the bands and the gates read it (docs/ARCHITECTURE.md, "Adding a family").

The code is named, not imported: each role is a ``"module:attribute"`` string (the form of Python packaging's
entry points), resolved at each use by ``Family.load`` (an import already done costs a dict lookup; tests may
monkeypatch the named attribute). That keeps this module data only, so every layer can
read it (the core imports nothing above itself: tests/test_layers.py), and a family's code can live in its own
folders of each layer without the registry pulling those layers in. tests/test_registry.py resolves every role of
every entry, so a misspelt name fails there, not at a user's terminal.

Roles (what ``load`` returns):

    read_hf, read_gguf    (path) -> ModelSpec                      the readers (bloomery_cli/formats)
    engine                class (spec, device, dtype, max_len, rows=) the device engine (kernels/families)
    fast_engine           class (spec, device, dtype, max_len, rows=) the bench's engine (fused ops, CUDA graphs,
                          Triton on CUDA, its torch path elsewhere): ``--engine fast`` runs the gate on it
    reference             (spec, ids) -> RefOut                     the float64 forward (reference/families)
    reference_layer       (spec, l, h, taps=None, ids=None) -> h'   layer l on its own (taps: every layer's input; ids)
    final_norm            (spec, h [T, H]) -> [T, H]                the rows that enter the head
    oracle                (spec, ids) -> logits [T, V]              tier 3 from code nobody here wrote
    state                 tuple[StateDecl]                         the engine's state after a run
    check_extra           (report, spec, prefill, dtype) -> None   the family's own lines (MoE routing)
    layer_ops             (LayerShape, T) -> list[Op]              one layer's chained stored ops (the bands)
    plan_hf, plan_gguf    (path, inventory[, cfg, where]) -> PlanModel  a family plan counts itself
    plan_draft            (path, target, own: path as a target or None) -> PlanDraft  and its drafts
    plan_gguf_draft       (path, target) -> PlanDraft           a dflash-arch GGUF block draft (deepseek4: DSpark)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module
from typing import Any

QWEN3_OPS = "bloomery_cli.bands:layer_ops"      # the Qwen3-shaped layer (every family here, for now)


@dataclass(frozen=True)
class Family:
    key: str
    title: str
    hf_model_types: tuple[str, ...] = ()       # the readers accept these
    gguf_archs: tuple[str, ...] = ()
    related_types: tuple[str, ...] = ()        # model types / archs inventoried and planned as this family, not read
    aliases: tuple[str, ...] = ()              # other names a user may type for the key
    runs: bool = False                         # a target the gates load and run
    mtp: str | None = None                     # "in-file" (the head ships in the target's file), "sidecar", None
    tp: bool = False                           # --tp splits it
    draft_device: bool = False                 # --draft-device: its drafts read only the TargetView
    hybrid: bool = False                       # recurrent (DeltaNet) layers beside attention
    plan_as: str | None = None                 # plan's built-in layout ("qwen3", "qwen38", "nemotron") or None
    llama_bench: bool = False                  # bench --llama-cpp writes its GGUF (bench_llamacpp.write_gguf)
    draft_path: str | None = None              # the draft path inventory names for a family no gate runs yet
    gguf_runs: bool = True                     # the engine and reference run a spec read from its GGUF (False: the
                                               # GGUF is read for inventory / plan only; the gates run the HF layout)
    code: dict[str, str] = field(default_factory=dict)

    def has(self, role: str) -> bool:
        return role in self.code

    def load(self, role: str) -> Any:
        """The object the role names (``KeyError`` naming the family when it has none)."""
        if role not in self.code:
            raise KeyError(f"family {self.key} has no {role}")
        return resolve(self.code[role])

    def __getattr__(self, role: str) -> Any:        # family.engine, family.reference, ...: the loaded role
        code = self.__dict__.get("code", {})
        if role in code:
            return resolve(code[role])
        if role in ROLES:
            return None
        raise AttributeError(role)

    @property
    def names(self) -> tuple[str, ...]:
        """Every HF model type and GGUF arch recognised as this family (read or not)."""
        return (*self.hf_model_types, *self.gguf_archs, *self.related_types)


ROLES = ("read_hf", "read_gguf", "engine", "fast_engine", "reference", "reference_layer", "final_norm", "oracle",
         "oracle_llamacpp", "state", "check_extra", "layer_ops", "plan_hf", "plan_gguf", "plan_draft",
         "plan_gguf_draft")


def resolve(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    obj: Any = import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


K, R, G, C = "bloomery_gates.kernels.families.", "bloomery_gates.reference.families.", "bloomery_gates.gates.", \
    "bloomery_cli."
QX, GN, DS = C + "families.qwen4exp.", C + "families.glm5next.", C + "families.deepseek4."

FAMILIES: dict[str, Family] = {f.key: f for f in (
    Family("qwen3", "Qwen3 dense (also the Llama layout's plan)", ("qwen3",), ("qwen3",), ("llama",),
           runs=True, tp=True, draft_device=True, plan_as="qwen3", llama_bench=True,
           code={"read_hf": C + "families.qwen3.reader:qwen3_from_hf",
                 "read_gguf": C + "families.qwen3.reader:qwen3_from_gguf",
                 "engine": K + "qwen3.model:Qwen3Target", "fast_engine": K + "qwen3.model:FastQwen3Target",
                 "reference": R + "qwen3.model:forward",
                 "reference_layer": R + "qwen3.model:reference_layer", "final_norm": R + "qwen3.model:final_norm",
                 "oracle": C + "oracle.hf:hf_qwen3_logits", "state": G + "state_decls:QWEN3_STATE",
                 "layer_ops": QWEN3_OPS}),
    Family("qwen38", "Qwen3.5 / 3.6 / 3.8 dense hybrid (gated DeltaNet + gated attention)", ("qwen3_5", "qwen3_5_text"),
           ("qwen35",), runs=True, mtp="in-file", draft_device=True, hybrid=True,
           plan_as="qwen38", llama_bench=True,
           code={"read_hf": C + "families.qwen38.reader:qwen38_from_hf",
                 "read_gguf": C + "families.qwen38.reader:qwen38_from_gguf",
                 "engine": K + "qwen38.model:Qwen38Target", "fast_engine": K + "qwen38.fast:FastQwen38Target",
                 "reference": R + "qwen38.model:forward",
                 "reference_layer": R + "qwen38.model:reference_layer", "final_norm": R + "qwen38.model:final_norm",
                 "oracle": C + "oracle.hf:hf_qwen38_logits", "state": G + "state_decls:QWEN38_STATE",
                 "layer_ops": QWEN3_OPS}),
    Family("qwen35moe", "Qwen3.5 / 3.6 MoE hybrid", ("qwen3_5_moe", "qwen3_5_moe_text"), ("qwen35moe",),
           runs=True, mtp="in-file", draft_device=True, hybrid=True, plan_as="qwen38",
           code={"read_hf": C + "families.qwen35moe.reader:qwen35moe_from_hf",
                 "read_gguf": C + "families.qwen35moe.reader:qwen35moe_from_gguf",
                 "engine": K + "qwen35moe.model:Qwen35MoeTarget", "reference": R + "qwen35moe.model:forward",
                 "reference_layer": R + "qwen35moe.model:reference_layer", "final_norm": R + "qwen38.model:final_norm",
                 "oracle": C + "families.qwen35moe.oracle:hf_qwen35moe_logits",
                 "state": G + "state_decls:QWEN38_STATE",
                 "check_extra": G + "moe_checks:check_routing", "layer_ops": QWEN3_OPS}),
    Family("mimo2", "Xiaomi MiMo-V2-Flash (hybrid SWA, MoE, 3 MTP layers)", ("mimo_v2_flash",), ("mimo2",),
           ("mimo_v2",), runs=True, mtp="sidecar", draft_device=True,
           code={"read_hf": C + "families.mimo2.reader:mimo2_from_hf",
                 "read_gguf": C + "families.mimo2.reader_gguf:mimo2_from_gguf",
                 "engine": K + "mimo2.model:Mimo2Target", "reference": R + "mimo2.model:forward",
                 "reference_layer": R + "mimo2.model:reference_layer", "final_norm": R + "qwen3.model:final_norm",
                 "oracle": C + "families.mimo2.oracle:hf_mimo2_logits", "state": G + "state_decls_mimo2:MIMO2_STATE",
                 "layer_ops": QWEN3_OPS, "plan_hf": C + "families.mimo2.plan:mimo2_target",
                 "plan_gguf": C + "families.mimo2.plan:mimo2_gguf_target",
                 "plan_draft": C + "families.mimo2.plan:mimo2_draft"}),
    # recognised by inventory (and plan, for nemotron) only: no reader, engine or reference yet
    # qwen4exp: the gate qwen4exp-mtp (the HF mtp.* head); draft_path for inventory (the GGUF sidecar is read only)
    Family("qwen4exp", "Qwen3.8-Flash-Next (docs/FAMILIES_MOE.md 4.5)", ("qwen4_exp",), ("qwen4exp",),
           runs=True, mtp="sidecar", draft_device=True, hybrid=True,
           draft_path="MTP head fed the 4 raw HC streams (GGUF: the separate shared MTP GGUF, one nextn block; "
                      "HF: the mtp.* layer in the file)",
           code={"read_hf": QX + "reader:qwen4exp_from_hf", "read_gguf": QX + "reader_gguf:qwen4exp_from_gguf",
                 "plan_hf": QX + "plan:qwen4exp_target", "plan_gguf": QX + "plan:qwen4exp_gguf_target",
                 "plan_draft": QX + "plan:qwen4exp_draft",
                 "engine": K + "qwen4exp.model:Qwen4ExpTarget", "reference": R + "qwen4exp.model:forward",
                 "reference_layer": R + "qwen4exp.model:reference_layer",
                 "final_norm": R + "qwen4exp.model:final_norm", "oracle": QX + "oracle:hf_qwen4exp_logits",
                 "oracle_llamacpp": QX + "oracle_llamacpp:check_target_qwen4exp",
                 "state": G + "state_decls_qwen4exp:QWEN4EXP_STATE", "check_extra": G + "moe_checks:check_routing",
                 "layer_ops": QWEN3_OPS}),
    Family("glm5next", "GLM-5.3 (docs/FAMILIES_MOE.md 4.3)", ("glm5_next",), ("glm5-next",), ("glm5next",),
           runs=True, mtp="in-file", draft_device=True, hybrid=True,
           draft_path="NextN layer in-file (a plain-residual MLA + DSA + MoE block fed norm(mean of the streams))",
           code={"read_hf": GN + "reader:glm5next_from_hf", "read_gguf": GN + "reader_gguf:glm5next_from_gguf",
                 "plan_hf": GN + "plan:glm5next_target", "plan_gguf": GN + "plan:glm5next_gguf_target",
                 "plan_draft": GN + "plan:glm5next_draft", "engine": K + "glm5next.model:Glm5NextTarget",
                 "reference": R + "glm5next.model:forward", "reference_layer": R + "glm5next.model:reference_layer",
                 "final_norm": R + "glm5next.model:final_norm", "oracle": GN + "oracle:hf_glm5next_logits",
                 "oracle_llamacpp": GN + "oracle_llamacpp:check_target_glm5next",
                 "state": G + "state_decls_glm5next:GLM5NEXT_STATE", "check_extra": G + "moe_checks:check_routing",
                 "layer_ops": QWEN3_OPS}),
    Family("deepseek4", "DeepSeek V4 (docs/FAMILIES_MOE.md 4.4)", ("deepseek_v4",), ("deepseek4",),
           runs=True, mtp="in-file", draft_device=True,
           code={"read_hf": DS + "reader:deepseek4_from_hf", "read_gguf": DS + "reader_gguf:deepseek4_from_gguf",
                 "engine": K + "deepseek4.model:Deepseek4Target", "plan_hf": DS + "plan:deepseek4_target",
                 "plan_gguf": DS + "plan:deepseek4_gguf_target", "plan_draft": DS + "plan:deepseek4_draft",
                 "plan_gguf_draft": DS + "plan:deepseek4_dspark_draft",
                 "reference": R + "deepseek4.model:forward", "reference_layer": R + "deepseek4.model:reference_layer",
                 "final_norm": R + "deepseek4.model:final_norm", "oracle": DS + "oracle:hf_deepseek4_logits",
                 "state": G + "state_decls_deepseek4:DEEPSEEK4_STATE", "layer_ops": QWEN3_OPS}),
    Family("deepseek41", "DeepSeek V4.1 (docs/V41.md; window-only layers, lagged HC; gate ds41-dspark)",
           gguf_archs=("deepseek41",), runs=True, draft_device=True,
           code={"read_hf": C + "families.deepseek41.reader_hf:deepseek41_from_hf",
                 "read_gguf": C + "families.deepseek41.reader_gguf:deepseek41_from_gguf",
                 "engine": K + "deepseek41.model:Deepseek41Target", "reference": R + "deepseek41.model:forward",
                 "reference_layer": R + "deepseek41.model:reference_layer",
                 "final_norm": R + "deepseek41.model:final_norm",
                 "plan_gguf": C + "families.deepseek41.plan:deepseek41_gguf_target",
                 "plan_gguf_draft": C + "families.deepseek41.plan:deepseek41_dspark_draft",
                 "state": G + "state_decls_deepseek41:DEEPSEEK41_STATE", "layer_ops": QWEN3_OPS}),
    Family("nemotron", "NVIDIA Nemotron-H (Mamba-2 hybrid)", related_types=("nemotron_h", "nemotron_h_moe"),
           plan_as="nemotron"),
)}


def family(key: str) -> Family:
    """The entry for a key or alias (``KeyError`` listing the keys)."""
    if key in FAMILIES:
        return FAMILIES[key]
    for f in FAMILIES.values():
        if key in f.aliases:
            return f
    raise KeyError(f"no family {key!r}; the families are {', '.join(FAMILIES)}")


def of_model_type(name: str) -> Family | None:
    """The family an HF model_type or a GGUF arch (any case) belongs to, read or only recognised; None if none."""
    low = name.lower()
    return next((f for f in FAMILIES.values() if low in f.names), None)


def of_hf(model_type: str) -> Family | None:
    """The family whose readers take this HF model_type."""
    return next((f for f in FAMILIES.values() if model_type in f.hf_model_types), None)


def of_gguf(arch: str) -> Family | None:
    """The family whose readers take this GGUF arch."""
    return next((f for f in FAMILIES.values() if arch in f.gguf_archs), None)


def keys(**can: Any) -> tuple[str, ...]:
    """The keys of the families whose fields equal ``can`` (``keys(tp=True)``, ``keys(mtp="in-file")``)."""
    return tuple(f.key for f in FAMILIES.values() if all(getattr(f, k) == v for k, v in can.items()))
