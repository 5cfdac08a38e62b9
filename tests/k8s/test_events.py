"""The event recorder in bounded memory (kai_ray.k8s.events), against a local HTTP fake of the
events API: repeats aggregated into one Event (count, lastTimestamp) at most once per interval,
a bounded queue that drops and counts instead of blocking, and an LRU memory. The same against
a real API server: tests/integration/test_events_aggregation.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from kubernetes import client

from kai_ray.k8s import events as events_module
from kai_ray.k8s.events import EVENT_TTL, EventRecorder
from tests.k8s.local_http import JsonHandler, serving

EVENTS = "/api/v1/namespaces/ns/events"


class _Events(JsonHandler):
    """Creates answer with the Event named `<generateName><n>`; updates of a name in `gone`
    answer 404; `status` (when set) answers every request; `gate` holds every answer."""

    hits: ClassVar[list[tuple[str, str, dict]]] = []
    gone: ClassVar[set[str]] = set()
    status: ClassVar[int | None] = None
    gate: ClassVar[threading.Event] = threading.Event()
    lock = threading.Lock()

    def answer(self, body: dict) -> tuple[int, bytes]:
        type(self).gate.wait(30)
        with type(self).lock:
            type(self).hits.append((self.command, self.path, body))
            n = len(type(self).hits)
        if type(self).status is not None:
            return type(self).status or 500, b'{"kind": "Status"}'
        if self.command == "PATCH" and self.path.rsplit("/", 1)[1] in type(self).gone:
            return 404, b'{"kind": "Status", "code": 404}'
        if self.command == "POST":
            name = f"{body['metadata']['generateName']}{n}"
            return 201, json.dumps({**body, "metadata": {**body["metadata"],
                                                          "name": name}}).encode()
        return 200, b"{}"


@pytest.fixture
def api() -> Iterator[client.ApiClient]:
    _Events.hits, _Events.gone, _Events.status = [], set(), None
    _Events.gate.set()
    with serving(_Events) as url:
        cfg = client.Configuration()
        cfg.host = url
        yield client.ApiClient(cfg)
    _Events.gate.set()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _pod(i: int = 0) -> dict[str, Any]:
    return {"metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"u{i}"}}


def _writes() -> list[tuple[str, str, dict]]:
    return list(_Events.hits)


def _recorder(api: client.ApiClient, clock: Clock, **kw: Any) -> EventRecorder:
    kw.setdefault("writers", 1)  # requests in the order emitted, so Event names are known
    return EventRecorder(api, clock=clock, repeat_interval=600, **kw)


def test_a_repeat_is_one_event_updated_at_most_once_per_interval(api: client.ApiClient) -> None:
    clock = Clock()
    rec = _recorder(api, clock)
    rec.emit(_pod(), "Unschedulable", "no node has 16 GPUs", type_="Warning")
    assert rec.flush(5)
    ((method, path, body),) = _writes()
    assert (method, path, body["count"]) == ("POST", EVENTS, 1)
    created = f"p0.{1}"
    for _ in range(599):  # a cycle a second for the rest of the interval: nothing written
        clock.now += 1
        rec.emit(_pod(), "Unschedulable", "no node has 16 GPUs", type_="Warning")
    assert rec.flush(5) and len(_writes()) == 1 and rec.suppressed == 599
    clock.now += 1
    rec.emit(_pod(), "Unschedulable", "no node has 16 GPUs", type_="Warning")
    assert rec.flush(5)
    method, path, patch = _writes()[1]
    assert (method, path) == ("PATCH", f"{EVENTS}/{created}")
    assert patch["count"] == 2 and set(patch) == {"count", "lastTimestamp"}
    assert patch["lastTimestamp"] >= body["firstTimestamp"]
    assert (rec.written, rec.aggregated) == (2, 1)


def test_an_hour_pending_costs_about_six_writes(api: client.ApiClient) -> None:
    clock = Clock()
    rec = _recorder(api, clock)
    for _ in range(3600):
        rec.emit(_pod(), "Unschedulable", "no room")
        rec.flush(5)
        clock.now += 1
    assert [m for m, _, _ in _writes()] == ["POST"] + ["PATCH"] * 5
    assert [b["count"] for _, _, b in _writes()] == [1, 2, 3, 4, 5, 6]


def test_an_update_answered_404_writes_the_event_again(api: client.ApiClient) -> None:
    clock = Clock()
    rec = _recorder(api, clock)
    rec.emit(_pod(), "Unschedulable", "no room")
    rec.flush(5)
    first = _writes()[0][2]
    _Events.gone.add("p0.1")  # expired (or deleted)
    clock.now += 601
    rec.emit(_pod(), "Unschedulable", "no room")
    rec.flush(5)
    (m1, p1, _), (m2, p2, again) = _writes()[1:]
    assert (m1, p1, m2, p2) == ("PATCH", f"{EVENTS}/p0.1", "POST", EVENTS)
    assert again["count"] == 2 and again["firstTimestamp"] == first["firstTimestamp"]
    clock.now += 601  # the next update goes to the new Event
    rec.emit(_pod(), "Unschedulable", "no room")
    rec.flush(5)
    assert _writes()[-1][:2] == ("PATCH", f"{EVENTS}/p0.3")
    assert _writes()[-1][2]["count"] == 3


def test_a_changed_message_is_a_new_event_at_once(api: client.ApiClient) -> None:
    clock = Clock()
    rec = _recorder(api, clock)
    rec.emit(_pod(), "Unschedulable", "no room")
    rec.emit(_pod(), "Unschedulable", "over quota")
    rec.emit(_pod(), "Scheduled", "no room")  # another reason: its own Event
    rec.flush(5)
    assert [(m, b["reason"], b["message"]) for m, _, b in _writes()] == [
        ("POST", "Unschedulable", "no room"), ("POST", "Unschedulable", "over quota"),
        ("POST", "Scheduled", "no room")]
    clock.now += 601  # the changed one is the Event updated from now on
    rec.emit(_pod(), "Unschedulable", "over quota")
    rec.flush(5)
    assert _writes()[-1][:2] == ("PATCH", f"{EVENTS}/p0.2")


def test_without_dedupe_every_event_is_written(api: client.ApiClient) -> None:
    rec = _recorder(api, Clock())
    for _ in range(3):
        rec.emit(_pod(), "Preempted", "evicted by reclaim", dedupe=False)
    rec.flush(5)
    assert [m for m, _, _ in _writes()] == ["POST"] * 3


def test_the_queue_is_bounded_drops_the_new_event_and_never_blocks(
        api: client.ApiClient) -> None:
    clock = Clock()
    rec = _recorder(api, clock, max_queued=5, writers=1)
    _Events.gate.clear()  # the API server answers nothing yet
    try:
        rec.emit(_pod(0), "Unschedulable", "no room")
        deadline = time.monotonic() + 5
        while rec.queue_length() and time.monotonic() < deadline:
            time.sleep(0.01)  # the writer took it and waits for the answer
        start = time.monotonic()
        for i in range(1, 20):
            rec.emit(_pod(i), "Unschedulable", "no room")
        assert time.monotonic() - start < 1  # emit did not wait
        assert rec.queue_length() == 5 and rec.dropped == 14
        assert rec.stats()["queued"] == 5
    finally:
        _Events.gate.set()
    assert rec.flush(10)
    written = sorted(b["involvedObject"]["name"] for _, _, b in _writes())
    assert written == sorted(f"p{i}" for i in range(6))  # the first six; the rest dropped
    # a dropped one is tried again when emitted after `retry_after`, not at once
    rec.emit(_pod(19), "Unschedulable", "no room")
    rec.flush(5)
    assert len(_writes()) == 6 and rec.suppressed == 1
    clock.now += 31
    for i in range(6, 20):
        rec.emit(_pod(i), "Unschedulable", "no room")
        rec.flush(5)  # one at a time: none dropped this time
    assert len(_writes()) == 20 and rec.dropped == 14


def test_memory_is_an_lru_of_bounded_size_never_cleared(api: client.ApiClient) -> None:
    clock = Clock()
    rec = _recorder(api, clock, max_remembered=100)
    for i in range(300):
        rec.emit(_pod(i), "Unschedulable", "no room")
    rec.flush(10)
    assert len(_writes()) == 300
    assert rec.stats()["remembered"] == 100 and rec.forgotten == 200
    for i in range(200, 300):  # the most recent 100 are all still known: nothing written
        rec.emit(_pod(i), "Unschedulable", "no room")
    rec.flush(5)
    assert len(_writes()) == 300 and rec.suppressed == 100
    rec.emit(_pod(200), "Unschedulable", "no room")  # touched: now the most recent
    rec.emit(_pod(0), "Unschedulable", "no room")  # forgotten: a new Event
    rec.flush(5)
    assert len(_writes()) == 301 and _writes()[-1][0] == "POST"
    assert list(rec._seen)[-2:] == [("u200", "Unschedulable"), ("u0", "Unschedulable")]
    assert ("u201", "Unschedulable") not in rec._seen  # the least recent went


def test_keys_not_emitted_for_an_hour_are_forgotten(api: client.ApiClient) -> None:
    clock = Clock()
    rec = _recorder(api, clock)
    for i in range(10):
        rec.emit(_pod(i), "Unschedulable", "no room")
    rec.flush(5)
    clock.now += EVENT_TTL / 2
    rec.emit(_pod(0), "Unschedulable", "no room")  # still pending: an update
    rec.flush(5)
    clock.now += EVENT_TTL / 2 + 1
    rec.emit(_pod(0), "Unschedulable", "no room")
    assert rec.stats()["remembered"] == 1  # the other nine pods' Events have expired


def test_objects_without_uid_are_told_apart_by_name(api: client.ApiClient) -> None:
    rec = _recorder(api, Clock())
    for name in ("q1", "q2"):
        obj = {"metadata": {"name": name, "namespace": None, "uid": None}}
        rec.emit(obj, "InvalidSpec", "spec.priority: must be an integer", kind="Queue")
        rec.emit(obj, "InvalidSpec", "spec.priority: must be an integer", kind="Queue")
    rec.flush(5)
    assert sorted(b["involvedObject"]["name"] for _, _, b in _writes()) == ["q1", "q2"]


def test_a_refused_write_is_retried_and_writers_survive(api: client.ApiClient,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    rec = _recorder(api, clock, writers=2)
    _Events.status = 500
    rec.emit(_pod(), "Unschedulable", "no room")
    rec.flush(5)
    assert (rec.failed, rec.written) == (1, 0)
    _Events.status = None
    rec.emit(_pod(), "Unschedulable", "no room")  # not yet: after `retry_after`
    rec.flush(5)
    assert len(_writes()) == 1
    clock.now += 31
    rec.emit(_pod(), "Unschedulable", "no room")
    rec.flush(5)
    assert rec.written == 1 and _writes()[-1][0] == "POST"

    def broken(*_: object) -> str:
        raise RuntimeError("a bug")

    monkeypatch.setattr(events_module.rawapi, "create_event_named", broken)
    for i in range(1, 5):
        rec.emit(_pod(i), "Unschedulable", "no room")
    assert rec.flush(5) and rec.failed == 5
    monkeypatch.undo()
    rec.emit(_pod(9), "Unschedulable", "no room")
    assert rec.flush(5) and rec.written == 2
    assert all(t.is_alive() for t in rec._threads)


def test_the_interval_stays_below_the_event_ttl(api: client.ApiClient) -> None:
    rec = EventRecorder(api, repeat_interval=2 * EVENT_TTL)
    assert rec.repeat_interval <= EVENT_TTL - 600


def test_the_numbers_reach_the_metrics(api: client.ApiClient) -> None:
    from prometheus_client import generate_latest

    from kai_ray.controller.metrics import SchedulerMetrics

    rec = _recorder(api, Clock())
    metrics = SchedulerMetrics()
    rec.emit(_pod(), "Unschedulable", "no room")
    rec.emit(_pod(), "Unschedulable", "no room")
    rec.flush(5)
    metrics.record_events(rec.stats())
    metrics.record_events(rec.stats())  # counters grow by what changed, not twice
    text = generate_latest(metrics.registry).decode()
    for line in ("kai_ray_event_queue_length 0.0", "kai_ray_event_memory_keys 1.0",
                 "kai_ray_events_written_total 1.0", "kai_ray_events_suppressed_total 1.0",
                 "kai_ray_events_dropped_total 0.0"):
        assert line in text.splitlines()


def test_misses_in_a_row_back_off_up_to_the_interval(api: client.ApiClient) -> None:
    """An API server refusing events is offered each one less often: 30 s, 60 s, 120 s, ...
    at most the repeat interval; a write that succeeds starts over."""
    clock = Clock()
    rec = _recorder(api, clock)
    _Events.status = 500
    tries = []
    for second in range(2200):
        before = len(_writes())
        rec.emit(_pod(), "Unschedulable", "no room")
        rec.flush(5)
        if len(_writes()) > before:
            tries.append(second)
        clock.now += 1
    # gaps 30, 60, 120, 240, 480, then the interval (600)
    assert tries == [0, 30, 90, 210, 450, 930, 1530, 2130]
    _Events.status = None
    clock.now += 600
    rec.emit(_pod(), "Unschedulable", "no room")
    rec.flush(5)
    assert rec.written == 1 and rec._seen[("u0", "Unschedulable")].misses == 0


def test_a_busy_queue_puts_new_events_before_updates_until_the_ttl_nears(
        api: client.ApiClient) -> None:
    clock = Clock()
    rec = _recorder(api, clock, max_queued=4)
    rec.emit(_pod(0), "Unschedulable", "no room")
    rec.flush(5)
    _Events.gate.clear()  # the API server stalls: the queue fills
    try:
        for i in range(1, 5):
            rec.emit(_pod(i), "Unschedulable", "no room")
        deadline = time.monotonic() + 5
        while rec.queue_length() > 3 and time.monotonic() < deadline:
            time.sleep(0.01)  # the writer took one
        assert rec.queue_length() == 3  # more than half full
        clock.now += 600  # p0's update is due, but new Events go first
        rec.emit(_pod(0), "Unschedulable", "no room")
        assert rec.queue_length() == 3 and rec.suppressed == 1
        clock.now += 2400  # 50 min: updated now whatever the queue holds
        rec.emit(_pod(0), "Unschedulable", "no room")
        assert rec.queue_length() == 4
    finally:
        _Events.gate.set()
    assert rec.flush(5)
    assert _writes()[-1][:2] == ("PATCH", f"{EVENTS}/p0.1")
