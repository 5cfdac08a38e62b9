"""KAI's pod grouper and kai-ray's side by side on the same KubeRay objects (issue 23).

Each grouper gets a fresh local plane with the real KubeRay operator (`--batch-scheduler
kai-scheduler`, so every Ray pod has `schedulerName: kai-scheduler` and the queue label) and no
nodes (nothing is bound, so nothing but grouping moves): first KAI-Scheduler v0.12.0's own pod
grouper, alone (`tools/peers/build.sh kai-scheduler`, with KAI's CRDs and queues), then `kai-ray
run`. The same RayClusters, RayJobs and RayServices are created in each, one namespace per
shape; once the namespaces' PodGroups stop changing, each shape's PodGroups (minMember,
sub-groups, queue, priority class) are printed side by side, with `same` when they agree.

    python3 benchmarks/podgrouper_compare.py [--json FILE] [--settle SECONDS]

Needs tools/cluster/build.sh (the plane, KubeRay) and tools/peers/build.sh kai-scheduler.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

from kai_ray.testing.kuberay import start_kuberay_operator
from kai_ray.testing.peers import KaiRay, KaiScheduler, Peer
from kai_ray.testing.plane import ControlPlane

Obj = dict[str, Any]
QUEUE = "bench"  # the leaf queue both peers' install() creates
PRIORITY_CLASS = "team-high"


def _container(name: str, gpus: int) -> Obj:
    res: Obj = {"requests": {"cpu": "500m", "memory": "512Mi"}}
    if gpus:
        res["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {"name": name, "image": "rayproject/ray:2.52.0", "resources": res}


def _group(name: str, replicas: int, min_replicas: int | None = None, max_replicas: int = 0,
           hosts: int = 1, gpus: int = 1, annotations: Obj | None = None) -> Obj:
    template: Obj = {"spec": {"containers": [_container("ray-worker", gpus)]}}
    if annotations:
        template["metadata"] = {"annotations": annotations}
    group: Obj = {"groupName": name, "replicas": replicas,
                  "minReplicas": replicas if min_replicas is None else min_replicas,
                  "maxReplicas": max(replicas, max_replicas), "rayStartParams": {},
                  "template": template}
    if hosts != 1:
        group["numOfHosts"] = hosts
    return group


def _cluster_spec(groups: list[Obj], autoscaling: bool = False) -> Obj:
    spec: Obj = {"headGroupSpec": {"rayStartParams": {},
                                   "template": {"spec": {"containers": [_container("ray-head",
                                                                                  0)]}}},
                 "workerGroupSpecs": groups}
    if autoscaling:
        spec["enableInTreeAutoscaling"] = True
    return spec


def _labels(queue: bool = True, priority: bool = False) -> Obj:
    labels: Obj = {"kai.scheduler/queue": QUEUE} if queue else {}
    if priority:
        labels["ray.io/priority-class-name"] = PRIORITY_CLASS
    return labels


def _cluster(groups: list[Obj], autoscaling: bool = False, **labels: bool) -> Obj:
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": "rc", "labels": _labels(**labels)},
            "spec": _cluster_spec(groups, autoscaling)}


def _rayjob(groups: list[Obj], suspend: bool = False) -> Obj:
    # SidecarMode: KubeRay refuses K8sJobMode with KAI-Scheduler (its submitter pod would come
    # after the RayCluster is ready, outside the gang)
    spec: Obj = {"submissionMode": "SidecarMode", "entrypoint": "python -c 'print(1)'",
                 "rayClusterSpec": _cluster_spec(groups)}
    if suspend:
        spec["suspend"] = True
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": "job", "labels": _labels()}, "spec": spec}


def _rayservice(groups: list[Obj]) -> Obj:
    return {"apiVersion": "ray.io/v1", "kind": "RayService",
            "metadata": {"name": "svc", "labels": _labels()},
            "spec": {"serveConfigV2": "applications: []\n",
                     "rayClusterConfig": _cluster_spec(groups)}}


# (shape, what it is, the object); each in a namespace of its own named after the shape
SHAPES: list[tuple[str, str, Obj]] = [
    ("one-group", "1 worker group, 2 replicas",
     _cluster([_group("w", 2)])),
    ("two-groups", "2 worker groups (2 and 1 replicas)",
     _cluster([_group("a", 2), _group("b", 1)])),
    ("multihost", "numOfHosts 2, 2 replicas (4 worker pods)",
     _cluster([_group("tpu", 2, hosts=2)])),
    ("min0-autoscaling", "minReplicas 0, replicas 1, max 4, autoscaling on",
     _cluster([_group("w", 1, min_replicas=0, max_replicas=4)], autoscaling=True)),
    ("min0-static", "minReplicas 0, replicas 2, no autoscaling",
     _cluster([_group("w", 2, min_replicas=0, max_replicas=4)])),
    ("min1-of-3-autoscaling", "minReplicas 1, replicas 3, max 5, autoscaling on",
     _cluster([_group("w", 3, min_replicas=1, max_replicas=5)], autoscaling=True)),
    ("mixed-min", "groups with minReplicas 2 of 2 and 0 of 1, autoscaling on",
     _cluster([_group("a", 2), _group("b", 1, min_replicas=0, max_replicas=3)],
              autoscaling=True)),
    ("priority-class", "ray.io/priority-class-name label on the RayCluster",
     _cluster([_group("w", 2)], priority=True)),
    ("no-queue-label", "no kai.scheduler/queue label",
     _cluster([_group("w", 1)], queue=False)),
    ("gpu-fraction", "workers with gpu-fraction 0.5 (no whole GPU)",
     _cluster([_group("w", 2, gpus=0, annotations={"gpu-fraction": "0.5"})])),
    ("rayjob", "RayJob (SidecarMode), 2 workers",
     _rayjob([_group("w", 2)])),
    ("rayjob-suspended", "RayJob (SidecarMode) created suspended",
     _rayjob([_group("w", 2)], suspend=True)),
    ("rayservice", "RayService, 2 workers",
     _rayservice([_group("w", 2)])),
]

PLURALS = {"RayCluster": "rayclusters", "RayJob": "rayjobs", "RayService": "rayservices"}


def podgroups_by_shape(api: client.ApiClient) -> dict[str, list[Obj]]:
    custom = client.CustomObjectsApi(api)
    listed = custom.list_cluster_custom_object("scheduling.run.ai", "v2alpha2", "podgroups")
    out: dict[str, list[Obj]] = {shape: [] for shape, _, _ in SHAPES}
    for pg in listed["items"]:
        ns = pg["metadata"]["namespace"]
        if ns in out:
            spec = pg.get("spec") or {}
            out[ns].append({
                "minMember": spec.get("minMember"), "queue": spec.get("queue"),
                "priorityClassName": spec.get("priorityClassName"),
                "subGroups": sorted((g.get("name"), g.get("minMember"))
                                    for g in spec.get("subGroups") or []),
                "owner": next((f"{o.get('kind')}/{o.get('name')}"
                               for o in pg["metadata"].get("ownerReferences") or []), None)})
    for groups in out.values():
        groups.sort(key=lambda g: str(g["owner"]))
    return out


def ray_pods(api: client.ApiClient) -> dict[str, int]:
    pods = client.CoreV1Api(api).list_pod_for_all_namespaces(label_selector="ray.io/cluster")
    counts = {shape: 0 for shape, _, _ in SHAPES}
    for p in pods.items:
        if p.metadata.namespace in counts:
            counts[p.metadata.namespace] += 1
    return counts


def run(peer: Peer, start: Callable[[ControlPlane], None], settle: float) -> dict[str, Any]:
    plane = ControlPlane()
    plane.start()
    try:
        api = plane.api_client()
        core = client.CoreV1Api(api)
        peer.install(plane, "default")
        client.SchedulingV1Api(api).create_priority_class(
            {"metadata": {"name": PRIORITY_CLASS}, "value": 200})
        for shape, _, _ in SHAPES:
            core.create_namespace({"metadata": {"name": shape}})
            plane.wait_service_account(shape)
        start(plane)
        start_kuberay_operator(plane, batch_scheduler="kai-scheduler")
        custom = client.CustomObjectsApi(api)
        for shape, _, obj in SHAPES:
            custom.create_namespaced_custom_object("ray.io", "v1", shape, PLURALS[obj["kind"]],
                                                   copy.deepcopy(obj))
        # until the PodGroups have not changed for `settle` seconds (at most 3 minutes)
        deadline = time.monotonic() + 180
        last, since = None, time.monotonic()
        while time.monotonic() < deadline:
            now = (podgroups_by_shape(api), ray_pods(api))
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= settle:
                break
            time.sleep(1)
        assert last is not None
        return {"podgroups": last[0], "pods": last[1]}
    finally:
        peer.stop(plane)
        plane.stop()


def _describe(groups: list[Obj]) -> str:
    if not groups:
        return "no PodGroup"
    parts = []
    for g in groups:
        sub = ", ".join(f"{n}:{m}" for n, m in g["subGroups"])
        parts.append(f"min {g['minMember']}" + (f" [{sub}]" if sub else "")
                     + f", queue {g['queue']}"
                     + (f", {g['priorityClassName']}" if g["priorityClassName"] else "")
                     + f" ({g['owner']})")
    return "; ".join(parts)


def _comparable(groups: list[Obj], subgroups: bool) -> list[tuple[Any, ...]]:
    """What must agree: minMember, queue, priority class, the owner's kind and, with
    `subgroups`, the sub-groups (KAI v0.12.0 writes none for Ray: docs/kai-deviations.md)."""
    return sorted((g["minMember"], tuple(map(tuple, g["subGroups"])) if subgroups else (),
                   g["queue"], g["priorityClassName"], str(g["owner"]).split("/")[0])
                  for g in groups)


def table(theirs: dict[str, Any], mine: dict[str, Any]) -> list[str]:
    rows = ["| shape | Ray pods (KAI / kai-ray) | KAI-Scheduler v0.12.0 pod grouper | kai-ray | "
            "same but sub-groups | same |", "|---|---|---|---|---|---|"]
    for shape, what, _ in SHAPES:
        k, o = theirs["podgroups"][shape], mine["podgroups"][shape]
        near = _comparable(k, False) == _comparable(o, False)
        agree = _comparable(k, True) == _comparable(o, True)
        pods = f"{theirs['pods'][shape]} / {mine['pods'][shape]}"
        rows.append(f"| {shape}: {what} | {pods} | {_describe(k)} | {_describe(o)} | "
                    f"{'yes' if near else '**no**'} | {'yes' if agree else 'no'} |")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write both groupers' PodGroups here")
    parser.add_argument("--settle", type=float, default=10.0,
                        help="seconds without a PodGroup change that end a run")
    parser.add_argument("--from-json", metavar="FILE",
                        help="print the table of a run saved with --json; run nothing")
    args = parser.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        print("\n".join(table(saved["kai-scheduler"], saved["kai-ray"])))
        return 0

    kai = KaiScheduler()

    def start_kai(plane: ControlPlane) -> None:
        # KAI's pod grouper only: no scheduler, no binder
        kai._spawn(plane, "kai-podgrouper", [
            kai._bin("podgrouper"), "--leader-elect=false", "--metrics-bind-address=0",
            "--health-probe-bind-address=0"], {"KUBECONFIG": str(plane.kubeconfig)})

    ours = KaiRay()
    print("== KAI-Scheduler v0.12.0 pod grouper", file=sys.stderr)
    theirs = run(kai, start_kai, args.settle)
    print("== kai-ray", file=sys.stderr)
    mine = run(ours, lambda plane: ours.start(plane, 1000, 2000), args.settle)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kai-scheduler": theirs, "kai-ray": mine}, f, indent=1)

    rows = table(theirs, mine)
    print("\n".join(rows))
    print(f"\n{sum(r.endswith('| yes |') for r in rows)} of {len(SHAPES)} shapes agree "
          "in full", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
