"""Scheduler metrics (kai_ray/controller/metrics.py) from real core cycles, and a real scrape."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kai_ray.controller.metrics import SchedulerMetrics, start_metrics_server
from kai_ray.core.result import CPU, GPU, MEM, CycleResult
from kai_ray.core.schedule import schedule
from kai_ray.sim.scenario import config_of, load, snapshot_of

SEEDS = {s.id: s for s in load(Path(__file__).parents[1] / "scenarios" / "seeds.yaml")}


def cycle(seed: str) -> CycleResult:
    scenario = SEEDS[seed]
    return schedule(snapshot_of(scenario), config_of(scenario), clock=time.perf_counter)


def value(m: SchedulerMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_binds_latencies_and_queue_gauges_follow_the_cycle() -> None:
    m = SchedulerMetrics()
    result = cycle("SEED-04")  # a 5-pod gang: a CPU head and 4 one-GPU workers on one node
    assert len(result.binds) == 5
    m.record_cycle(result, e2e_seconds=0.2)

    assert value(m, "kai_ray_pods_bound_total") == 5
    assert value(m, "kai_ray_cycles_total") == 1
    assert value(m, "kai_ray_e2e_scheduling_latency_seconds_count") == 1
    assert value(m, "kai_ray_e2e_scheduling_latency_seconds_sum") == pytest.approx(0.2)
    for action, seconds in result.action_seconds.items():
        assert value(m, "kai_ray_action_latency_seconds_count", action=action) == 1
        assert value(m, "kai_ray_action_latency_seconds_sum", action=action) == seconds
    assert set(result.action_seconds) == set(config_of(SEEDS["SEED-04"]).actions)

    share = result.queues["team-a"]
    assert value(m, "kai_ray_queue_allocated", queue="team-a", resource="gpu") == 4
    assert value(m, "kai_ray_queue_requested", queue="team-a", resource="gpu") == 4
    # the core counts CPU in millicores; the gauge is in cores
    assert value(m, "kai_ray_queue_allocated", queue="team-a", resource="cpu") == pytest.approx(
        share.allocated[CPU] / 1000)
    assert value(m, "kai_ray_queue_allocated", queue="team-a", resource="memory") == (
        share.allocated[MEM])
    assert value(m, "kai_ray_queue_fair_share", queue="team-a", resource="gpu") == (
        share.fair_share[GPU])
    assert share.fair_share[GPU] > 0
    # "unlimited" stays -1 in every unit
    assert share.limit[CPU] == -1
    assert value(m, "kai_ray_queue_limit", queue="team-a", resource="cpu") == -1
    assert value(m, "kai_ray_queue_deserved", queue="department-1", resource="gpu") == (
        result.queues["department-1"].deserved[GPU])


def test_evictions_pending_jobs_and_vanished_queues() -> None:
    m = SchedulerMetrics()
    m.record_cycle(cycle("SEED-04"))
    preempt = cycle("SEED-05")  # build-pod preempts train-pod in queue "test"
    assert [e.action for e in preempt.evictions] == ["preempt"]
    m.record_cycle(preempt)
    assert value(m, "kai_ray_pods_evicted_total", action="preempt") == 1
    assert value(m, "kai_ray_queue_deserved", queue="test", resource="gpu") == 1  # its quota
    assert value(m, "kai_ray_pods_pipelined_total") == len(preempt.pipelined) == 1
    assert value(m, "kai_ray_pods_bound_total") == 5 + len(preempt.binds)
    # SEED-04's queues are not in SEED-05's cycle: their series are gone
    assert value(m, "kai_ray_queue_allocated", queue="team-a", resource="gpu") is None
    assert value(m, "kai_ray_queue_allocated", queue="test", resource="gpu") is not None

    stuck = cycle("SEED-03")  # the gang does not fit: one pending job
    m.record_cycle(stuck)
    reasons = {s.reason for s in stuck.job_status.values()}
    assert len(reasons) == 1
    assert value(m, "kai_ray_pending_jobs", reason=reasons.pop()) == 1
    m.record_cycle(cycle("SEED-04"))
    assert not next(s for s in m.registry.collect() if s.name == "kai_ray_pending_jobs").samples


def test_scrape_over_http() -> None:
    m = SchedulerMetrics()
    m.record_cycle(cycle("SEED-04"), e2e_seconds=0.05)
    server = start_metrics_server(0, metrics=m)
    try:
        assert server.url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(server.url, timeout=5) as resp:
            assert resp.status == 200
            text = resp.read().decode()
    finally:
        server.stop()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert "kai_ray_pods_bound" in families  # counters are listed without _total
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families.values() for s in f.samples}
    assert samples[("kai_ray_pods_bound_total", ())] == 5
    assert samples[("kai_ray_queue_allocated", (("queue", "team-a"), ("resource", "gpu")))] == 4
    assert ("kai_ray_action_latency_seconds_count", (("action", "allocate"),)) in samples
    # nothing but our registry: no process/platform collectors of the default registry
    assert all(name.startswith("kai_ray_") for name in families)
