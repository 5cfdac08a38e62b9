"""Leader election (kai_ray/controller/leader.py) on a real Lease of the real API server."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from kai_ray.controller.leader import LeaderElector, LeaseConfig
from kai_ray.testing.cluster import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LEASE, RENEW, RETRY = 3.0, 2.0, 0.25


def _wait(what: str, check: Callable[[], bool], timeout: float) -> float:
    """Seconds until `check()` holds; fails naming `what` after `timeout`."""
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(0.02)
    return time.monotonic() - t0


class Candidate:
    def __init__(self, cluster: Cluster, namespace: str, name: str) -> None:
        config = LeaseConfig(name="kai-ray-test", namespace=namespace, lease_duration=LEASE,
                             renew_deadline=RENEW, retry_period=RETRY, identity=name)
        self.elector = LeaderElector(cluster.api_client(), config)
        self.started = threading.Event()
        self.stopped = threading.Event()
        self.elector.start(self.started.set, self.stopped.set)


@pytest.fixture
def pair(cluster: Cluster, namespace: str) -> Iterator[tuple[Candidate, Candidate]]:
    a, b = Candidate(cluster, namespace, "a"), Candidate(cluster, namespace, "b")
    yield a, b
    for c in (a, b):
        c.elector.stop()


def _holder(cluster: Cluster, namespace: str) -> str:
    lease = client.CoordinationV1Api(cluster.api_client()).read_namespaced_lease(
        "kai-ray-test", namespace)
    return lease.spec.holder_identity or ""


def _leader(pair: tuple[Candidate, Candidate]) -> tuple[Candidate, Candidate]:
    a, b = pair
    _wait("a leader", lambda: a.elector.is_leader() or b.elector.is_leader(), 10)
    return (a, b) if a.elector.is_leader() else (b, a)


def test_exactly_one_leads(cluster: Cluster, namespace: str,
                           pair: tuple[Candidate, Candidate]) -> None:
    leader, standby = _leader(pair)
    deadline = time.monotonic() + 2 * LEASE  # several renewals and expiry checks
    while time.monotonic() < deadline:
        assert [leader.elector.is_leader(), standby.elector.is_leader()] == [True, False]
        time.sleep(0.05)
    assert _holder(cluster, namespace) == leader.elector.identity
    assert leader.started.is_set() and not standby.started.is_set()
    assert leader.elector.transitions == 1


def test_killed_leader_is_replaced_after_the_lease_expires(
        cluster: Cluster, namespace: str, pair: tuple[Candidate, Candidate]) -> None:
    leader, standby = _leader(pair)
    time.sleep(1.0)
    leader.elector.stop(release=False)  # as a SIGKILL: the Lease keeps naming it
    killed = time.monotonic()
    assert _holder(cluster, namespace) == leader.elector.identity
    took = _wait("the standby to lead", standby.elector.is_leader, LEASE + 3 * RETRY + 2)
    print(f"takeover after kill: {took:.2f}s (lease {LEASE}s, retry {RETRY}s)")
    # it waited for expiry (no stealing) and did not wait much longer
    assert LEASE - RETRY - 0.1 <= time.monotonic() - killed <= LEASE + 2 * RETRY + 0.5
    assert _holder(cluster, namespace) == standby.elector.identity
    assert standby.started.is_set() and leader.stopped.is_set()


def test_released_lease_hands_over_at_once(
        cluster: Cluster, namespace: str, pair: tuple[Candidate, Candidate]) -> None:
    leader, standby = _leader(pair)
    time.sleep(1.0)
    leader.elector.stop(release=True)
    took = _wait("the standby to lead", standby.elector.is_leader, LEASE)
    print(f"takeover after release: {took:.2f}s (lease {LEASE}s, retry {RETRY}s)")
    assert took <= 1.2 * RETRY + 0.5  # its next retry, not the lease expiry
    assert _holder(cluster, namespace) == standby.elector.identity


def test_a_leader_whose_work_fails_to_start_hands_over(cluster: Cluster, namespace: str) -> None:
    def broken() -> None:
        raise RuntimeError("cannot start the scheduler loop")

    config = LeaseConfig(name="kai-ray-test", namespace=namespace, lease_duration=LEASE,
                         renew_deadline=RENEW, retry_period=RETRY, identity="broken")
    failing = LeaderElector(cluster.api_client(), config)
    failing.start(broken)
    try:
        _wait("the broken candidate to take the lease once", lambda: failing.transitions > 0, 10)
        healthy = Candidate(cluster, namespace, "healthy")
        try:
            # well before the lease would expire: the broken leader released it
            _wait("the healthy candidate to lead", healthy.elector.is_leader, LEASE - RETRY)
            assert not failing.is_leader()
        finally:
            healthy.elector.stop()
    finally:
        failing.stop()
