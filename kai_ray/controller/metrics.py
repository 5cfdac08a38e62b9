"""Prometheus metrics of the scheduler, prefix ``kai_ray_``, in a registry of their own.

    metrics = SchedulerMetrics()                      # or the module's METRICS
    server = start_metrics_server(9090, metrics=metrics)   # GET http://127.0.0.1:9090/metrics
    t0 = time.perf_counter()
    result = schedule(snapshot, config, now, clock=time.perf_counter)  # times each action
    ... bind ...
    metrics.record_cycle(result, e2e_seconds=time.perf_counter() - t0)
    server.stop()

Series (base units; prometheus_client appends ``_total`` to counters):

- ``kai_ray_action_latency_seconds{action}`` histogram, from ``CycleResult.action_seconds``
  (filled only when ``schedule`` was given a ``clock``);
- ``kai_ray_e2e_scheduling_latency_seconds`` histogram, the caller's whole-cycle time
  (snapshot, core and binder);
- ``kai_ray_cycles_total``, ``kai_ray_pods_bound_total`` (bind decisions handed to the binder),
  ``kai_ray_pods_pipelined_total``, ``kai_ray_pods_evicted_total{action}``;
- ``kai_ray_pending_jobs{reason}``: jobs left with pending pods after the cycle, by reason;
- ``kai_ray_queue_{deserved,limit,fair_share,allocated,allocated_non_preemptible,requested}``
  ``{queue,resource}`` gauges, resource ``gpu`` (GPUs), ``cpu`` (cores), ``memory`` (bytes);
  -1 keeps the core's meaning "unlimited" / "no quota". Queues gone from the cycle lose
  their series, so deleted queues do not linger;
- ``kai_ray_event_queue_length``, ``kai_ray_event_memory_keys`` gauges and
  ``kai_ray_events_{written,aggregated,suppressed,dropped,failed}_total`` counters, from the
  event recorder's ``stats()`` (``record_events``).

Unlike KAI (latencies as millisecond gauges, ``kai_`` prefix), latencies are histograms in
seconds, as Prometheus' naming rules ask.
"""

from __future__ import annotations

import threading
from collections import Counter as Tally
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from kai_ray.core.result import CPU, GPU, MEM, CycleResult, QueueShare

NAMESPACE = "kai_ray"
# QueueShare's tuples are indexed by the core's resource constants (cpu, memory, gpu)
RESOURCES = tuple(name for _, name in sorted([(CPU, "cpu"), (MEM, "memory"), (GPU, "gpu")]))
_TO_BASE = {"gpu": 1.0, "cpu": 1e-3, "memory": 1.0}  # queue units -> GPUs, cores, bytes
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0, 30.0)
EVENT_COUNTERS = {
    "written": "Event writes that succeeded (creates and updates).",
    "aggregated": "Repeated events written as an update of their Event (count + 1).",
    "suppressed": "Repeated events not written (within the repeat interval).",
    "dropped": "Events dropped because the event queue was full.",
    "failed": "Event writes the API server refused or did not answer."}
QUEUE_FIELDS = ("deserved", "limit", "fair_share", "allocated", "allocated_non_preemptible",
                "requested")


def _base(resource: str, value: float) -> float:
    return value if value < 0 else value * _TO_BASE[resource]


class SchedulerMetrics:
    """The scheduler's metrics in ``self.registry`` (a fresh CollectorRegistry by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r, ns = self.registry, NAMESPACE
        self.action_latency = Histogram(
            "action_latency_seconds", "Time of one scheduling action in one cycle.", ["action"],
            namespace=ns, registry=r, buckets=LATENCY_BUCKETS)
        self.e2e_latency = Histogram(
            "e2e_scheduling_latency_seconds",
            "Time of one whole scheduling cycle: snapshot, actions and binder.",
            namespace=ns, registry=r, buckets=LATENCY_BUCKETS)
        self.cycles = Counter("cycles", "Scheduling cycles run.", namespace=ns, registry=r)
        self.pods_bound = Counter("pods_bound", "Pods the scheduler decided to bind.",
                                  namespace=ns, registry=r)
        self.pods_pipelined = Counter(
            "pods_pipelined", "Pods placed on resources still being released.",
            namespace=ns, registry=r)
        self.pods_evicted = Counter("pods_evicted", "Pods evicted, by the action that did it.",
                                    ["action"], namespace=ns, registry=r)
        self.pending_jobs = Gauge("pending_jobs",
                                  "Jobs with pending pods after the last cycle, by reason.",
                                  ["reason"], namespace=ns, registry=r)
        self.queue: dict[str, Gauge] = {
            f: Gauge(f"queue_{f}", f"Queue {f.replace('_', ' ')} per resource (GPUs, cores, "
                     "bytes; -1 = unlimited).", ["queue", "resource"], namespace=ns, registry=r)
            for f in QUEUE_FIELDS}
        self.event_queue = Gauge("event_queue_length", "Events queued, not yet written.",
                                 namespace=ns, registry=r)
        self.event_keys = Gauge("event_memory_keys",
                                "(object, reason) pairs the event recorder remembers.",
                                namespace=ns, registry=r)
        self.events = {k: Counter(f"events_{k}", help_, namespace=ns, registry=r)
                       for k, help_ in EVENT_COUNTERS.items()}
        self._events_seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self._queues: set[str] = set()
        self._reasons: set[str] = set()

    def record_cycle(self, result: CycleResult, e2e_seconds: float | None = None) -> None:
        """Update every series from one cycle's result (thread-safe)."""
        with self._lock:
            self.cycles.inc()
            for action, seconds in result.action_seconds.items():
                self.action_latency.labels(action).observe(seconds)
            if e2e_seconds is not None:
                self.e2e_latency.observe(e2e_seconds)
            self.pods_bound.inc(len(result.binds))
            self.pods_pipelined.inc(len(result.pipelined))
            for action, n in Tally(e.action for e in result.evictions).items():
                self.pods_evicted.labels(action).inc(n)
            self._set_pending(Tally(s.reason for s in result.job_status.values()))
            self._set_queues(result.queues.values())

    def record_events(self, stats: Mapping[str, int]) -> None:
        """The event recorder's `stats()` (kai_ray.k8s.events): its queue length and memory,
        and its counters' growth since the last call (thread-safe)."""
        with self._lock:
            self.event_queue.set(stats.get("queued", 0))
            self.event_keys.set(stats.get("remembered", 0))
            for key, counter in self.events.items():
                value = stats.get(key, 0)
                counter.inc(max(0, value - self._events_seen.get(key, 0)))
                self._events_seen[key] = value

    def _set_pending(self, by_reason: Tally[str]) -> None:
        for reason in self._reasons - set(by_reason):
            self.pending_jobs.remove(reason)
        for reason, n in by_reason.items():
            self.pending_jobs.labels(reason).set(n)
        self._reasons = set(by_reason)

    def _set_queues(self, shares: Iterable[QueueShare]) -> None:
        names = set()
        for share in shares:
            names.add(share.name)
            for f, gauge in self.queue.items():
                values: tuple[float, float, float] = getattr(share, f)
                for resource, value in zip(RESOURCES, values, strict=True):
                    gauge.labels(share.name, resource).set(_base(resource, value))
        for gone in self._queues - names:
            for gauge in self.queue.values():
                for resource in RESOURCES:
                    gauge.remove(gone, resource)
        self._queues = names


METRICS = SchedulerMetrics()


def record_cycle(result: CycleResult, e2e_seconds: float | None = None) -> None:
    """``METRICS.record_cycle``: the process-wide metrics."""
    METRICS.record_cycle(result, e2e_seconds)


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint."""

    server: WSGIServer
    thread: threading.Thread
    addr: str

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{self.port}/metrics"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def start_metrics_server(port: int, addr: str = "127.0.0.1",
                         metrics: SchedulerMetrics | None = None) -> MetricsServer:
    """Serve ``metrics`` (default: ``METRICS``) on ``http://addr:port/metrics``; 0 = free port."""
    registry = (metrics or METRICS).registry
    server, thread = start_http_server(port, addr=addr, registry=registry)
    return MetricsServer(server, thread, addr)
