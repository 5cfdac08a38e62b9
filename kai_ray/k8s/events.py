"""Kubernetes events with CamelCase reasons, aggregated as kube-scheduler's event recorder does,
in bounded memory.

One Event per (object, reason, message): the scheduler says the same thing about a pending pod
every cycle, and a repeat is not a new Event. While it repeats, its Event is updated (count + 1,
a new lastTimestamp) at most once per `repeat_interval` (10 min): a pod pending for an hour
costs about 6 writes, not 3,600. While the queue is more than half full, such updates wait
(new Events go first) until the Event is 50 min old, so it is still rewritten before the API
server's event TTL (1 h) while the condition holds. An update answered 404 (the Event expired
or was deleted) writes it again. A changed message (same object and reason) is a new Event at
once.

Events are written off the caller's path: `emit` queues the event and returns; a few writer
threads post the queue in order of arrival; `flush` waits for the queue to drain. The queue
holds at most `max_queued` events: when it is full, the event being emitted is dropped and
counted (`dropped`), never waited for; the ones queued keep their place. A dropped (or failed)
event is tried again when the caller emits it again (the scheduler does, every cycle, while the
condition holds) after `retry_after` (30 s), doubling with each miss in a row up to the repeat
interval: under a sustained overload each waiting event is offered about once an interval, not
once a cycle.

What the recorder remembers per (object, reason) (message digest, Event name, count) is an LRU
of at most `max_remembered` keys, and a key not emitted for an hour is forgotten (its Event has
expired by then): never cleared wholesale, which would write every pending pod's Event again.

Counters for health, metrics and benchmarks (read them with `stats()`): `written` (API writes
that succeeded, creates and updates), `aggregated` (of those, updates of an existing Event),
`suppressed` (repeats not written: within the interval, while a write is queued, or an update
put off by a busy queue), `dropped` (the queue was full), `failed` (writes the API server
refused or did not answer), and `forgotten` (keys pushed out of a full memory). Memory: about
360 bytes per remembered key (200,000 keys by default: ~70 MiB at most)."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.k8s import rawapi

log = logging.getLogger(__name__)
COMPONENT = "kai-scheduler"
Obj = dict[str, Any]
EVENT_TTL = 3600.0  # the API server's --event-ttl default
# an Event is written again at least this long before it would expire
TTL_MARGIN = 600.0
REFRESH_BY = EVENT_TTL - TTL_MARGIN


@dataclass(slots=True)
class _Seen:
    """What the recorder knows of one (object, reason)."""

    digest: int  # of the message last emitted
    first: float  # wall-clock time it was first emitted (the Event's firstTimestamp)
    touched: float  # clock time it was last emitted (the LRU order and forgetting)
    due: float = 0.0  # clock time from which a repeat is written again
    wrote: float = 0.0  # clock time its Event was last written
    name: str | None = None  # of the Event written (None: not written yet)
    count: int = 1  # the Event's count as last queued
    busy: bool = False  # a write of it is queued or in flight
    misses: int = 0  # writes dropped or failed in a row (the retry backs off)


@dataclass(frozen=True, slots=True)
class _Write:
    key: tuple[str, str] | None  # None: not remembered (dedupe=False)
    digest: int
    namespace: str
    body: Obj  # the whole Event (created when `name` is None or the update gets 404)
    name: str | None  # the Event to update


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    def __init__(self, api: client.ApiClient, max_remembered: int = 200_000, writers: int = 4,
                 max_queued: int = 10_000, repeat_interval: float = 600.0,
                 retry_after: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`writers` threads post events (at least one); `repeat_interval` is capped so an
        Event is updated before the event TTL expires; `clock` (monotonic seconds) is for
        tests."""
        self.api = api
        self.max_remembered = max(1, max_remembered)
        self.writers = max(1, writers)
        self.repeat_interval = min(repeat_interval, REFRESH_BY)
        self.retry_after = retry_after
        self.clock = clock
        self.queue: queue.Queue[_Write] = queue.Queue(maxsize=max(1, max_queued))
        self._seen: OrderedDict[tuple[str, str], _Seen] = OrderedDict()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.written = 0
        self.aggregated = 0
        self.suppressed = 0
        self.dropped = 0
        self.failed = 0
        self.forgotten = 0

    # ------------------------------------------------------------------ the caller's side
    def emit(self, obj: Obj, reason: str, message: str, kind: str = "Pod",
             api_version: str = "v1", type_: str = "Normal", dedupe: bool = True) -> None:
        """Queue the event unless it repeats one written less than `repeat_interval` ago
        (`dedupe=False`: always a new Event, e.g. each eviction). Never blocks."""
        m = obj.get("metadata") or {}
        namespace = m.get("namespace") or "default"
        message = message[:1024]
        digest = hash(message)
        now, wall = self.clock(), time.time()
        key: tuple[str, str] | None = None
        name, count, first = None, 1, wall
        if dedupe:
            # objects without a uid (a Problem's) are told apart by kind and name
            key = (m.get("uid") or f"{kind}/{namespace}/{m.get('name')}", reason)
            with self._lock:
                self._forget(now)
                seen = self._seen.get(key)
                if seen is not None and seen.digest == digest:
                    seen.touched = now
                    self._seen.move_to_end(key)
                    if seen.busy or now < seen.due or (
                            seen.name and now - seen.wrote < REFRESH_BY
                            and 2 * self.queue.qsize() > self.queue.maxsize):
                        self.suppressed += 1  # a busy queue: new Events before updates
                        return
                    if seen.name:  # a repeat: the same Event, one more
                        seen.count += 1
                else:  # new, or a changed message: a new Event
                    seen = _Seen(digest, first=wall, touched=now)
                    self._remember(key, seen)
                seen.busy, seen.due = True, now + self.repeat_interval
                name, count, first = seen.name, seen.count, seen.first
        involved = {"kind": kind, "apiVersion": api_version, "name": m.get("name"),
                    "namespace": namespace, "uid": m.get("uid"),
                    "resourceVersion": m.get("resourceVersion")}
        body: Obj = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{m.get('name', 'obj')}.", "namespace": namespace},
            "involvedObject": {k: v for k, v in involved.items() if v is not None},
            "reason": reason, "message": message, "type": type_,
            "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
            "reportingInstance": COMPONENT, "firstTimestamp": _rfc3339(first),
            "lastTimestamp": _rfc3339(wall), "count": count}
        self._start_writers()
        try:
            self.queue.put_nowait(_Write(key, digest, namespace, body, name))
        except queue.Full:
            # the new one goes: the queued ones were emitted first, and a condition that
            # still holds is emitted again by the next cycle (after `retry_after`)
            with self._lock:
                self.dropped += 1
            self._not_written(key, digest, name)

    def _remember(self, key: tuple[str, str], seen: _Seen) -> None:
        self._seen[key] = seen
        self._seen.move_to_end(key)
        while len(self._seen) > self.max_remembered:
            self._seen.popitem(last=False)
            if not self.forgotten:
                log.warning("event memory full (%d objects): the least recently emitted are "
                            "forgotten; a repeat of one is written as a new Event",
                            self.max_remembered)
            self.forgotten += 1

    def _forget(self, now: float) -> None:
        """Drop keys not emitted for longer than the event TTL: their Events have expired.
        The LRU's front is the least recently emitted, so this looks at few keys."""
        while self._seen:
            seen = next(iter(self._seen.values()))
            if now - seen.touched < EVENT_TTL or seen.busy:
                return
            self._seen.popitem(last=False)

    def _not_written(self, key: tuple[str, str] | None, digest: int, name: str | None) -> None:
        """A write was dropped or failed: an emit after `retry_after` (doubled per miss in a
        row, at most the repeat interval) tries again."""
        if key is None:
            return
        with self._lock:
            seen = self._seen.get(key)
            if seen is None or seen.digest != digest:
                return  # forgotten, or the message changed meanwhile: that one counts
            seen.busy = False
            backoff = self.retry_after * 2 ** min(seen.misses, 16)
            seen.due = self.clock() + min(backoff, max(self.retry_after, self.repeat_interval))
            seen.misses += 1
            if name and seen.name == name:
                seen.count -= 1  # the Event still has the count before this update

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued event is written (or `timeout`); True when drained."""
        with self.queue.all_tasks_done:
            return self.queue.all_tasks_done.wait_for(
                lambda: self.queue.unfinished_tasks == 0, timeout)

    def queue_length(self) -> int:
        return self.queue.qsize()

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"queued": self.queue.qsize(), "remembered": len(self._seen),
                    "written": self.written, "aggregated": self.aggregated,
                    "suppressed": self.suppressed, "dropped": self.dropped,
                    "failed": self.failed, "forgotten": self.forgotten}

    # ------------------------------------------------------------------ the writers
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
            item = self.queue.get()
            try:
                self._write(item)
            except Exception:  # a writer thread must not die
                log.exception("event writer")
            finally:
                self.queue.task_done()

    def _write(self, w: _Write) -> None:
        body = w.body
        try:
            name = w.name
            if name:
                try:
                    rawapi.patch_event(self.api, w.namespace, name,
                                       {"count": body["count"],
                                        "lastTimestamp": body["lastTimestamp"]})
                except ApiException as e:
                    if e.status != 404:
                        raise
                    name = None  # expired: written again, with its count and first time
            updated = bool(name)
            if not name:
                name = rawapi.create_event_named(self.api, w.namespace, body)
        except Exception as e:  # best effort; never fail a cycle for one
            with self._lock:
                self.failed += 1
            where = (body["reason"], w.namespace, body["involvedObject"].get("name"))
            if isinstance(e, ApiException):
                # the API's message tells a missing RBAC grant from a namespace being deleted
                log.warning("event %s on %s/%s not written: %s %s%s", *where, e.status,
                            e.reason, f": {_message(e)}" if _message(e) else "")
            elif isinstance(e, OSError):
                log.warning("event %s on %s/%s not written: %s", *where, e)
            else:
                log.warning("event %s on %s/%s not written: %s: %s", *where,
                            type(e).__name__, e)
            self._not_written(w.key, w.digest, w.name)
            return
        with self._lock:
            self.written += 1
            self.aggregated += updated
            seen = self._seen.get(w.key) if w.key is not None else None
            if seen is not None and seen.digest == w.digest:
                seen.name = name or None  # an answer without a name: created again later
                seen.busy = False
                seen.misses = 0
                seen.wrote = self.clock()


def _message(e: ApiException) -> str:
    """The `message` of an API error's Status body, cut short ("" when it has none)."""
    try:
        body = json.loads(e.body) if isinstance(e.body, str | bytes) and e.body else {}
    except ValueError:
        return ""
    return str(body.get("message") or "")[:300] if isinstance(body, dict) else ""
