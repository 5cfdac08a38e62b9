"""The leader elector's lease calls are bounded by its renew deadline: against a local server
that stops answering, the leader steps down on time instead of waiting out the client's 30 s
read timeout (four times over, with urllib3's retries). The real API server's Lease rules are
tested in tests/integration/test_leader.py."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from kubernetes import client

from kai_ray.controller.leader import LeaderElector, LeaseConfig
from kai_ray.k8s.ratelimit import RateLimitedApiClient
from tests.k8s.local_http import JsonHandler, serving

CONFIG = LeaseConfig(name="l", namespace="ns", lease_duration=3.0, renew_deadline=2.0,
                     retry_period=0.25, identity="me")


class _Leases(JsonHandler):
    """One Lease, stored as written; while `hang` is set, requests get no answer."""

    lease: ClassVar[dict[str, Any] | None] = None
    hang: ClassVar[threading.Event] = threading.Event()
    done: ClassVar[threading.Event] = threading.Event()

    def answer(self, body: dict[str, Any]) -> tuple[int, bytes]:
        cls = type(self)
        if cls.hang.is_set():
            cls.done.wait(60)
            return 503, b"{}"
        if self.command == "GET":
            if cls.lease is None:
                return 404, b'{"kind": "Status", "code": 404, "reason": "NotFound"}'
            return 200, json.dumps(cls.lease).encode()
        rv = int((cls.lease or {"metadata": {}})["metadata"].get("resourceVersion", 0)) + 1
        body["metadata"]["resourceVersion"] = str(rv)
        cls.lease = body
        return (201 if self.command == "POST" else 200), json.dumps(body).encode()

    def _handle(self) -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            super()._handle()  # (a client that gave up waiting: what the test is about)

    do_GET = do_POST = do_PUT = _handle


@pytest.fixture
def server() -> Iterator[str]:
    _Leases.lease = None
    _Leases.hang.clear()
    _Leases.done.clear()
    with serving(_Leases) as url:
        try:
            yield url
        finally:
            _Leases.done.set()  # hung handlers return before the server closes


def _client(host: str, timeout: tuple[float, float] = (5.0, 30.0)) -> RateLimitedApiClient:
    cfg = client.Configuration()
    cfg.host = host
    return RateLimitedApiClient(cfg, timeout=timeout)


def test_a_stuck_renewal_ends_by_the_deadline_and_the_leader_steps_down(server: str) -> None:
    elector = LeaderElector(_client(server), CONFIG)  # the client's read timeout: 30 s
    stopped = threading.Event()
    elector.start(None, stopped.set)
    try:
        deadline = time.monotonic() + 5
        while not elector.is_leader():
            assert time.monotonic() < deadline, "never led"
            time.sleep(0.02)
        time.sleep(3 * CONFIG.retry_period)  # a few renewals
        assert elector.is_leader() and not stopped.is_set()
        _Leases.hang.set()
        hung = time.monotonic()
        assert stopped.wait(10), "still leading after 10 s of unanswered renewals"
        took = time.monotonic() - hung
        assert not elector.is_leader()
        # the last renewal began before the hang; a stuck call ends at the deadline, then one
        # more retry_period to notice
        assert took < CONFIG.renew_deadline + CONFIG.retry_period + 0.5, took
    finally:
        elector.stop(release=False)


def test_call_timeouts_fit_in_the_renew_deadline() -> None:
    now = [100.0]
    lease = LeaseConfig(lease_duration=15, renew_deadline=10, retry_period=2)
    elector = LeaderElector(_client("http://127.0.0.1:1"), lease, clock=lambda: now[0])
    assert elector._call_timeout() == 5.0  # campaigning: half the deadline (read + write)
    elector._leading, elector._last_renew = True, 100.0
    now[0] = 107.0
    assert elector._call_timeout() == 3.0  # leading: no later than the deadline
    now[0] = 111.0
    assert elector._call_timeout() == 0.05
    short = LeaderElector(_client("http://127.0.0.1:1", timeout=(1.0, 2.0)), lease)
    assert short._call_timeout() == 3.0  # a shorter client timeout stands
    retries = elector._api.api_client.rest_client.pool_manager.connection_pool_kw["retries"]
    assert retries.total is False  # one try per call: retry_period is the elector's retry


def test_leadership_counts_from_when_the_attempt_began() -> None:
    """A renewal whose answer comes late was written by the API server before the answer came:
    counting from the answer would keep this replica leading after a standby took over."""
    now = [100.0]
    elector = LeaderElector(_client("http://127.0.0.1:1"), CONFIG, clock=lambda: now[0])

    def slow_acquire() -> bool:
        now[0] += 1.5  # the answer comes 1.5 s after the request went out
        return True

    seen: list[float] = []

    def started() -> None:
        seen.append(elector._last_renew)
        elector._release_on_stop = False
        elector._stop.set()

    elector._try_acquire_or_renew = slow_acquire  # type: ignore[method-assign]
    elector.run(started)
    assert seen == [100.0]
