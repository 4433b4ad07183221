"""Equal contents in fixtures/ stored once (``fixturegen.links``): later copies are relative links to the first,
the folder a checkout holds stays under its budget, and a rebuild never changes a layout copy under it."""

from __future__ import annotations

import os
from pathlib import Path

from bloomery_cli.fixturegen.links import link_duplicates, materialize_links_into, real_bytes
from bloomery_cli.fixturegen.manifest import Manifest, verify
from bloomery_gates.gates.fixtures import FIXTURES

BUDGET = 40 * 1024 * 1024          # what fixtures/ may hold in a checkout


def test_the_bundled_fixtures_hold_each_content_once_and_fit_the_budget():
    man = Manifest.read(FIXTURES)
    assert real_bytes(FIXTURES) <= BUDGET
    slack = (FIXTURES / "MANIFEST.json").stat().st_size + 16 * 1024     # the manifest and the links, nothing twice
    assert real_bytes(FIXTURES) < man.stored_bytes + slack
    top = FIXTURES.resolve()
    links = [p for p in FIXTURES.rglob("*") if p.is_symlink()]
    assert links and all(p.resolve().is_relative_to(top) and not os.path.isabs(os.readlink(p)) for p in links)
    assert verify(FIXTURES) == []


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "fx"
    for rel, body in {"a/w.bin": b"weights", "b/w.bin": b"weights", "c/w.bin": b"other", "tok.json": b"t",
                      "a/tok.json": b"t"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(body)
    man = Manifest()
    man.add_files(root, [p for p in root.rglob("*") if p.is_file()])
    man.format = "bloomery-fixtures/1"
    man.write(root)
    return root


def test_later_copies_become_relative_links_to_the_first(tmp_path):
    root = _tree(tmp_path)
    assert os.readlink(root / "b/w.bin") == "../a/w.bin" and os.readlink(root / "a/tok.json") == "../tok.json"
    assert not (root / "a/w.bin").is_symlink() and not (root / "c/w.bin").is_symlink()
    assert (root / "b/w.bin").read_bytes() == b"weights" and verify(root) == []


def test_a_stale_manifest_entry_is_not_linked(tmp_path):
    root = _tree(tmp_path)
    (root / "c/w.bin").write_bytes(b"weights")                        # now equal to a/w.bin, listed as "other"
    man = Manifest.read(root)
    assert link_duplicates(root, man.files) == 0 and not (root / "c/w.bin").is_symlink()
    assert any("c/w.bin" in p for p in verify(root))


def test_a_link_out_of_the_folder_fails_verify(tmp_path):
    root = _tree(tmp_path)
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(b"weights")
    (root / "b/w.bin").unlink()
    (root / "b/w.bin").symlink_to(outside)
    assert any("a link out of" in p for p in verify(root))


def test_replacing_the_first_copy_leaves_its_linked_copies_their_bytes(tmp_path):
    root = _tree(tmp_path)
    assert materialize_links_into(root, "a") == [(root / "b/w.bin").resolve()]
    assert not (root / "b/w.bin").is_symlink() and (root / "b/w.bin").read_bytes() == b"weights"
    (root / "a/w.bin").write_bytes(b"retrained")                      # the rebuild of a/ no longer changes b/
    assert (root / "b/w.bin").read_bytes() == b"weights"
