"""One malformed object is one Problem, never a failed snapshot: the cache's snapshot with bad
pods, PodGroups and nodes beside good ones. What a bad object holds on a node stays counted
(as foreign use), so its room is not given away twice: what it is bound to, what its gang's
bind intent holds for it, and a shared GPU only it shares. And the informer's re-list on 410."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray import api_names
from kai_ray.core.model import PodStatus, Snapshot
from kai_ray.k8s.cache import ClusterCache, Informer


def _node(name: str, gpus: int = 8) -> dict:
    return {"metadata": {"name": name, "uid": name}, "spec": {},
            "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu":
                                       str(gpus), "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def _pod(name: str, ns: str = "ns", group: str | None = None, node: str | None = None,
         gpus: int = 0, annotations: dict | None = None, scheduler: str = "kai-scheduler",
         phase: str = "Pending") -> dict:
    ann = dict(annotations or {})
    if group:
        ann["pod-group-name"] = group
    res: dict = {"requests": {"cpu": "1", "memory": "1Gi"}}
    if gpus:
        res["limits"] = {"nvidia.com/gpu": str(gpus)}
    spec: dict = {"schedulerName": scheduler, "containers": [{"name": "c", "resources": res}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}",
                         "annotations": ann, "labels": {}},
            "spec": spec, "status": {"phase": phase}}


def _pg(name: str, ns: str = "ns", min_member: object = 1, intent: dict | None = None
        ) -> dict:
    ann = {api_names.BIND_INTENT_ANNOTATION: json.dumps(intent)} if intent else {}
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}",
                         "annotations": ann},
            "spec": {"queue": "q", "minMember": min_member}}


def _cache(nodes: list, pods: list, pgs: list) -> ClusterCache:
    cache = ClusterCache(client.ApiClient(client.Configuration()))
    for inf, objs in ((cache.nodes, nodes), (cache.pods, pods), (cache.podgroups, pgs)):
        inf.items = {(f"{o['metadata']['namespace']}/" if o["metadata"].get("namespace")
                      else "") + o["metadata"]["name"]: o for o in objs}
    cache.queues.items = {"q": {"metadata": {"name": "q"}, "spec": {}}}
    return cache


def test_bad_annotations_are_problems_naming_the_field_and_the_rest_schedules() -> None:
    cache = _cache(
        [_node("n1"), _node("n2")],
        [_pod("foreign", scheduler="default-scheduler", node="n1", gpus=2, phase="Running",
              annotations={"gpu-fraction": "abc"}),
         _pod("ours-bad", group="bad", annotations={"gpu-fraction": "1.5"}),
         _pod("ours-bad-running", group="bad2", node="n2", gpus=1, phase="Running",
              annotations={"gpu-memory": "-5"}),
         _pod("good", group="good", gpus=1)],
        [_pg("bad"), _pg("bad2"), _pg("good")])
    snapshot, problems, _ = cache.snapshot()
    by_name = {p.name: p for p in problems}
    assert by_name["foreign"].field == "metadata.annotations[gpu-fraction]"
    assert "counted by its resources" in by_name["foreign"].message
    assert by_name["ours-bad"].field == "metadata.annotations[gpu-fraction]"
    assert "'1.5'" in by_name["ours-bad"].message and by_name["ours-bad"].uid == "uid-ours-bad"
    assert by_name["ours-bad-running"].field == "metadata.annotations[gpu-memory]"
    jobs = {j.name.split("/")[-1]: j for j in snapshot.jobs}  # keyed by ns/name
    assert [p.name for p in jobs["good"].pods] == ["good"]
    assert jobs["bad"].pods == ()  # the bad pod is left out: its gang waits, never "no GPU"
    nodes = {n.name: n for n in snapshot.nodes}
    assert nodes["n1"].foreign_gpus == 2  # the kubelet gave the foreign pod 2 whole GPUs
    assert nodes["n2"].foreign_gpus == 1  # the unreadable running pod keeps its GPU


def test_an_unreadable_podgroup_keeps_what_its_bound_pods_hold() -> None:
    cache = _cache([_node("n1")],
                   [_pod("p", group="broken", node="n1", gpus=3, phase="Running")],
                   [_pg("broken", min_member="many")])
    snapshot, problems, podgroups = cache.snapshot()
    (problem,) = problems
    assert (problem.kind, problem.name) == ("PodGroup", "broken")
    assert "broken" not in podgroups and not snapshot.jobs
    assert snapshot.nodes[0].foreign_gpus == 3


def test_a_bad_node_is_a_problem_and_other_nodes_stay() -> None:
    bad = _node("bad")
    bad["status"]["allocatable"]["cpu"] = "lots"
    cache = _cache([bad, _node("ok")], [], [])
    snapshot, problems, _ = cache.snapshot()
    assert [n.name for n in snapshot.nodes] == ["ok"]
    assert [(p.kind, p.name) for p in problems] == [("Node", "bad")]


def test_queues_on_a_parent_cycle_are_problems_naming_parent_queue() -> None:
    cache = _cache([_node("n1")], [_pod("p", group="g", gpus=1)], [_pg("g")])
    cache.queues.items = {
        "q": {"metadata": {"name": "q"}, "spec": {}},
        "a": {"metadata": {"name": "a", "uid": "uid-a"}, "spec": {"parentQueue": "b"}},
        "b": {"metadata": {"name": "b"}, "spec": {"parentQueue": "a"}},
        "self": {"metadata": {"name": "self"}, "spec": {"parentQueue": "self"}}}
    _, problems, _ = cache.snapshot()
    by_name = {p.name: p for p in problems}
    assert set(by_name) == {"a", "b", "self"}
    assert by_name["a"].field == "spec.parentQueue" and "a -> b -> a" in by_name["a"].message
    assert by_name["a"].uid == "uid-a" and "self -> self" in by_name["self"].message


def _foreign(snapshot: Snapshot) -> dict[str, tuple[int, int, int, int]]:
    return {n.name: (n.foreign_cpu_m, n.foreign_memory, n.foreign_gpus, n.foreign_pods)
            for n in snapshot.nodes}


def test_an_unreadable_podgroups_bind_intent_keeps_its_room_on_the_intent_node() -> None:
    intent = {"p": {"node": "n1", "gpu_groups": []},
              # hand-edited entries hold nothing, and raise nothing
              "q1": "n2", "q2": {"gpu_groups": []}, "q3": {"node": 7}, "q4": {"node": ""},
              "gone": {"node": "n2"}}
    cache = _cache([_node("n1"), _node("n2")],
                   [_pod("p", group="broken", gpus=3)]
                   + [_pod(q, group="broken", gpus=1) for q in ("q1", "q2", "q3", "q4")],
                   [_pg("broken", min_member="many", intent=intent)])
    snapshot, problems, podgroups = cache.snapshot()
    assert [(p.kind, p.name) for p in problems] == [("PodGroup", "broken")]
    assert not podgroups  # the binder resumes none of it: the intent is held, not bound
    assert _foreign(snapshot) == {"n1": (1000, 2**30, 3, 1), "n2": (0, 0, 0, 0)}


def test_a_bad_pod_in_a_good_gangs_intent_keeps_its_room_until_bound() -> None:
    bad = _pod("bad", group="g", gpus=2)
    done = _pod("done", group="g", gpus=4, phase="Failed")  # finished: holds nothing
    for pod in (bad, done):
        pod["metadata"]["labels"][api_names.TASK_PRIORITY_LABEL] = "high"
    intent = {"good": {"node": "n1", "gpu_groups": []}, "bad": {"node": "n2"},
              "done": {"node": "n2"}}
    cache = _cache([_node("n1"), _node("n2")], [_pod("good", group="g", gpus=1), bad, done],
                   [_pg("g", intent=intent)])
    snapshot, problems, _ = cache.snapshot()
    assert sorted((p.kind, p.name) for p in problems) == [("Pod", "bad"), ("Pod", "done")]
    (job,) = snapshot.jobs
    assert [(p.name, p.status, p.node) for p in job.pods] == [
        ("good", PodStatus.BINDING, "n1")]
    assert _foreign(snapshot)["n2"] == (1000, 2**30, 2, 1)
    assert _foreign(snapshot)["n1"] == (0, 0, 0, 0)  # the good pod: the core holds its room
    bad["spec"]["nodeName"] = "n2"  # bound since (and still in the intent): counted once
    snapshot, _, _ = cache.snapshot()
    assert _foreign(snapshot)["n2"] == (1000, 2**30, 2, 1)


def _reservation(group: str) -> dict:
    """A live reservation pod on n1, labelled with its group as the binder creates it."""
    pod = _pod(f"gpu-reservation-{group}", ns=api_names.RESERVATION_NAMESPACE, node="n1", gpus=1,
               scheduler="default-scheduler", phase="Running")
    pod["metadata"]["labels"] = {"app": "kai-resource-reservation",
                                 api_names.GPU_GROUP_LABEL: group}
    return pod


def _sharer(name: str, group: str, pg: str, node: str | None = "n1") -> dict:
    pod = _pod(name, group=pg, node=node, phase="Running" if node else "Pending",
               annotations={"gpu-fraction": "0.5"})
    if node:
        pod["metadata"]["labels"] = {api_names.GPU_GROUP_LABEL: group}
    return pod


def test_a_shared_gpu_whose_sharers_are_all_left_out_is_held_by_its_reservation_pod() -> None:
    bad = _sharer("bad", "grp-bad", "g")
    bad["metadata"]["labels"][api_names.TASK_PRIORITY_LABEL] = "x"
    cache = _cache([_node("n1")],
                   [_reservation("grp-bad"), bad,  # a bad pod of a good gang
                    _reservation("grp-broken"), _sharer("s", "grp-broken", "broken"),
                    _reservation("grp-orphan"),  # no sharer left (not collected yet)
                    _reservation("grp-ok"), _sharer("ok", "grp-ok", "good")],
                   [_pg("g"), _pg("broken", min_member=0), _pg("good")])
    snapshot, problems, _ = cache.snapshot()
    assert {(p.kind, p.name) for p in problems} == {("Pod", "bad"), ("PodGroup", "broken")}
    # the kubelet gave each unshared device's reservation pod its GPU (the left-out sharers,
    # bound, are 2 pods of 0 GPUs); the device "ok" shares is the core's to count, not twice
    assert _foreign(snapshot)["n1"][2:] == (3, 5)


def test_a_left_out_intent_holds_its_new_shared_device_before_its_reservation_pod() -> None:
    intent = {"p": {"node": "n1", "gpu_groups": ["grp-new"], "portion": 0.5},
              "q": {"node": "n1", "gpu_groups": ["grp-new"], "portion": 0.5}}
    pods = [_sharer("p", "grp-new", "broken", node=None),
            _sharer("q", "grp-new", "broken", node=None)]
    cache = _cache([_node("n1")], pods, [_pg("broken", min_member=0, intent=intent)])
    snapshot, _, _ = cache.snapshot()
    # both pods (no GPU of their own counted: a fraction) and the one device they share
    assert _foreign(snapshot)["n1"][2:] == (1, 2)
    cache.pods.items[f"{api_names.RESERVATION_NAMESPACE}/r"] = _reservation("grp-new")
    snapshot, _, _ = cache.snapshot()
    assert _foreign(snapshot)["n1"][2:] == (1, 3)  # the device once, as its reservation pod


class _Resp:
    """A response to a list (`data`) or a watch (`stream`)."""

    def __init__(self, body: dict | None = None, events: list[dict] | None = None) -> None:
        self.data = json.dumps(body or {}).encode()
        self.events = events or []

    def stream(self, amt: object = None, decode_content: object = None) -> list[bytes]:
        return [json.dumps(e).encode() + b"\n" for e in self.events]

    def release_conn(self) -> None:
        pass


def _informer(list_fn: Callable[..., _Resp], monkeypatch: pytest.MonkeyPatch
              ) -> tuple[Informer, list[int]]:
    """An informer on `list_fn`, and the failure counts it backed off at (no waiting)."""
    inf = Informer("pods", list_fn, lambda *_: None)
    backoffs: list[int] = []
    monkeypatch.setattr(inf, "_failed", lambda error, failures: backoffs.append(failures))
    return inf, backoffs


def test_repeated_410s_on_list_back_off(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def list_fn(**kw: object) -> _Resp:
        calls.append(kw)
        if len(calls) == 5:
            inf.stopping.set()
        raise ApiException(status=410, reason="Expired")

    inf, backoffs = _informer(list_fn, monkeypatch)
    inf._run()
    assert len(calls) == 5 and backoffs == [2, 3, 4]  # the first 410 re-lists at once


def test_a_watch_answering_410_after_every_list_backs_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lists, watches = [], []
    gone = {"type": "ERROR", "object": {"code": 410, "message": "too old"}}
    added = {"type": "ADDED", "object": {"metadata": {"name": "a", "namespace": "ns",
                                                      "resourceVersion": "2"}}}

    def list_fn(**kw: object) -> _Resp:
        if not kw.get("watch"):
            lists.append(kw)
            return _Resp({"items": [], "metadata": {"resourceVersion": "1"}})
        watches.append(kw)
        if len(watches) == 5:
            inf.stopping.set()
        # the first watch makes progress before its 410: the next list is at once
        return _Resp(events=[added, gone] if len(watches) == 1 else [gone])

    inf, backoffs = _informer(list_fn, monkeypatch)
    inf._run()
    assert len(lists) == 5 and backoffs == [2, 3, 4]
