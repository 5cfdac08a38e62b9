"""/healthz and /readyz: what turns them bad and back, served over HTTP. The loop and the
informers are stand-ins with the fields the endpoints read; time is a fake clock."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from types import SimpleNamespace

from kai_ray.controller.health import Health, HealthConfig, HealthServer


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


def _health(leader: bool | None = None) -> tuple[Health, SimpleNamespace, list, _Clock,
                                                 threading.Event]:
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


def test_served_as_json_with_status_codes() -> None:
    health, loop, informers, clock, stop = _health()
    server = HealthServer(health, 0, "127.0.0.1")
    try:
        def get(path: str) -> tuple[int, dict]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}",
                                            timeout=5) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

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
