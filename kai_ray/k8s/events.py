"""Kubernetes events with CamelCase reasons, deduplicated: the same reason and message on the
same object is written once, not once per cycle.

Events are written off the caller's path, as kube-scheduler's event broadcaster does: `emit`
queues the event and returns; a few writer threads post the queue in order of arrival (every
queued event is written, none is dropped). `flush` waits for the queue to drain."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.k8s import convert, rawapi

log = logging.getLogger(__name__)
COMPONENT = "kai-scheduler"
Obj = dict[str, Any]


class EventRecorder:
    def __init__(self, api: client.ApiClient, max_remembered: int = 50_000, writers: int = 4
                 ) -> None:
        """`writers` threads post events (at least one)."""
        self.api = api
        self.seen: dict[tuple[str, str], str] = {}
        self.max_remembered = max_remembered
        self.writers = max(1, writers)
        self.queue: queue.Queue[tuple[str, Obj]] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.written = 0

    def emit(self, obj: Obj, reason: str, message: str, kind: str = "Pod",
             api_version: str = "v1", type_: str = "Normal", dedupe: bool = True) -> None:
        m = obj.get("metadata") or {}
        uid = m.get("uid", m.get("name", ""))
        key = (uid, reason)
        with self._lock:
            if dedupe and self.seen.get(key) == message:
                return
            if len(self.seen) > self.max_remembered:
                self.seen.clear()
            self.seen[key] = message
        now = convert.now_rfc3339()
        namespace = m.get("namespace") or "default"
        involved = {"kind": kind, "apiVersion": api_version, "name": m.get("name"),
                    "namespace": namespace, "uid": m.get("uid"),
                    "resourceVersion": m.get("resourceVersion")}
        body: Obj = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{m.get('name', 'obj')}.", "namespace": namespace},
            "involvedObject": {k: v for k, v in involved.items() if v is not None},
            "reason": reason, "message": message[:1024], "type": type_,
            "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
            "reportingInstance": COMPONENT, "firstTimestamp": now, "lastTimestamp": now,
            "count": 1}
        self._start_writers()
        self.queue.put((namespace, body))

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued event is written (or `timeout`); True when drained."""
        with self.queue.all_tasks_done:
            return self.queue.all_tasks_done.wait_for(
                lambda: self.queue.unfinished_tasks == 0, timeout)

    def _start_writers(self) -> None:
        if self._threads:
            return
        with self._lock:
            while len(self._threads) < self.writers:
                t = threading.Thread(target=self._run, daemon=True,
                                     name=f"events-{len(self._threads)}")
                t.start()
                self._threads.append(t)

    def _run(self) -> None:
        while True:
            namespace, body = self.queue.get()
            try:
                self._write(namespace, body)
            finally:
                self.queue.task_done()

    def _write(self, namespace: str, body: Obj) -> None:
        try:
            rawapi.create_event(self.api, namespace, body)
            self.written += 1
        except (ApiException, OSError) as e:  # best effort; never fail a cycle for one
            log.warning("event %s on %s/%s not written: %s", body["reason"], namespace,
                        body["involvedObject"].get("name"), getattr(e, "status", e))
        except Exception:  # a writer thread must not die
            log.exception("event %s on %s/%s not written", body["reason"], namespace,
                          body["involvedObject"].get("name"))
