"""The engine is never built: bad input is refused before the first allocation sized by the run."""

from __future__ import annotations

import dataclasses

from bloomery_gates import registry


def boom(*args, **kwargs):
    raise AssertionError("the engine was built: the bad input was not refused before allocating")


def never_built(monkeypatch) -> None:
    """Every registered family's engine role names ``boom`` for the test."""
    for name, fam in list(registry.FAMILIES.items()):
        if fam.has("engine"):
            code = {**fam.code, "engine": "never_built:boom"}
            monkeypatch.setitem(registry.FAMILIES, name, dataclasses.replace(fam, code=code))
