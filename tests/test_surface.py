"""The surface (issue 24): the README's size, its links and the docs' links; the design notes the code cites are
in the repository; results/ has no PNG at its top; a just recipe per registered gate; `bloomery --version` and
`bloomery gate list --json`."""

from __future__ import annotations

import json
import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from typer.testing import CliRunner

from bloomery_cli.cli import app

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# a design note named in text: a bare name (no folder before it: in docs/ or at the root), or a path
CITED = re.compile(r"(?<![\w<>-])((?:[\w.-]+/)*)([A-Z][A-Z0-9_]+\.md)\b")
SCANNED = ("README.md", "justfile", "pyproject.toml", "docs", "bloomery_cli", "gates", "kernels", "reference", "tests",
           ".ci")
SUFFIXES = {".py", ".md", ".sh", ".toml", ""}
PER_FOLDER = ("README.md", "NOTE.md")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, len(lines)
    long = [i + 1 for i, line in enumerate(lines) if len(line) > 120 and not line.startswith("|")]
    assert not long, f"README.md lines over 120 characters (not table rows): {long}"


def test_relative_links_exist():
    broken = []
    for md in markdown_files():
        for target in LINK.findall(md.read_text()):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            if path and not (md.parent / path).exists():
                broken.append(f"{md.relative_to(ROOT)}: {target}")
    assert not broken, broken


def scanned_files() -> list[Path]:
    out = []
    for name in SCANNED:
        p = ROOT / name
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out += [f for f in sorted(p.rglob("*")) if f.is_file() and f.suffix in SUFFIXES
                    and "__pycache__" not in f.parts]
    return out


def test_every_cited_design_note_is_in_the_repository():
    missing = []
    for f in scanned_files():
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for folder, name in CITED.findall(text):
            if folder:                  # a path: from the root, the citing file's folder, or results/
                hits = [ROOT / folder / name, f.parent / folder / name, ROOT / "results" / folder / name]
            elif name in PER_FOLDER:    # README.md / NOTE.md: the file of a folder, e.g. results/h200/real/NOTE.md
                hits = [ROOT / name, *(ROOT / "results").rglob(name)]
            else:
                hits = [ROOT / "docs" / name, ROOT / name]
            if not any(h.is_file() for h in hits):
                missing.append(f"{f.relative_to(ROOT)}: {folder}{name}")
    assert not missing, sorted(set(missing))


def test_the_design_notes_the_code_cites_are_in_docs():
    for name in ("DRAFTERS.md", "FAMILIES.md", "FAMILIES_MOE.md", "ANCHORS.md", "ARCHITECTURE.md", "CONTRACT.md",
                 "ENGINES.md"):
        assert (ROOT / "docs" / name).is_file(), name
    outside = "shared" + "/design"          # the notes' old home outside the repository
    for f in scanned_files():
        assert outside not in f.read_text(encoding="utf-8", errors="replace"), f


def test_no_png_at_the_top_of_results():
    assert not list((ROOT / "results").glob("*.png"))


def just_recipes() -> dict[str, str]:
    """recipe name -> its body (the indented lines below it)."""
    recipes: dict[str, str] = {}
    name = None
    for line in (ROOT / "justfile").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_-]+)(?:\s[^:=]*)?:(?!=)", line)
        if m:
            name = m.group(1)
            recipes[name] = ""
        elif name and line.startswith((" ", "\t")):
            recipes[name] += line.strip() + "\n"
        elif line.strip() and not line.startswith("#"):
            name = None
    return recipes


def test_every_registered_gate_has_a_just_recipe():
    from bloomery_gates.gates import GATES

    recipes = just_recipes()
    assert len(GATES) >= 14
    for gate in GATES:
        body = recipes.get(f"gate-{gate}")
        assert body is not None, f"justfile: no recipe gate-{gate}"
        assert f"bloomery gate run {gate} " in body, body


def test_version():
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0, r.output
    try:
        expected = version("bloomery-gates")
    except PackageNotFoundError:
        expected = "unknown"
    assert r.output.strip().startswith(f"bloomery-gates {expected}")


def test_gate_list_json():
    from bloomery_gates.gates import GATES

    r = CliRunner().invoke(app, ["gate", "list", "--json"])
    assert r.exit_code == 0, r.output
    gates = json.loads(r.output)
    assert [g["name"] for g in gates] == list(GATES)
    for g in gates:
        reg = GATES[g["name"]]
        assert (g["family"], g["draft_kind"], g["n"]) == (reg.family, reg.draft_kind, reg.n)
        assert g["target"] and g["draft"] and g["about"] == reg.about


def test_help_paragraphs_are_wrapped_by_the_terminal():
    """typer's rich help keeps a paragraph's newlines: a docstring wrapped at 120 columns in the source broke its
    sentences mid-line at 80. Every command's help is paragraphs of one line each (bloomery_cli.helptext), and
    `gate run --help` at 80 columns no longer breaks a line where its docstring's source does."""
    import typer

    def walk(cmd, path):
        help_text = cmd.help or ""
        yield path, [p for p in help_text.split("\n\n") if "\n" in p.strip()]
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, f"{path} {name}")

    broken = {path: bad for path, bad in walk(typer.main.get_command(app), "bloomery") if bad}
    assert not broken, broken
    out = CliRunner().invoke(app, ["gate", "run", "--help"], terminal_width=80).output
    assert any("`bloomery engine build`" in line for line in out.splitlines()), out   # the source breaks it there
