"""A tiny list-then-watch cache of one cluster-scoped kind, kept in a background thread.

The admission webhook reads Queues (name -> parentQueue) and Namespaces (name -> labels) on every
pod creation; asking the API server each time would put a round trip inside the API server's own
request. ``ListWatchCache`` lists once, then follows a watch from the list's resourceVersion, and
lists again when the watch breaks (410 Gone, network errors).

    queues = ListWatchCache("queues", lambda **kw: custom.list_cluster_custom_object(
        *QUEUE.gvp, **kw), value=lambda q: q["spec"].get("parentQueue"))
    queues.start(); queues.wait_synced(10); queues.items()  # {"team-a": "department-1", ...}

``list_fn(**kwargs)`` is a list call of the ``kubernetes`` client (a lambda around
``CoreV1Api.list_namespace`` or ``CustomObjectsApi.list_cluster_custom_object``): it is called
with ``_preload_content=False`` so that objects are plain JSON dicts for every kind.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from kubernetes import watch

log = logging.getLogger(__name__)

ListFn = Callable[..., Any]


class ListWatchCache:
    """``{metadata.name: value(obj)}`` for every object of one kind, kept current by a watch."""

    def __init__(self, kind: str, list_fn: ListFn,
                 value: Callable[[Mapping[str, Any]], Any] = lambda obj: obj,
                 watch_timeout: int = 10, retry_seconds: float = 1.0) -> None:
        self.kind = kind
        self._list = list_fn
        self._value = value
        self._watch_timeout = watch_timeout  # bounds how long stop() waits for the thread
        self._retry = retry_seconds
        self._items: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: watch.Watch | None = None
        self.last_error: str | None = None

    def start(self) -> ListWatchCache:
        self._thread = threading.Thread(target=self._run, name=f"listwatch-{self.kind}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 15.0) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def items(self) -> dict[str, Any]:
        """A copy of the current contents."""
        with self._lock:
            return dict(self._items)

    # -- internals ----------------------------------------------------------------------------
    def _relist(self) -> str:
        response = self._list(_preload_content=False)
        listing: dict[str, Any] = orjson.loads(response.data)
        items = {o["metadata"]["name"]: self._value(o) for o in listing.get("items") or []}
        with self._lock:
            self._items = items
        self._synced.set()
        return str((listing.get("metadata") or {}).get("resourceVersion") or "")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                rv = self._relist()
                self._follow(rv)
            except Exception as e:  # the API server may be restarting: list again shortly
                if self._stop.is_set():
                    return  # stop() broke the watch's connection
                self.last_error = f"{type(e).__name__}: {e}"
                log.warning("list/watch of %s failed (%s); retrying", self.kind, self.last_error)
                self._stop.wait(self._retry)

    def _follow(self, rv: str) -> None:
        """Apply watch events until the watch ends badly (then the caller lists again)."""
        while not self._stop.is_set():
            self._watch = watch.Watch()
            try:
                for event in self._watch.stream(self._list, resource_version=rv,
                                                timeout_seconds=self._watch_timeout,
                                                allow_watch_bookmarks=True):
                    obj = event["raw_object"]  # errors were raised by the stream already
                    kind = event["type"]
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if kind == "BOOKMARK":
                        continue
                    name = obj["metadata"]["name"]
                    with self._lock:
                        if kind == "DELETED":
                            self._items.pop(name, None)
                        else:
                            self._items[name] = self._value(obj)
            finally:
                self._watch.stop()

