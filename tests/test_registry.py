"""The family registry (bloomery_gates/registry.py): every role resolves, detection agrees with the readers, and no
other module lists families (a tuple, list, set or dict literal holding two or more family keys)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bloomery_gates import registry
from bloomery_gates.registry import FAMILIES, ROLES, family, keys, of_gguf, of_hf, of_model_type

ROOT = Path(__file__).resolve().parents[1]
CODE = ("bloomery_cli", "bloomery_gates", "gates", "kernels", "reference")


@pytest.mark.parametrize("key", sorted(FAMILIES))
def test_every_role_resolves(key):
    fam = FAMILIES[key]
    assert set(fam.code) <= set(ROLES), f"{key}: unknown roles {set(fam.code) - set(ROLES)}"
    for role in fam.code:
        assert fam.load(role) is not None, f"{key}.{role} -> {fam.code[role]}"
    if fam.runs:
        for role in ("read_hf", "read_gguf", "engine", "reference", "reference_layer", "final_norm", "state",
                     "layer_ops"):
            assert fam.has(role), f"{key} runs but has no {role}"


def test_detection_is_one_to_one():
    seen: dict[str, str] = {}
    for fam in FAMILIES.values():
        for name in fam.names:
            assert seen.setdefault(name, fam.key) == fam.key, f"{name} claimed by {seen[name]} and {fam.key}"
            assert of_model_type(name.upper()) is fam
    assert of_hf("qwen3_5_moe").key == "qwen35moe" and of_gguf("qwen35").key == "qwen38"
    assert of_hf("llama") is None and of_model_type("llama").key == "qwen3"      # planned, not read
    assert of_model_type("gpt2") is None
    with pytest.raises(KeyError, match="the families are"):
        family("gpt2")


def test_capabilities_are_what_the_code_reads():
    from bloomery_cli.formats import mtp
    from bloomery_cli.parallel import draft_device, tp
    from bloomery_gates.reference.families.qwen38 import model as qwen38

    assert keys(draft_device=True) == draft_device.FAMILIES and keys(tp=True) == tp.FAMILIES
    assert keys(mtp="in-file") == mtp.MTP_FAMILIES and keys(hybrid=True) == qwen38.HYBRIDS


def test_a_missing_role_is_none_and_a_bad_name_fails():
    assert FAMILIES["qwen3"].check_extra is None
    with pytest.raises(AttributeError):
        FAMILIES["qwen3"].no_such_field  # noqa: B018
    with pytest.raises(KeyError, match="nemotron has no state"):        # inventoried only: no state declarations
        FAMILIES["nemotron"].load("state")
    with pytest.raises(ModuleNotFoundError):
        registry.resolve("bloomery_cli.no_such_module:x")


def family_lists(tree: ast.AST) -> list[tuple[int, list[str]]]:
    """(line, keys) of every literal collection holding two or more family keys as plain strings."""
    found = []
    for node in ast.walk(tree):
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else \
            node.keys if isinstance(node, ast.Dict) else []
        names = [e.value for e in items if isinstance(e, ast.Constant) and e.value in FAMILIES]
        if len(names) >= 2:
            found.append((node.lineno, names))
    return found


def test_no_module_but_the_registry_lists_families():
    bad = []
    for top in CODE:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path == ROOT / "bloomery_gates" / "registry.py":
                continue
            for line, names in family_lists(ast.parse(path.read_text(), str(path))):
                bad.append(f"{path.relative_to(ROOT)}:{line} {names}")
    assert not bad, "family lists outside the registry:\n" + "\n".join(bad)


def test_the_list_check_sees_a_planted_list():
    assert family_lists(ast.parse('TP = ("qwen3", "qwen38")\nX = {"mimo2": 1, "qwen35moe": 2}')) == \
        [(1, ["qwen3", "qwen38"]), (2, ["mimo2", "qwen35moe"])]


# shared modules a role may name: the bands, the state declarations and MoE lines of relatives, and the transformers
# oracle machinery (build_hf_model) that holds the first two families' oracles beside it
SHARED = {"bloomery_cli/bands.py", "gates/state_decls.py", "gates/moe_checks.py", "bloomery_cli/oracle/hf.py"}


def architecture_places() -> list[str]:
    """The `<family>` path patterns of docs/ARCHITECTURE.md's "Adding a family" list."""
    import re

    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text[text.index("## Adding a family"):text.index("### A GGUF layout")]
    return [p for p in re.findall(r"`([\w/<>*.-]+\.py)`", section) if "<family>" in p or p.endswith("registry.py")
            or p.endswith("spec/__init__.py")]


def module_file(ref: str) -> str:
    module = ref.partition(":")[0]
    for pkg, folder in (("bloomery_gates.kernels.", "kernels/"), ("bloomery_gates.reference.", "reference/"),
                        ("bloomery_gates.gates.", "gates/"), ("bloomery_cli.", "bloomery_cli/")):
        if module.startswith(pkg):
            return folder + module[len(pkg):].replace(".", "/") + ".py"
    return module.replace(".", "/") + ".py"


def test_architecture_list_covers_every_role():
    """Every role of every entry lives in a place docs/ARCHITECTURE.md's list names (for its own key or a
    relative's) or in a shared module: the list is what adding a family touches."""
    from fnmatch import fnmatch

    places = architecture_places()
    assert len(places) >= 8, places
    pats = [p.replace("<family>", k) for p in places for k in FAMILIES]
    for fam in FAMILIES.values():
        for role, ref in fam.code.items():
            path = module_file(ref)
            assert (ROOT / path).is_file(), f"{fam.key}.{role}: {path} does not exist"
            assert path in SHARED or any(fnmatch(path, p) for p in pats), \
                f"{fam.key}.{role} lives in {path}, which docs/ARCHITECTURE.md's list does not name"


def test_the_architecture_check_sees_a_place_off_the_list():
    from fnmatch import fnmatch

    pats = [p.replace("<family>", "qwen3") for p in architecture_places()]
    assert not any(fnmatch("bloomery_cli/loading.py", p) for p in pats)
    assert any(fnmatch("kernels/families/qwen3/model.py", p) for p in pats)


def family_file_strays(paths: list[str], keys) -> list[str]:
    """Files named after a family (its key in the file name) outside its folders and its gate definitions: the
    places docs/ARCHITECTURE.md's "Adding a family" list names (tests, docs, results and fixtures aside)."""
    import re

    out = []
    for p in paths:
        if p.startswith(("tests/", "docs/", "results/", "fixtures/", ".")) or "/families/" in p:
            continue
        name = p.rsplit("/", 1)[-1]
        named = any(re.search(rf"(^|_){re.escape(k)}(_|\.|yarn)", name) for k in keys)
        if named and not (p.startswith("gates/") and name.endswith(".py")):
            out.append(p)
    return out


def test_a_familys_files_live_in_its_places():
    import subprocess

    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    assert family_file_strays(tracked, FAMILIES) == []


def test_the_stray_check_sees_a_family_file_in_a_shared_folder():
    assert family_file_strays(["bloomery_cli/formats/mimo2_gguf.py", "bloomery_cli/plan/mimo2.py",
                               "bloomery_cli/families/mimo2/reader.py", "gates/mimo2_mtp.py"], ["mimo2"]) == \
        ["bloomery_cli/formats/mimo2_gguf.py", "bloomery_cli/plan/mimo2.py"]
