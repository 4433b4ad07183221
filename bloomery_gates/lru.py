"""A least-recently-used store bounded by bytes: what the streamed readers keep between reads.

An entry larger than the budget is never kept; putting one past the budget evicts the least recently
used entries until the rest fit. ``size`` says what an entry costs (``nbytes`` for numpy arrays,
``numel * element_size`` for torch tensors). Pure Python: the float64 reference uses it too.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")


class ByteLRU(Generic[V]):
    """name -> value, at most ``budget`` bytes of values held."""

    def __init__(self, budget: int, size: Callable[[V], int]):
        self.budget = budget
        self._size = size
        self._items: OrderedDict[str, V] = OrderedDict()
        self.held = 0

    def get(self, name: str) -> V | None:
        hit = self._items.get(name)
        if hit is not None:
            self._items.move_to_end(name)
        return hit

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __len__(self) -> int:
        return len(self._items)

    def put(self, name: str, value: V) -> None:
        n = self._size(value)
        if n > self.budget or name in self._items:
            return
        self._items[name] = value
        self.held += n
        while self.held > self.budget:
            _, old = self._items.popitem(last=False)
            self.held -= self._size(old)

    def clear(self) -> None:
        self._items.clear()
        self.held = 0
