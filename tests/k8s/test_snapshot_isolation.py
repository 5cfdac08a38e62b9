"""One malformed object is one Problem, never a failed snapshot: the cache's snapshot with bad
pods, PodGroups and nodes beside good ones. What a bad object holds on a node stays counted
(as foreign use), so its room is not given away twice."""

from __future__ import annotations

from kubernetes import client

from kai_ray.k8s.cache import ClusterCache


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


def _pg(name: str, ns: str = "ns", min_member: object = 1) -> dict:
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}"},
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
    jobs = {j.name: j for j in snapshot.jobs}
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
