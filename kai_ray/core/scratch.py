"""What modules of the core derive once per session and keep on it (node masks per selector and
toleration, typical GPU shapes), each under a typed key that its owner defines: the session
holds them without knowing or importing their types, and a reader gets back the type its owner
put in, checked by mypy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Key(Generic[T]):
    """A slot of the scratch, holding a T; compared by identity (one per owner, at module level)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Key({self.name!r})"


class Scratch:
    """The session's derived values by key. Not part of the session's state: the undo log does not
    restore it, so what is kept here, once made, stands for the rest of the session."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: dict[Key[Any], Any] = {}

    def __contains__(self, key: Key[Any]) -> bool:
        return key in self._values

    def get(self, key: Key[T]) -> T | None:
        value: T | None = self._values.get(key)
        return value

    def put(self, key: Key[T], value: T) -> T:
        self._values[key] = value
        return value

    def setdefault(self, key: Key[T], make: Callable[[], T]) -> T:
        """The value under `key`, made by `make()` and kept when there is none."""
        if key in self._values:
            value: T = self._values[key]
            return value
        return self.put(key, make())
