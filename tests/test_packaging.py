"""pyproject.toml lists its packages by hand (package-dir maps kernels/, reference/ and gates/ under bloomery_gates):
a folder with an __init__.py that the list lacks is missing from a non-editable install."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def unlisted(root: Path) -> list[str]:
    """Packages on disk (under each mapped folder) that [tool.setuptools] packages does not list."""
    conf = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set()
    for name, folder in conf["package-dir"].items():
        for init in (root / folder).rglob("__init__.py"):
            found.add(".".join([name, *init.parent.relative_to(root / folder).parts]))
    return sorted(found - set(conf["packages"]))


def test_every_package_is_listed():
    assert unlisted(ROOT) == []


def test_the_check_sees_an_unlisted_package(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("")
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools]\npackage-dir = {"pkg" = "pkg"}\npackages = ["pkg"]\n')
    assert unlisted(tmp_path) == ["pkg.sub"]
