"""Run callbacks just before and just after a top-level module is imported (stdlib only).

The Ray helper arms these in each worker so a framework imported inside a task or actor gets its
cap at the last moment that still counts: JAX and CuPy read their env vars later, so they get them
before their import; PyTorch and TensorFlow are configured through their API right after import,
before any tensor exists.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

Before = Callable[[str], None]
After = Callable[[ModuleType], None]


class _CallbackLoader(importlib.abc.Loader):
    """Delegates to the real loader and calls the after-callbacks once the module has run."""

    def __init__(self, loader: Any, after: Sequence[After]) -> None:
        self._loader = loader
        self._after = list(after)

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        # leave the module looking as if it was imported normally
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        for callback in self._after:
            callback(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.before: dict[str, list[Before]] = {}
        self.after: dict[str, list[After]] = {}
        self._busy = threading.local()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in self.before and fullname not in self.after:
            return None
        busy: set[str] = getattr(self._busy, "names", set())
        if fullname in busy:
            return None  # our own lookup below
        self._busy.names = busy | {fullname}
        try:
            for callback in self.before.get(fullname, []):
                callback(fullname)
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.names = busy
        if spec is None or spec.loader is None or not self.after.get(fullname):
            return spec
        spec.loader = _CallbackLoader(spec.loader, self.after[fullname])
        return spec


_finder: PostImportFinder | None = None
_lock = threading.Lock()


def finder() -> PostImportFinder:
    """The process's finder, first on sys.meta_path."""
    global _finder
    with _lock:
        if _finder is None:
            _finder = PostImportFinder()
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
        return _finder


def on_import(name: str, *, before: Before | None = None, after: After | None = None) -> None:
    """Call `before(name)` ahead of `import name` and `after(module)` once it has executed.

    Only future imports trigger: the caller handles a module already in sys.modules.
    """
    f = finder()
    if before is not None and before not in f.before.setdefault(name, []):
        f.before[name].append(before)
    if after is not None and after not in f.after.setdefault(name, []):
        f.after[name].append(after)


def is_installed(name: str) -> bool:
    """Whether `name` can be imported, without triggering this module's callbacks."""
    if name in sys.modules:
        return True
    f = finder()
    busy: set[str] = getattr(f._busy, "names", set())
    f._busy.names = busy | {name}
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
    finally:
        f._busy.names = busy
