"""kai_ray.tools without a cluster: snapshot -> scenario -> simulate is lossless for the
scheduler's decisions, and queues/explain report the core's own numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kai_ray.core.constraints import Requirement, Taint, Toleration
from kai_ray.core.model import (
    Job,
    Node,
    Pod,
    PodStatus,
    Queue,
    Request,
    ResourceQuota,
    SchedulerConfig,
    Snapshot,
)
from kai_ray.core.schedule import schedule
from kai_ray.sim.scenario import NOW, config_of, load, snapshot_of
from kai_ray.sim.scenario_write import scenario_of
from kai_ray.tools.explain import explain
from kai_ray.tools.live import Live
from kai_ray.tools.queues import queue_rows
from kai_ray.tools.snapshot import predicted

ROOT = Path(__file__).resolve().parents[1]
SCENARIO_FILES = [ROOT / "tests" / "scenarios" / "kai-conformance.yaml",
                  ROOT / "tests" / "scenarios" / "seeds.yaml",
                  ROOT / "kai_ray" / "sim" / "data" / "demo.yaml"]


def _cases() -> list[object]:
    out = []
    for path in SCENARIO_FILES:
        for s in load(path):
            if s.run != "fairshare_only":
                out.append(pytest.param(s, id=f"{path.stem}:{s.id}"))
    return out


@pytest.mark.parametrize("scenario", _cases())
def test_snapshot_file_replays_the_same_decisions(scenario, tmp_path: Path) -> None:
    """Every scenario we have, written out as `kai-ray snapshot` writes a live cluster, loads
    back into a snapshot on which one cycle decides exactly the same binds, evictions and
    pending reasons."""
    config = config_of(scenario)
    original = snapshot_of(scenario)
    doc = {"scenarios": [scenario_of(original, config, NOW)]}
    path = tmp_path / "snap.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    (replayed,) = load(path)
    again = snapshot_of(replayed)
    want = schedule(original, config, NOW)
    got = schedule(again, config_of(replayed), NOW)
    assert predicted(got) == predicted(want)
    assert [(e.pod, e.action) for e in got.evictions] == \
        [(e.pod, e.action) for e in want.evictions]
    assert {k: v.message for k, v in got.job_status.items()} == \
        {k: v.message for k, v in want.job_status.items()}


def _snapshot() -> Snapshot:
    nodes = tuple(Node(f"n{i}", cpu_m=64000, memory=512 * 10**9, gpus=4) for i in range(2))
    open_ = ResourceQuota(-1, -1, 1)
    queues = (Queue("root", gpu=ResourceQuota(-1, -1, 1), cpu=open_, memory=open_),
              Queue("team-a", parent="root", gpu=ResourceQuota(2, 3, 1), cpu=open_,
                    memory=open_, created=1),
              Queue("team-b", parent="root", gpu=ResourceQuota(2, -1, 1), cpu=open_,
                    memory=open_, created=2))
    req = Request(cpu_m=1000, memory=10**9, gpus=2)
    running = Job("default/a-run", "team-a", 50, (Pod("a-run-0", req, PodStatus.RUNNING, "n0"),))
    over_limit = Job("default/a-big", "team-a", 50, (Pod("a-big-0", req),), created=5)
    np_over = Job("default/b-np", "team-b", 100, (Pod("b-np-0", Request(1000, 10**9, gpus=3)),),
                  created=6)
    too_big = Job("default/b-huge", "team-b", 50, (Pod("b-huge-0", Request(1000, 10**9, gpus=8)),),
                  created=7)
    lost = Job("default/lost", "nope", 50, (Pod("lost-0", req),), created=8)
    # job names are job keys (`namespace/name`), as the watch cache builds them
    return Snapshot(nodes, queues, (running, over_limit, np_over, too_big, lost))


def test_queue_rows_are_the_cores_numbers() -> None:
    snap = _snapshot()
    rows = {r["name"]: r for r in queue_rows(snap, config_of_default(), 100.0)}
    assert [r for r in rows] == ["root", "team-a", "team-b"]
    a = rows["team-a"]["gpu"]
    assert (a["quota"], a["limit"], a["allocated"], a["weight"]) == (2, 3, 2, 1)
    assert a["pending"] == 2  # a-big wants 2 more
    assert rows["team-b"]["gpu"]["pending"] == 11  # 3 + 8
    assert rows["root"]["gpu"]["allocated"] == 2
    total_fair = rows["team-a"]["gpu"]["fair_share"] + rows["team-b"]["gpu"]["fair_share"]
    assert total_fair == pytest.approx(8)  # the cluster's 8 GPUs are all shared out


def config_of_default():
    from kai_ray.core.model import SchedulerConfig

    return SchedulerConfig()


@pytest.mark.parametrize("job,reason,needle", [
    ("a-big", "OverLimit", "raise the limit to at least 4 GPUs"),
    ("b-np", "NonPreemptibleOverQuota", "raise the quota to at least 3 GPUs"),
    ("b-huge", "Unschedulable", "each pod needs 8 GPU(s) on one node; 0 of 2"),
    ("lost", "QueueDoesNotExist", "create Queue 'nope'"),
])
def test_explain_names_the_cause_with_numbers(job: str, reason: str, needle: str) -> None:
    live = Live(_snapshot(), [], {}, {}, {}, 100.0)
    doc = explain(live, config_of_default(), "default", f"podgroup/{job}")
    assert doc["reason"] == reason
    assert any(needle in c for c in doc["what_would_have_to_change"]), doc
    if reason == "Unschedulable":
        assert doc["nodes_failed"] == {"didn't have enough resources: GPUs": 2}
        assert doc["nodes"]["most_free_gpus"] == 4


def test_a_bare_name_falls_back_to_the_podgroup() -> None:
    live = Live(_snapshot(), [], {"default/a-big": {"metadata": {"name": "a-big"}}}, {}, {}, 100.0)
    assert explain(live, config_of_default(), "default", "a-big")["reason"] == "OverLimit"
    missing = explain(live, config_of_default(), "default", "nothing")
    assert missing["found"] is False and "pod default/nothing not found" in missing["summary"]


def test_snapshot_keeps_the_gpu_packing_policy(tmp_path: Path) -> None:
    import dataclasses

    (scenario,) = [s for s in load(SCENARIO_FILES[2]) if s.run != "fairshare_only"][:1]
    config = dataclasses.replace(config_of(scenario), gpu_packing="lookahead")
    original = snapshot_of(scenario)
    path = tmp_path / "snap.yaml"
    path.write_text(yaml.safe_dump({"scenarios": [scenario_of(original, config, NOW)]}))
    (replayed,) = load(path)
    assert config_of(replayed).gpu_packing == "lookahead"
    assert predicted(schedule(snapshot_of(replayed), config_of(replayed), NOW)) == \
        predicted(schedule(original, config, NOW))


def test_taints_tolerations_and_affinity_survive_the_snapshot_file(tmp_path: Path) -> None:
    """A snapshot with node taints, pod tolerations and required node affinity written as a
    scenario and read back is the same snapshot (and so decides the same)."""
    open_ = ResourceQuota(-1, -1, 1)
    nodes = (Node("gpu-a", 64000, 512 * 10**9, gpus=4,
                  taints=(Taint("nvidia.com/gpu", "present", "NoSchedule"),
                          Taint("soft", "", "PreferNoSchedule"))),
             Node("gpu-b", 64000, 512 * 10**9, gpus=4, labels=(("zone", "b"),)))
    req = Request(cpu_m=1000, memory=10**9, gpus=1)
    pods = (Pod("tolerant", req, tolerations=(Toleration("nvidia.com/gpu", "Exists"),
                                              Toleration("k", "Equal", "v", "NoExecute"))),
            Pod("pinned", req, node_affinity=(
                (Requirement("zone", "In", ("b",)),
                 Requirement("metadata.name", "NotIn", ("gpu-a",), field=True)),
                (Requirement("gpus", "Gt", ("2",)),))),
            Pod("nowhere", req, node_affinity=()))
    original = Snapshot(nodes, (Queue("root", gpu=open_, cpu=open_, memory=open_),
                                Queue("q", parent="root", gpu=open_, cpu=open_, memory=open_)),
                        tuple(Job(p.name, "q", priority=100, pods=(p,), created=float(i))
                              for i, p in enumerate(pods)))
    config = SchedulerConfig()
    path = tmp_path / "snap.yaml"
    path.write_text(yaml.safe_dump({"scenarios": [scenario_of(original, config, NOW)]}))
    again = snapshot_of(load(path)[0])
    assert [n.taints for n in again.nodes] == [n.taints for n in original.nodes]
    assert [(p.tolerations, p.node_affinity) for j in again.jobs for p in j.pods] == \
        [(p.tolerations, p.node_affinity) for p in pods]
    want, got = schedule(original, config, NOW), schedule(again, config, NOW)
    assert predicted(got) == predicted(want)
    assert {b.pod: b.node for b in want.binds} == {"tolerant": "gpu-a", "pinned": "gpu-b"}


def test_the_queue_table_renders_every_row() -> None:
    from kai_ray.tools.queues import render_queues

    numbers = {"quota": 1, "limit": -1, "weight": 1, "allocated": 2, "fair_share": 1.5,
               "pending": 2}
    row = {"name": "leaf", "depth": 1, "priority": 100, "gpu": numbers,
           "cpu": {"allocated": 1, "fair_share": 2}, "memory": {"allocated": 3, "fair_share": 4}}
    text = render_queues([row], ["queue x: bad"])
    header, line = text.splitlines()[:2]
    assert header.split()[:3] == ["QUEUE", "PRIO", "GPU"]
    assert line.split() == ["leaf", "100", "1", "-", "1", "2", "1.5", "2", "1/2", "3/4"]
    assert "queue x: bad" in text
