"""The layering: the project's own imports, read with ast (stdlib only, no code is run), form no cycle and point
only down the layer table below.

Every import counts as an edge, at module level or inside a function (an import inside a function still runs, and
still ties the two modules together); only the body of `if TYPE_CHECKING:` is skipped. A relative import is resolved
to its dotted name; `import a.b` is an edge to the module a.b (its package's __init__ if it is a package);
`from pkg import name` is an edge to pkg.name where that is a submodule, else to pkg itself.

The layers, lowest first (a module may import its own layer or lower):

  0 core       bloomery_gates, its modules (errors, lru, ...) and the spec package: imports nothing above it
  1 library    bloomery_gates.kernels.* (the torch device engine) and bloomery_gates.reference.* (the float64
               reference); the two are siblings and import nothing from each other
  2 cli lib    bloomery_cli.* except the runner below: loading, formats, plans, benches, oracles, results
  3 gates      bloomery_gates.gates.*: the gate definitions (one module per target family x drafter)
  4 runner     RUNNER below: the modules that run the gates or the commands over them
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Layer 4, the runner and the commands: the modules that import the gates (bloomery_gates.gates) to run them, and
# what must import those. Everything else in bloomery_cli is layer 2 and may not import the gates.
#   cli                 the typer app: every command
#   gate                the gate pipeline (load, reference checks, plain and drafted runs, the record)
#   engine_cli          `bloomery gate run --engine` / `bloomery engine ...`, over engines.gate and engines.judge
#   engines.gate        another engine's runs of a gate's pair, judged by engines.judge with the gate's lines
#   engines.judge       (it needs the gates' target families)
#   bench               `bloomery bench NAME`: a gate's checkpoints; what the benches share is bench_common
#   plan_cli            `bloomery plan`; its --measure is plan_measure, which builds a gate's pair
#   plan_measure
#   band_probe          the band probe: runs a gate's draft check
#   inventory.verdict   names the gates that run a checkpoint's draft kind (so the package facade
#                       bloomery_cli.inventory is layer 4 too; its other modules are layer 2)
# A prefix covers the module and everything under it.
RUNNER = (
    "bloomery_cli.cli",
    "bloomery_cli.gate",
    "bloomery_cli.engine_cli",
    "bloomery_cli.engines.gate",
    "bloomery_cli.engines.judge",
    "bloomery_cli.bench.command",
    "bloomery_cli.plan.command",
    "bloomery_cli.plan.measure",
    "bloomery_cli.bench.band_probe",
    "bloomery_cli.inventory.verdict",
)

CORE, LIBRARY, CLI_LIB, GATES, RUN = 0, 1, 2, 3, 4
NAMES = {CORE: "core", LIBRARY: "library", CLI_LIB: "cli library", GATES: "gates", RUN: "runner"}


def package_dirs(root: Path) -> dict[str, Path]:
    """The import name -> folder map, from pyproject.toml's [tool.setuptools] package-dir."""
    conf = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    return {name: root / folder for name, folder in conf["tool"]["setuptools"]["package-dir"].items()}


def modules(dirs: dict[str, Path]) -> dict[str, Path]:
    """Every module under the mapped folders, by dotted import name (a package by its own name, for __init__)."""
    out: dict[str, Path] = {}
    folders = {d.resolve() for d in dirs.values()}
    for name, folder in dirs.items():
        for p in sorted(folder.rglob("*.py")):
            # a folder mapped under another name (kernels/ is bloomery_gates.kernels) is walked under that name only
            if any(f != folder.resolve() and f in p.resolve().parents and folder.resolve() in f.parents
                   for f in folders):
                continue
            parts = list(p.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([name, *parts])] = p
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """All import statements, however deep, except those under `if TYPE_CHECKING:` (its else branch counts)."""
    out: list[ast.Import | ast.ImportFrom] = []

    def walk(node: ast.AST) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                walk(child)
            return
        for child in ast.iter_child_nodes(node):
            walk(child)

    walk(tree)
    return out


def graph(mods: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {imported project module: line of the first such import}."""

    def owner(name: str) -> str | None:
        while name:
            if name in mods:
                return name
            name = name.rpartition(".")[0]
        return None

    edges: dict[str, dict[str, int]] = {}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        found: dict[str, int] = {}
        for node in imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [owner(a.name) for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")
                    up = up[: len(up) - (node.level - 1)]
                    base = ".".join([*up, base]) if base else ".".join(up)
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.append(sub if sub in mods else owner(base))
            for t in targets:
                if t is not None and t != mod:
                    found.setdefault(t, node.lineno)
        edges[mod] = found
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in edges:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def cycle_path(comp: list[str], edges: dict[str, dict[str, int]]) -> list[str]:
    """One closed walk through a strongly connected component, for the report: a -> b -> ... -> a."""
    members = set(comp)
    start = comp[0]
    # breadth-first from start's successors back to start, inside the component
    prev: dict[str, str] = {}
    frontier = [start]
    seen = {start}
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v]):
                if w not in members:
                    continue
                if w == start:
                    path = [start, v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return path[::-1][:-1] + [start] if len(path) > 2 else [start, start]
                if w not in seen:
                    seen.add(w)
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


def rank(mod: str, core: str = "bloomery_gates", runner: tuple[str, ...] = RUNNER) -> tuple[int, str]:
    """(layer, side) of a module; side tells the two layer-1 siblings apart (kernels, reference)."""
    if mod == core or (mod.startswith(core + ".") and mod.count(".") == core.count(".") + 1
                       and mod.rpartition(".")[2] not in ("kernels", "reference", "gates")):
        return CORE, ""
    if mod.startswith(f"{core}.spec."):         # the spec package: core, split by family
        return CORE, ""
    for side in ("kernels", "reference"):
        if mod == f"{core}.{side}" or mod.startswith(f"{core}.{side}."):
            return LIBRARY, side
    if mod == f"{core}.gates" or mod.startswith(f"{core}.gates."):
        return GATES, ""
    if any(mod == r or mod.startswith(r + ".") for r in runner):
        return RUN, ""
    return CLI_LIB, ""


def upward(edges: dict[str, dict[str, int]], mods: dict[str, Path], root: Path, core: str = "bloomery_gates",
           runner: tuple[str, ...] = RUNNER) -> list[str]:
    """Each import that points above its module's layer, or across from kernels to reference (or back).

    A package's __init__ may import its own children whatever their layer (it is their facade); the package then
    sits at the highest layer it imports that way, and whoever imports the package (not a child) must be at or
    above it."""
    base = {m: rank(m, core, runner) for m in mods}
    effective: dict[str, tuple[int, str]] = {}

    def facade(m: str, seen: frozenset[str] = frozenset()) -> tuple[int, str]:
        if m not in effective:
            r = base[m]
            if mods[m].name == "__init__.py":
                for t in edges[m]:
                    if t.startswith(m + ".") and t not in seen:
                        r = max(r, facade(t, seen | {m}), key=lambda x: x[0])
            effective[m] = r
        return effective[m]

    out = []
    for mod in sorted(edges):
        r, side = base[mod]
        for target, line in sorted(edges[mod].items()):
            if mods[mod].name == "__init__.py" and target.startswith(mod + "."):
                continue                                  # a package's facade over its own children
            tr, tside = facade(target)
            where = f"{mods[mod].relative_to(root)}:{line}"
            if tr > r:
                out.append(f"{where}: {mod} ({NAMES[r]}) imports {target} ({NAMES[tr]})")
            elif tr == r == LIBRARY and side != tside:
                out.append(f"{where}: {mod} ({side}) imports {target} ({tside}): the two are siblings")
    return out


def check(root: Path, dirs: dict[str, Path], core: str = "bloomery_gates",
          runner: tuple[str, ...] = RUNNER) -> tuple[list[str], list[str]]:
    """(cycles as 'a -> b -> a' lines, upward imports as lines)."""
    mods = modules(dirs)
    edges = graph(mods)
    loops = [" -> ".join(cycle_path(c, edges)) + f"   (component: {', '.join(c)})" for c in cycles(edges)]
    return loops, upward(edges, mods, root, core, runner)


def test_no_import_cycle():
    loops, _ = check(ROOT, package_dirs(ROOT))
    assert not loops, "import cycles:\n" + "\n".join(loops)


def test_no_upward_import():
    _, up = check(ROOT, package_dirs(ROOT))
    assert not up, "imports above their layer:\n" + "\n".join(up)


def test_runner_list_is_live():
    """Each RUNNER prefix names a module that exists, so that the list cannot go stale silently."""
    mods = modules(package_dirs(ROOT))
    assert [r for r in RUNNER if r not in mods] == []


def test_checker_sees_a_planted_cycle_and_upward_import(tmp_path):
    """The checker itself: a tiny package with a cycle, an upward import hidden in a function, a kernels ->
    reference import and a TYPE_CHECKING-only import (which must not count)."""
    files = {
        "core/__init__.py": "",
        "core/spec.py": "def f():\n    from core.gates import g  # upward, hidden in a function\n",
        "core/kernels/__init__.py": "",
        "core/kernels/a.py": "from . import b\nfrom ..reference import r\n",
        "core/kernels/b.py": "from .a import x\n",
        "core/reference/__init__.py": "",
        "core/reference/r.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                "    from core.gates import g\n"),
        "core/gates/__init__.py": "",
        "core/gates/g.py": "import core.spec\nfrom cli import run\n",
        "cli/__init__.py": "",
        "cli/run.py": "from core.gates import g\n",
        "cli/lib.py": "from core.kernels import a\nfrom cli.inv import parts\n",
        "cli/inv/__init__.py": "from . import parts, verdict\n",     # a facade over a runner child
        "cli/inv/parts.py": "",
        "cli/inv/verdict.py": "import core.gates.g\n",
        "cli/other.py": "import cli.inv\n",                          # through the facade: upward
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    dirs = {"core": tmp_path / "core", "cli": tmp_path / "cli"}
    loops, up = check(tmp_path, dirs, core="core", runner=("cli.run", "cli.inv.verdict"))
    joined = "\n".join(loops)
    assert "core.kernels.a -> core.kernels.b -> core.kernels.a" in joined
    assert any("core.spec (core) imports core.gates.g (gates)" in u for u in up)
    assert any("core.kernels.a (kernels) imports core.reference.r (reference)" in u for u in up)
    assert any("core.gates.g (gates) imports cli.run (runner)" in u for u in up)
    assert not any(u.startswith("core/reference") for u in up), up
    # the gates -> runner -> gates loop is a cycle as well
    assert any("cli.run" in c and "core.gates.g" in c for c in loops)
    assert not any("cli.lib" in u for u in up), up                  # a child of the facade is its own layer
    assert any("cli.other (cli library) imports cli.inv (runner)" in u for u in up)
    assert not any(u.startswith("cli/inv/__init__") for u in up), up
