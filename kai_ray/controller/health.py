"""`/healthz` and `/readyz` of `kai-ray run`, on a port of their own (`--health-port`).

`/healthz` (the liveness probe) is 200 while the scheduler starts or works and 503 once it does
not:
- the scheduling loop: its thread is alive and, while it leads, a cycle completed within
  `max_cycle_age_s`, or the cycle running now still gets answers from the API server to its own
  requests within that time (a cycle stuck in a call, or every cycle failing, turns it
  unhealthy; a long one writing thousands of statuses does not);
- each informer (the watch cache of nodes, pods, PodGroups, Queues, PriorityClasses): its
  thread is alive and the API server answered it within `max_informer_silence_s` (a watch is
  re-opened every `watchTimeoutSeconds`, so a live one is never silent for longer);
- every other worker thread named (the pod grouper, event writers, the leader elector).

While `starting` names what start-up waits for (the watch cache's first lists of a big cluster
take up to a minute), the loop and the informers not listed yet count as healthy, so that the
liveness probe does not kill a scheduler that has not started; start-up has its own time limit.

Leader state is reported, never a failure: a follower is healthy. So are the optional watches
(`watches`: the pod grouper's RayCluster watch), on both endpoints as `watch:<resource>`: one the
API server refuses (no RBAC) or does not serve (no KubeRay) says so in its `detail`, and the
scheduler still works without it. `/readyz` (the readiness probe) is 200 once every informer has
listed its objects. Both answer JSON naming each check, so `curl` says what is wrong.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HealthConfig:
    max_cycle_age_s: float = 60.0
    max_informer_silence_s: float = 120.0


@dataclass
class Health:
    """What the endpoints read. `loop`: a SchedulerLoop (cycle_started, last_progress,
    last_error); `cache`: a ClusterCache (informers); `loop_thread`: None until it starts;
    `threads`: more worker threads, by name, read when asked (pools start their threads
    lazily); `watches`: the optional watches' states by resource (each with `ok`, always
    true); `is_leader`: None without election; `starting`: what start-up waits for
    (`started()` ends it)."""

    config: HealthConfig
    loop: Any
    cache: Any
    loop_thread: Callable[[], threading.Thread | None]
    threads: Callable[[], Iterable[threading.Thread]] = lambda: ()
    watches: Callable[[], Mapping[str, Mapping[str, Any]]] = lambda: {}
    is_leader: Callable[[], bool] | None = None
    # when the API server last answered the loop's own client (monotonic), None if unknown
    last_answer: Callable[[], float] | None = None
    starting: str | None = None
    clock: Callable[[], float] = time.monotonic
    _unhealthy_since: dict[str, float] = field(default_factory=dict)
    _started_at: float = float("-inf")

    def started(self) -> None:
        """Start-up is over (the loop's thread runs): the loop's limits count from now, not
        from its creation or its client's last answer before the cache listed."""
        self._started_at = self.clock()
        self.starting = None

    def healthz(self) -> tuple[bool, dict[str, Any]]:
        now = self.clock()
        checks: dict[str, dict[str, Any]] = {}
        thread = self.loop_thread()
        leading = self.is_leader() if self.is_leader is not None else True
        loop: dict[str, Any] = {"leader": leading if self.is_leader is not None else None,
                                "cycles": self.loop.cycles,
                                "failedCycles": self.loop.failed_cycles}
        if self.starting is not None:
            loop.update(ok=True, detail=f"starting: {self.starting}")
        elif thread is None or not thread.is_alive():
            loop.update(ok=False, detail="the scheduling loop's thread is not running")
        else:
            started = self.loop.cycle_started
            idle = now - max(self.loop.last_progress, self._started_at)
            loop["secondsSinceLastCycle"] = round(idle, 1)
            if started is not None:
                loop["cycleRunningSeconds"] = round(now - started, 1)
            answered = (now - max(self.last_answer(), self._started_at)
                        if self.last_answer is not None else None)
            if answered is not None:
                loop["secondsSinceApiAnswer"] = round(answered, 1)
            limit = self.config.max_cycle_age_s
            if not leading or idle <= limit:
                loop["ok"] = True
            elif started is not None and answered is not None and answered <= limit:
                # a long cycle (the first one writing the status of 50,000 pending pods) that
                # the API server keeps answering is working, not wedged
                loop.update(ok=True, detail=f"a long cycle ({now - started:.0f}s so far) that "
                            "is still getting answers")
            else:
                why = (f"the cycle running now started {now - started:.0f}s ago"
                       + (f" and the API server last answered {answered:.0f}s ago"
                          if answered is not None else "")
                       if started is not None else
                       f"no cycle completed in {idle:.0f}s (last error: {self.loop.last_error})")
                loop.update(ok=False, detail=f"{why}; limit {limit:g}s")
        checks["loop"] = loop
        for inf in self.cache.informers:
            silence = inf.silence()
            entry: dict[str, Any] = {"ok": True, "secondsSinceContact": round(silence, 1),
                                     "synced": inf.synced.is_set()}
            if inf.last_error:
                entry["lastError"] = inf.last_error
            if self.starting is not None and not inf.synced.is_set():
                entry["detail"] = "starting: not listed yet"  # its thread may not run yet
            elif not inf.thread.is_alive():
                entry.update(ok=False, detail="its thread is not running")
            elif silence > self.config.max_informer_silence_s:
                entry.update(ok=False, detail=f"no answer from the API server for "
                             f"{silence:.0f}s; limit {self.config.max_informer_silence_s:g}s")
            checks[f"informer:{inf.name}"] = entry
        for t in self.threads():
            checks[f"thread:{t.name}"] = ({"ok": True} if t.is_alive() else
                                          {"ok": False, "detail": "not running"})
        checks.update(self._watches())
        ok = all(c["ok"] for c in checks.values())
        self._log_changes(checks)
        return ok, checks

    def readyz(self) -> tuple[bool, dict[str, Any]]:
        checks: dict[str, dict[str, Any]] = {f"informer:{inf.name}": {"ok": inf.synced.is_set()}
                                             for inf in self.cache.informers}
        checks.update(self._watches())
        return all(c["ok"] for c in checks.values()), checks

    def _watches(self) -> dict[str, dict[str, Any]]:
        return {f"watch:{name}": dict(state) for name, state in self.watches().items()}

    def _log_changes(self, checks: dict[str, dict[str, Any]]) -> None:
        """Say in the log when a check turns bad and when it is good again."""
        now = self.clock()
        for name, c in checks.items():
            if not c["ok"] and name not in self._unhealthy_since:
                self._unhealthy_since[name] = now
                log.warning("health: %s is failing: %s", name, c.get("detail"))
            elif c["ok"] and name in self._unhealthy_since:
                was = now - self._unhealthy_since.pop(name)
                log.info("health: %s is healthy again (after %.0fs)", name, was)


class HealthServer:
    """Serves `health` on http://addr:port/healthz and /readyz (port 0: a free one)."""

    def __init__(self, health: Health, port: int, addr: str = "0.0.0.0") -> None:
        handler = _handler(health)
        self.server = ThreadingHTTPServer((addr, port), handler)
        self.server.daemon_threads = True
        self.addr = addr
        self.thread = threading.Thread(target=self.server.serve_forever, name="health-server",
                                       daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{self.port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def _handler(health: Health) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the name http.server calls
            path = self.path.split("?", 1)[0]
            if path in ("/healthz", "/livez"):
                ok, checks = health.healthz()
            elif path == "/readyz":
                ok, checks = health.readyz()
            else:
                self.send_error(404, "try /healthz or /readyz")
                return
            body = json.dumps({"status": "ok" if ok else "failing", "checks": checks},
                              indent=1).encode()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds
            return

    return Handler
