"""Typed, named access to config values (HF config.json objects or GGUF metadata).

Every problem is a ``BadConfig`` whose message names the file and the key and says what was expected.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bloomery_gates.errors import BadConfig

_MISSING: Any = object()


class Cfg:
    """A config mapping plus where it came from; ``prefix`` only spells nested keys in messages."""

    def __init__(self, data: Mapping[str, Any], where: str | Path, prefix: str = ""):
        self.data = data
        self.where = str(where)
        self.prefix = prefix

    def sub(self, key: str) -> Cfg:
        """A nested object (``dflash_config``); absent or null is an empty one."""
        value = self.get(key, None)
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise self.bad(key, f"expected an object, got {value!r}")
        return Cfg(value, self.where, f"{self.prefix}{key}.")

    def bad(self, key: str, problem: str) -> BadConfig:
        return BadConfig(f"{self.where}: key {self.prefix}{key}", problem)

    def get(self, key: str, default: Any = _MISSING, what: str = "") -> Any:
        """The raw value; a missing or null key with no default is a ``BadConfig``."""
        value = self.data.get(key)
        if value is None:
            if default is _MISSING:
                raise self.bad(key, "missing" + (f"; expected {what}" if what else ""))
            return default
        return value

    def int(self, key: str, default: Any = _MISSING, what: str = "an integer",
            minimum: int | None = 1, maximum: int | None = None, why: str = "") -> int:
        """An integer (a float with no fraction is taken), ``minimum <= value <= maximum``; ``why`` says
        where the maximum comes from (``the checkpoint stores 2 layers``) in the message."""
        value = self.get(key, default, what)
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise self.bad(key, f"{value!r}; expected {what}")
        if minimum is not None and value < minimum:
            raise self.bad(key, f"{value}; expected {what} >= {minimum}")
        if maximum is not None and value > maximum:
            raise self.bad(key, f"{value}; expected {what} <= {maximum}" + (f" ({why})" if why else ""))
        return value

    def int_opt(self, key: str, **checks: Any) -> int | None:
        """``int(key, **checks)``, or None where the key is missing or null (an optional field)."""
        return None if self.data.get(key) is None else self.int(key, **checks)

    def float_opt(self, key: str, **checks: Any) -> float | None:
        """``float(key, **checks)``, or None where the key is missing or null (an optional field)."""
        return None if self.data.get(key) is None else self.float(key, **checks)

    def float(self, key: str, default: Any = _MISSING, what: str = "a number",
              positive: bool = True) -> float:
        """A finite number (NaN and +-Infinity, which Python's JSON reader accepts, are refused), > 0
        unless ``positive`` is false."""
        value = self.get(key, default, what)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.bad(key, f"{value!r}; expected {what}")
        try:
            number = float(value)
        except OverflowError:                        # an integer past the float range
            number = math.inf
        if not math.isfinite(number):
            raise self.bad(key, f"{value}; expected {what}, not NaN or infinite")
        if positive and not number > 0:
            raise self.bad(key, f"{value}; expected {what} > 0")
        return number

    def rope_base(self, key: str, default: Any = _MISSING) -> float:
        """A RoPE base theta: finite and > 1 (f_i = theta^(-2i/d) must fall with i; at theta = 1 every channel
        turns alike and yarn's correction range, d ln(L0 / 2 pi b) / (2 ln theta), divides by zero)."""
        theta = self.float(key, default, what="the RoPE base")
        if not theta > 1.0:
            raise self.bad(key, f"{theta}; expected the RoPE base > 1")
        return theta

    def bool(self, key: str, default: Any = _MISSING) -> bool:
        value = self.get(key, default, "true or false")
        if not isinstance(value, bool):
            raise self.bad(key, f"{value!r}; expected true or false")
        return value

    def int_list(self, key: str, what: str = "a list of integers") -> list[int]:
        value = self.get(key, what=what)
        ok = isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        if not ok:
            raise self.bad(key, f"{value!r}; expected {what}")
        return list(value)
