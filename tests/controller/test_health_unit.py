"""/healthz and /readyz: what turns them bad and back, served over HTTP. The loop and the
informers are stand-ins with the fields the endpoints read; time is a fake clock."""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kai_ray.cli import build_parser
from kai_ray.controller import main
from kai_ray.controller.health import Health, HealthConfig, HealthServer
from kai_ray.controller.scheduler_loop import SchedulerLoop
from kai_ray.k8s.ratelimit import RateLimitedApiClient


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _informer(name: str, clock: _Clock, thread: threading.Thread) -> SimpleNamespace:
    inf = SimpleNamespace(name=name, last_contact=clock.now, last_error=None, thread=thread,
                          synced=threading.Event())
    inf.silence = lambda: clock.now - inf.last_contact
    return inf


def _health(leader: bool | None = None
            ) -> tuple[Health, SimpleNamespace, list[SimpleNamespace], _Clock, threading.Event]:
    clock = _Clock()
    stop = threading.Event()
    alive = threading.Thread(target=stop.wait, daemon=True)
    alive.start()
    loop = SimpleNamespace(cycles=5, failed_cycles=0, cycle_started=None,
                           last_progress=clock.now, last_error=None)
    informers = [_informer("pods", clock, alive), _informer("nodes", clock, alive)]
    health = Health(HealthConfig(max_cycle_age_s=30, max_informer_silence_s=60), loop,
                    SimpleNamespace(informers=informers), lambda: alive,
                    is_leader=(lambda: bool(leader)) if leader is not None else None,
                    clock=clock)
    return health, loop, informers, clock, stop


def test_a_wedged_cycle_fails_and_recovers() -> None:
    health, loop, _, clock, stop = _health()
    assert health.healthz()[0]
    loop.cycle_started = clock.now
    clock.now += 31
    ok, checks = health.healthz()
    assert not ok and "started 31s ago" in checks["loop"]["detail"]
    loop.cycle_started, loop.last_progress = None, clock.now
    assert health.healthz()[0]
    stop.set()


def test_a_long_cycle_that_gets_answers_is_working() -> None:
    """`last_answer` is the loop's own client's (kai-ray run gives the loop a sibling of the
    client the lease and the watches use), so the answers are to the cycle's own requests."""
    health, loop, informers, clock, stop = _health()
    answered = [clock.now]
    health.last_answer = lambda: answered[0]
    loop.cycle_started = clock.now
    for _ in range(10):  # ten minutes of status writes the API server keeps answering
        clock.now += 60
        answered[0] = clock.now - 1
        for inf in informers:
            inf.last_contact = clock.now
        ok, checks = health.healthz()
        assert ok and "still getting answers" in checks["loop"]["detail"]
    clock.now += 31  # then no answer for longer than the limit: wedged
    for inf in informers:
        inf.last_contact = clock.now
    ok, checks = health.healthz()
    assert not ok and "last answered 32s ago" in checks["loop"]["detail"]
    stop.set()


def test_cycles_that_keep_failing_are_unhealthy() -> None:
    health, loop, _, clock, stop = _health()
    loop.last_error = "ValueError: boom"
    clock.now += 45
    ok, checks = health.healthz()
    assert not ok and "ValueError: boom" in checks["loop"]["detail"]
    stop.set()


def test_a_follower_is_healthy_while_it_waits() -> None:
    health, _, _, clock, stop = _health(leader=False)
    clock.now += 300
    for inf in health.cache.informers:
        inf.last_contact = clock.now
    ok, checks = health.healthz()
    assert ok and checks["loop"]["leader"] is False
    stop.set()


def test_a_silent_informer_or_a_dead_thread_fails() -> None:
    health, loop, informers, clock, stop = _health()
    clock.now += 61
    loop.last_progress = clock.now
    informers[1].last_contact = clock.now
    ok, checks = health.healthz()
    assert not ok and not checks["informer:pods"]["ok"] and checks["informer:nodes"]["ok"]
    informers[0].last_contact = clock.now
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    health.threads = lambda: [dead]
    ok, checks = health.healthz()
    assert not ok and checks[f"thread:{dead.name}"] == {"ok": False, "detail": "not running"}
    stop.set()


def test_a_refused_optional_watch_is_shown_not_failed() -> None:
    """The pod grouper's RayCluster watch refused (no RBAC) is reported on both endpoints,
    and neither fails for it: the scheduler works without it."""
    health, _, informers, _, stop = _health()
    for inf in informers:
        inf.synced.set()
    refused = {"ok": True, "watching": False, "detail": "refused (403 Forbidden): ..."}
    health.watches = lambda: {"rayclusters.ray.io": refused}
    for ok, checks in (health.healthz(), health.readyz()):
        assert ok and checks["watch:rayclusters.ray.io"] == refused
    watch = SimpleNamespace(state=lambda: refused)
    assert main._watches(SimpleNamespace(grouper=SimpleNamespace(ray_watch=watch))) == {
        "rayclusters.ray.io": refused}
    assert main._watches(SimpleNamespace(grouper=None)) == {}  # not started yet
    stop.set()


def test_starting_is_alive_but_not_ready() -> None:
    """While the cache lists (the loop's thread not started, informers not listed, nor their
    threads started) /healthz is 200 and /readyz 503; once started, the usual checks."""
    health, loop, informers, clock, stop = _health()
    thread: list[threading.Thread | None] = [None]
    health.loop_thread = lambda: thread[0]
    not_started = threading.Thread(target=lambda: None)
    informers[0].thread = not_started
    health.starting = "waiting for the watch cache to sync"
    clock.now += 200  # longer than both limits: a big cluster's first list
    ok, checks = health.healthz()
    assert ok and checks["loop"]["detail"] == "starting: waiting for the watch cache to sync"
    assert checks["informer:pods"]["detail"] == "starting: not listed yet"
    assert not health.readyz()[0]
    informers[1].synced.set()  # listed, then silent: a failure even while starting
    ok, checks = health.healthz()
    assert not ok and checks["informer:pods"]["ok"] and not checks["informer:nodes"]["ok"]
    health.started()  # but no loop thread: a failure
    ok, checks = health.healthz()
    assert not ok and "not running" in checks["loop"]["detail"]
    assert "not running" in checks["informer:pods"]["detail"]
    running = threading.Thread(target=stop.wait, daemon=True)
    running.start()
    thread[0] = informers[0].thread = running
    for inf in informers:
        inf.synced.set()
        inf.last_contact = clock.now
    # the first cycle, its loop created and its client last answered before the cache listed:
    # the limits count from the start
    health.last_answer = lambda: 1000.0
    loop.cycle_started = clock.now
    assert health.healthz()[0]
    clock.now += 31
    for inf in informers:
        inf.last_contact = clock.now
    ok, checks = health.healthz()
    assert not ok and "started 31s ago and the API server last answered 31s ago" in \
        checks["loop"]["detail"]
    stop.set()


def test_run_answers_health_before_the_cache_synced(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`kai-ray run` serves /healthz (200) and /readyz (503) while the cache lists, and stops
    the server when the cache fails to sync; the loop gets its own client of the same rate
    limit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    answers: dict[str, tuple[int, dict[str, Any]]] = {}
    clients: dict[str, RateLimitedApiClient] = {}

    class Listing:  # a ClusterCache whose informers never list
        def __init__(self, api: RateLimitedApiClient, **_: object) -> None:
            clients["cache"] = api
            self.informers = [_informer("pods", _Clock(), threading.Thread(target=lambda: None))]

        def start(self) -> None:
            for path in ("/healthz", "/readyz"):
                answers[path] = _get(port, path)
            raise TimeoutError("cache: pods did not sync within 60s")

    def loop(api: RateLimitedApiClient, *a: Any, **kw: Any) -> SchedulerLoop:
        clients["loop"] = api
        return SchedulerLoop(api, *a, **kw)

    monkeypatch.setattr(main, "ClusterCache", Listing)
    monkeypatch.setattr(main, "SchedulerLoop", loop)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    args = build_parser().parse_args(["run", "--kubeconfig", str(kubeconfig),
                                      "--health-port", str(port)])
    assert main.cmd_run(args) == 2
    code, body = answers["/healthz"]
    assert code == 200 and body["checks"]["loop"]["detail"].startswith("starting")
    assert answers["/readyz"][0] == 503
    with pytest.raises(urllib.error.URLError):  # stopped on the way out
        _get(port, "/healthz")
    assert clients["loop"] is not clients["cache"]
    assert clients["loop"].limiter is clients["cache"].limiter is not None


def _get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_served_as_json_with_status_codes() -> None:
    health, loop, informers, clock, stop = _health()
    server = HealthServer(health, 0, "127.0.0.1")
    try:
        def get(path: str) -> tuple[int, dict[str, Any]]:
            return _get(server.port, path)

        assert get("/readyz")[0] == 503  # nothing listed yet
        for inf in informers:
            inf.synced.set()
        assert get("/readyz")[0] == 200
        assert get("/healthz") == (200, get("/healthz")[1])
        loop.cycle_started = clock.now
        clock.now += 100
        code, body = get("/healthz")
        assert code == 503 and body["status"] == "failing" and not body["checks"]["loop"]["ok"]
    finally:
        server.stop()
        stop.set()
