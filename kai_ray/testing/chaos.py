"""A chaos harness for bind transactions and leader fencing (issue 20).

Two (or more) `kai-ray run` replicas with leader election on bind gangs under contention (more
GPUs asked for than exist) on KWOK GPU nodes, while the leader is killed (SIGKILL), stopped
(SIGTERM) or frozen past its lease (SIGSTOP, then SIGCONT) at random moments, and replicas are
rolled (a new one up, then SIGTERM to the old leader). Throughout, the pods themselves are
checked (`check_invariants`):

- no node has more whole GPUs bound than its allocatable `nvidia.com/gpu` (a shared device,
  one GPU group, counts once whether seen through its reservation pod or its sharers);
- no shared device (GPU group) has more than a whole GPU of fractions bound;
- no gang is partly bound (fewer than minMember but at least one pod) for longer than the bind
  deadline;
- no pod is bound to a node its nodeSelector excludes.

After each action the harness waits for a replica to lead and bind again, and measures the
takeover: from the signal to the first bind seen once another replica holds the Lease. Half of
the actions (`mid_bind_share`) land just after the first bind of a burst is seen, so that they
hit a leader in the middle of its binds; each round says how many gangs had a bind intent and
how many were partly bound at the signal.

Reported besides, without failing the run: cycles that the signalled replica's log shows
ending after it lost the lease (the stale leader's work that fencing must hold back), replicas
that exited by themselves, and ERROR lines of every replica's log.

    python3 -m kai_ray.testing.chaos --rounds 20 --rolling 10 --seed 1 --out results.json

starts its own local ControlPlane (kai_ray.testing.plane) unless `--kubeconfig` names a cluster
(which must run KWOK for the fake GPU nodes, and no other kai-scheduler). Exit status 1 when any
invariant was violated or a leader did not bind again after an action.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import config
from kubernetes.client.rest import ApiException
from kubernetes.utils.quantity import parse_quantity
from kubernetes.watch.watch import iter_resp_lines

from kai_ray import api_names
from kai_ray.api_names import PODGROUP, QUEUE, QUEUE_LABEL
from kai_ray.controller.leader import LeaseConfig
from kai_ray.grouping import admission
from kai_ray.k8s import convert, rawapi
from kai_ray.testing.nodes import create_gpu_nodes, wait_nodes_ready
from kai_ray.testing.scheduler_process import KaiRayProcess

Obj = dict[str, Any]
GPU = "nvidia.com/gpu"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
FINISHED = ("Succeeded", "Failed")
ACTIONS = ("SIGKILL", "SIGTERM", "SIGSTOP")
POOL_LABEL = "kai-ray.io/pool"
RUN_LABEL = "kai-ray.io/chaos"
GANG_LABEL = "kai-ray.io/chaos-gang"


# ------------------------------------------------------------------------------ invariants
@dataclass(frozen=True)
class Violation:
    """One broken invariant. `key` (kind, subject, detail) identifies it across samples; `age`
    is said in the message only, so a partial gang that keeps ageing stays one violation."""

    kind: str  # node-gpus | shared-gpu | partial-gang | node-selector
    subject: str  # node, node/group, namespace/podgroup, namespace/pod
    detail: str
    age: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.subject, self.detail)

    def __str__(self) -> str:
        return f"{self.kind} {self.subject}: {self.detail}{'; ' + self.age if self.age else ''}"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _ref(obj: Mapping[str, Any]) -> str:
    m = _meta(obj)
    return f"{m.get('namespace')}/{m.get('name')}" if m.get("namespace") else str(m.get("name"))


def parse_time(value: Any) -> float | None:
    """Epoch seconds of an API timestamp ("2025-01-02T03:04:05Z", a datetime, a number)."""
    if value is None or value == "":
        return None
    if isinstance(value, int | float):
        return float(value)
    if not isinstance(value, dt.datetime):
        try:
            value = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.timestamp()


def _quantity(value: Any) -> float:
    try:
        return float(parse_quantity(value))
    except (ValueError, TypeError, ArithmeticError):
        return 0.0


def whole_gpus(pod: Mapping[str, Any]) -> float:
    """The pod's nvidia.com/gpu as the kubelet counts it: the containers' sum (requests, else
    limits), at least the largest init container's."""
    spec = pod.get("spec") or {}

    def one(c: Mapping[str, Any]) -> float:
        res = c.get("resources") or {}
        for part in ("requests", "limits"):
            v = (res.get(part) or {}).get(GPU)
            if v is not None:
                return _quantity(v)
        return 0.0

    total = sum(one(c) for c in spec.get("containers") or [])
    return max([total, *(one(c) for c in spec.get("initContainers") or [])])


def _sharing(pod: Mapping[str, Any]) -> bool:
    ann = _meta(pod).get("annotations") or {}
    return bool(ann.get(admission.GPU_FRACTION) or ann.get(admission.GPU_MEMORY))


def _fraction(pod: Mapping[str, Any], node: Mapping[str, Any] | None) -> float | None:
    """The part of a device a sharing pod holds (gpu-fraction, or gpu-memory over the node's
    per-device memory); None when it cannot be told."""
    ann = _meta(pod).get("annotations") or {}
    try:
        if ann.get(admission.GPU_FRACTION):
            return float(ann[admission.GPU_FRACTION])
        if ann.get(admission.GPU_MEMORY) and node is not None:
            per_device = float((_meta(node).get("labels") or {}).get(GPU_MEMORY_LABEL) or 0)
            return float(ann[admission.GPU_MEMORY]) / per_device if per_device > 0 else None
    except ValueError:
        return None
    return None


def _bind_time(pod: Mapping[str, Any]) -> float:
    """When the pod was bound: its PodScheduled=True condition, else its creation."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "True":
            t = parse_time(c.get("lastTransitionTime"))
            if t is not None:
                return t
    return parse_time(_meta(pod).get("creationTimestamp")) or 0.0


def _holding(pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Pods bound and not finished (a terminating pod still holds what it was given)."""
    return [p for p in pods if (p.get("spec") or {}).get("nodeName")
            and (p.get("status") or {}).get("phase") not in FINISHED]


def find_violations(pods: Sequence[Mapping[str, Any]], nodes: Sequence[Mapping[str, Any]],
                    podgroups: Sequence[Mapping[str, Any]], now: float,
                    bind_deadline_s: float) -> list[Violation]:
    """The invariants over plain API dicts (raw JSON or `sanitize_for_serialization`); see
    `check_invariants`."""
    out: list[Violation] = []
    by_node = {_meta(n).get("name"): n for n in nodes}
    holding = _holding(pods)
    whole: dict[str, float] = defaultdict(float)
    whole_pods: dict[str, list[str]] = defaultdict(list)
    devices: dict[str, set[str]] = defaultdict(set)  # node -> GPU groups (shared devices)
    shares: dict[tuple[str, str], list[tuple[str, float]]] = defaultdict(list)
    for p in holding:
        node_name = p["spec"]["nodeName"]
        ns = _meta(p).get("namespace")
        groups = convert.gpu_groups(p)
        if ns == api_names.RESERVATION_NAMESPACE and groups:
            devices[node_name].add(groups[0])  # the device its group's sharers use
            continue
        if _sharing(p):
            if not groups:  # bound without a device: as if it held one of its own
                devices[node_name].add(f"<no group: {_ref(p)}>")
            frac = _fraction(p, by_node.get(node_name))
            for g in groups:
                devices[node_name].add(g)
                if frac is not None:
                    shares[(node_name, g)].append((_ref(p), frac))
            continue
        n = whole_gpus(p)
        if n:
            whole[node_name] += n
            whole_pods[node_name].append(_ref(p))
    # (a) whole GPUs plus shared devices, per node
    for node_name in sorted(set(whole) | set(devices)):
        node = by_node.get(node_name)
        if node is None:
            continue  # the node is gone: nothing to compare with
        alloc = _quantity(((node.get("status") or {}).get("allocatable") or {}).get(GPU, 0))
        used = whole[node_name] + len(devices[node_name])
        if used > alloc + 1e-9:
            out.append(Violation(
                "node-gpus", node_name,
                f"{used:g} GPUs held > {alloc:g} allocatable ({whole[node_name]:g} whole by "
                f"{sorted(whole_pods[node_name])}, {len(devices[node_name])} shared "
                f"{sorted(devices[node_name])})"))
    # (b) fractions per shared device
    for (node_name, g), held in sorted(shares.items()):
        total = sum(f for _, f in held)
        if total > 1.0 + 1e-6:
            out.append(Violation("shared-gpu", f"{node_name}/{g}",
                                 f"fractions {total:g} > 1 ({sorted(held)})"))
    # (c) partial gangs older than the bind deadline
    members: dict[tuple[Any, Any], list[Mapping[str, Any]]] = defaultdict(list)
    for p in holding:
        m = _meta(p)
        group = (m.get("annotations") or {}).get(api_names.POD_GROUP_ANNOTATION)
        if group:
            members[(m.get("namespace"), group)].append(p)
    for pg in podgroups:
        m = _meta(pg)
        if m.get("deletionTimestamp"):
            continue
        try:
            minimum = int((pg.get("spec") or {}).get("minMember") or 1)
        except (TypeError, ValueError):
            minimum = 1
        bound = members.get((m.get("namespace"), m.get("name")), [])
        if 0 < len(bound) < minimum:
            age = now - min(_bind_time(p) for p in bound)
            if age > bind_deadline_s:
                out.append(Violation(
                    "partial-gang", _ref(pg),
                    f"{len(bound)}/{minimum} pods bound "
                    f"({sorted(str(_meta(p).get('name')) for p in bound)})",
                    f"first bound {age:.0f}s ago, deadline {bind_deadline_s:g}s"))
    # (d) nodeSelector
    for p in holding:
        node = by_node.get(p["spec"]["nodeName"])
        selector = (p.get("spec") or {}).get("nodeSelector") or {}
        if node is None or not selector:
            continue
        labels = _meta(node).get("labels") or {}
        wrong = {k: v for k, v in selector.items() if labels.get(k) != v}
        if wrong:
            out.append(Violation("node-selector", _ref(p),
                                 f"bound to {p['spec']['nodeName']}, whose labels do not "
                                 f"match {wrong}"))
    return out


def check_invariants(pods: Sequence[Mapping[str, Any]], nodes: Sequence[Mapping[str, Any]],
                     podgroups: Sequence[Mapping[str, Any]], now: float,
                     bind_deadline_s: float) -> list[str]:
    """What is wrong, one description per violation ([] when all holds), from the pods:

    (a) per node, whole GPUs of the pods bound there and not finished (terminating pods
        included), plus one GPU per distinct shared device (`runai-gpu-group`, counted once
        whether seen through its reservation pod in kai-resource-reservation or its sharers),
        more than the node's allocatable nvidia.com/gpu;
    (b) per shared device, fractions of its bound unfinished pods above 1;
    (c) a PodGroup with at least one but fewer than spec.minMember bound unfinished pods,
        the first of them bound (PodScheduled, else created) more than `bind_deadline_s` ago;
    (d) a pod bound to a node its nodeSelector does not match.

    `now` is epoch seconds (time.time()). Pure: plain dicts in, strings out.
    """
    return [str(v) for v in find_violations(pods, nodes, podgroups, now, bind_deadline_s)]


def gang_counts(pods: Sequence[Mapping[str, Any]], podgroups: Sequence[Mapping[str, Any]]
                ) -> dict[str, int]:
    """How many PodGroups are whole (>= minMember bound), partial, or pending (none bound)."""
    bound: Counter[tuple[Any, Any]] = Counter()
    for p in _holding(pods):
        m = _meta(p)
        group = (m.get("annotations") or {}).get(api_names.POD_GROUP_ANNOTATION)
        if group:
            bound[(m.get("namespace"), group)] += 1
    out = {"whole": 0, "partial": 0, "pending": 0}
    for pg in podgroups:
        m = _meta(pg)
        n = bound[(m.get("namespace"), m.get("name"))]
        minimum = int((pg.get("spec") or {}).get("minMember") or 1)
        out["whole" if n >= minimum else "partial" if n else "pending"] += 1
    return out


# ------------------------------------------------------------------------------ objects
def _queue(name: str, parent: str | None = None) -> Obj:
    open_ = {"quota": -1, "limit": -1, "overQuotaWeight": 1}
    spec: Obj = {"resources": {"gpu": dict(open_), "cpu": dict(open_), "memory": dict(open_)}}
    if parent:
        spec["parentQueue"] = parent
    return {"apiVersion": QUEUE.api_version, "kind": QUEUE.kind, "metadata": {"name": name},
            "spec": spec}


def _podgroup(name: str, queue: str, min_member: int, run: str) -> Obj:
    return {"apiVersion": PODGROUP.api_version, "kind": PODGROUP.kind,
            "metadata": {"name": name, "labels": {RUN_LABEL: run}},
            "spec": {"queue": queue, "minMember": min_member}}


def _pod(name: str, gang: str, queue: str, run: str, pool: str, gpus: int,
         fraction: float | None) -> Obj:
    resources: Obj = {"requests": {"cpu": "100m", "memory": "128Mi"}}
    annotations = {api_names.POD_GROUP_ANNOTATION: gang}
    if fraction:
        annotations[admission.GPU_FRACTION] = str(fraction)
    elif gpus:
        resources["limits"] = {GPU: str(gpus)}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations,
                         "labels": {QUEUE_LABEL: queue, RUN_LABEL: run, GANG_LABEL: gang}},
            "spec": {"schedulerName": api_names.SCHEDULER_NAME, "nodeSelector": {POOL_LABEL: pool},
                     "containers": [{"name": "main", "image": "busybox",
                                     "resources": resources}]}}


# ------------------------------------------------------------------------------ the runner
@dataclass
class ChaosConfig:
    gangs: int = 50  # gangs of whole GPUs
    gang_size: int = 4
    gpus_per_pod: int = 1
    fraction_pods: int = 8  # single-pod gangs of gpu-fraction `fraction`
    fraction: float = 0.5
    nodes: int = 16
    gpus_per_node: int = 8  # 16 x 8 = 128 GPUs < 50 x 4 asked
    queues: int = 1  # one: reclaim between queues would evict gangs (not what this tests)
    replicas: int = 2
    churn: int = 6  # bound gangs deleted and replaced before each action
    moment_s: tuple[float, float] = (0.0, 3.0)  # the action's moment after the churn
    # this share of the actions lands just after the first bind seen after the churn (a
    # cycle binds a few gangs in well under a second: a uniform moment mostly misses it)
    mid_bind_share: float = 0.5
    after_bind_s: tuple[float, float] = (0.0, 0.2)
    stop_extra_s: tuple[float, float] = (1.0, 4.0)  # SIGSTOP: lease duration plus this
    resume_after_takeover_s: tuple[float, float] = (0.0, 3.0)  # ... and at least this after
    bind_deadline_s: float = 30.0
    takeover_timeout_s: float = 60.0
    sample_every_s: float = 1.5
    term_timeout_s: float = 20.0
    actions: tuple[str, ...] = ACTIONS  # picked at random per round, or in order (`cycle`)
    cycle: bool = False
    seed: int = 1
    scheduler_args: tuple[str, ...] = ()
    lease_duration_s: float = LeaseConfig().lease_duration  # what `kai-ray run` uses


@dataclass
class RoundResult:
    round: int
    mode: str  # chaos | rolling
    action: str
    leader_before: str = ""
    leader_after: str = ""
    at_s: float = 0.0  # since the run began
    moment: str = ""  # when the signal came: churn+Xs, or bind+Xs (after a bind was seen)
    in_flight: int = 0  # gangs with a bind intent just after the signal
    partial_at_signal: int = 0  # gangs partly bound just after the signal
    exit_s: float | None = None  # SIGTERM: signal to exit
    stopped_s: float | None = None  # SIGSTOP: signal to SIGCONT
    lease_s: float | None = None  # signal to another holder seen on the Lease
    takeover_s: float | None = None  # signal to the first bind once another replica leads
    binds: int = 0  # binds seen during the round
    violations: list[str] = field(default_factory=list)
    # cycles with binds the signalled replica's log shows ending after it lost (or released)
    # the lease: not an invariant, but the stale leader's work that fencing is about
    stale_cycles: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Replica:
    """One `kai-ray run` process (a restart is a new Replica)."""

    def __init__(self, name: str, kubeconfig: Path, workdir: Path, args: list[str]) -> None:
        self.name = name
        self.workdir = workdir / name
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = KaiRayProcess(kubeconfig, self.workdir, args)
        self.frozen = False

    @property
    def pid(self) -> int:
        assert self.proc.proc is not None
        return self.proc.proc.pid

    def start(self) -> Replica:
        self.proc.start()
        return self

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc.proc is not None
        os.killpg(self.pid, sig)
        if sig == signal.SIGSTOP:
            self.frozen = True
        elif sig == signal.SIGCONT:
            self.frozen = False

    def alive(self) -> bool:
        return self.proc.alive()

    def log_size(self) -> int:
        try:
            return self.proc.log_path.stat().st_size
        except OSError:
            return 0

    def stale_cycles(self, offset: int) -> list[str]:
        """Cycles with binds or evictions that its log shows ending, after `offset`, once it
        had lost or released the lease."""
        try:
            with open(self.proc.log_path, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return []
        out = []
        lost = ""
        fenced = 0
        for line in text.splitlines():
            if _LOST.search(line):
                lost = lost or line[:23]
                continue
            if lost and _FENCED.search(line):
                fenced += 1
            m = _CYCLE.search(line)
            if lost and m and (int(m["binds"]) or int(m["evictions"])):
                out.append(f"{self.name}: a cycle reporting {m['binds']} binds / "
                           f"{m['evictions']} evictions (cycle {m['cycle']}, applied in "
                           f"{m['took']}s) ended at {line[:23]}, after it lost the lease at "
                           f"{lost}; {fenced} log lines since say fenced")
        return out

    def wait_exit(self, timeout: float) -> bool:
        assert self.proc.proc is not None
        try:
            self.proc.proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def stop(self) -> None:
        if self.frozen and self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.signal(signal.SIGCONT)
        self.proc.stop()

    def __repr__(self) -> str:
        return f"{self.name}(pid {self.proc.proc.pid if self.proc.proc else '-'})"


_LOST = re.compile(r"lost leadership|released lease|lease taken by")
_FENCED = re.compile(r"fenced", re.IGNORECASE)
_CYCLE = re.compile(r"cycle (?P<cycle>\d+): .*?(?P<binds>\d+) binds / (?P<evictions>\d+) "
                    r"evictions .*applied in (?P<took>[\d.]+)s")


def _pid_of(identity: str) -> int | None:
    """The pid in a default identity `<hostname>-<pid>-<random>` (leader.default_identity)."""
    parts = identity.rsplit("-", 2)
    try:
        return int(parts[1]) if len(parts) == 3 else None
    except ValueError:
        return None


class Chaos:
    """Replicas, workload and observers on one cluster; `run()` does the rounds."""

    def __init__(self, kubeconfig: Path, workdir: Path, cfg: ChaosConfig | None = None,
                 out: Callable[[str], None] = print) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.workdir = Path(workdir)
        self.cfg = cfg or ChaosConfig()
        self.print = out
        self.rng = random.Random(self.cfg.seed)
        self.run_id = f"{self.cfg.seed}-{uuid.uuid4().hex[:5]}"
        self.namespace = f"chaos-{self.run_id}"
        self.pool = f"chaos-{self.run_id}"
        self.lease_name = "kai-ray-chaos"
        self.queues = [f"chaos-{self.run_id}-{i}" for i in range(self.cfg.queues)]
        self.root_queue = f"chaos-{self.run_id}-root"
        self.api = config.new_client_from_config(config_file=str(self.kubeconfig))
        self.replicas: list[Replica] = []
        self._replica_seq = 0
        self.gangs: dict[str, tuple[int, float | None]] = {}  # name -> (size, fraction)
        self._gang_seq = 0
        self.node_names: list[str] = []
        self.results: list[RoundResult] = []
        self.kills: Counter[str] = Counter()
        self.violations: dict[tuple[str, str, str], str] = {}  # key -> "[round] message"
        self.takeover_failures: list[str] = []
        self.unexpected_exits: list[str] = []
        self.final: dict[str, Any] = {}
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.binds: list[tuple[float, str]] = []  # (monotonic, pod) in order seen
        self.holders: list[tuple[float, str]] = [(time.monotonic(), "")]
        self._threads: list[threading.Thread] = []
        self._last_sample = 0.0
        self._round_label = "setup"

    # -- API helpers ----------------------------------------------------------------------------
    def _get(self, path: str) -> Obj:
        return rawapi.request_json(self.api, "GET", path, timeout=(5, 30))

    def _post(self, path: str, body: Obj) -> None:
        rawapi.request(self.api, "POST", path, body, timeout=(5, 30))

    def _delete(self, path: str) -> None:
        try:
            rawapi.request(self.api, "DELETE", path, timeout=(5, 30))
        except ApiException as e:
            if e.status != 404:
                raise

    def snapshot(self) -> tuple[list[Obj], list[Obj], list[Obj]]:
        """Fresh lists of every pod, node and PodGroup (plain dicts)."""
        pods = self._get("/api/v1/pods").get("items") or []
        nodes = self._get("/api/v1/nodes").get("items") or []
        pgs = self._get(PODGROUP.path()).get("items") or []
        return pods, nodes, pgs

    def _our_pods(self) -> list[Obj]:
        return self._get(f"/api/v1/namespaces/{self.namespace}/pods").get("items") or []

    # -- set-up ---------------------------------------------------------------------------------
    def setup(self) -> None:
        c = self.cfg
        self.node_names = create_gpu_nodes(self.api, c.nodes, c.gpus_per_node,
                                           prefix=f"{self.pool}-", labels={POOL_LABEL: self.pool})
        wait_nodes_ready(self.api, self.node_names, timeout=120)
        self._post(QUEUE.path(), _queue(self.root_queue))
        for q in self.queues:
            self._post(QUEUE.path(), _queue(q, self.root_queue))
        self._post("/api/v1/namespaces", {"metadata": {"name": self.namespace,
                                                       "labels": {RUN_LABEL: self.run_id}}})
        self._wait("the namespace's ServiceAccount", self._has_service_account, 60)
        for _ in range(c.replicas):
            self._start_replica()
        for r in self.replicas:
            r.proc.wait_ready(120)
        self._start_observers()
        with ThreadPoolExecutor(8) as pool:
            names = [self._new_gang(c.gang_size, None) for _ in range(c.gangs)]
            names += [self._new_gang(1, c.fraction) for _ in range(c.fraction_pods)]
            list(pool.map(self._create_gang, names))
        self.print(f"chaos {self.run_id}: {c.replicas} replicas, {c.gangs} gangs of "
                   f"{c.gang_size} x {c.gpus_per_pod} GPU + {c.fraction_pods} pods of "
                   f"{c.fraction:g} GPU on {c.nodes} nodes x {c.gpus_per_node} GPUs "
                   f"({c.gangs * c.gang_size * c.gpus_per_pod} whole GPUs asked, "
                   f"{c.nodes * c.gpus_per_node} exist); lease {c.lease_duration_s:g}s, "
                   f"bind deadline {c.bind_deadline_s:g}s; logs in {self.workdir}")

    def _has_service_account(self) -> bool:
        try:
            self._get(f"/api/v1/namespaces/{self.namespace}/serviceaccounts/default")
            return True
        except ApiException as e:
            if e.status != 404:
                raise
            return False

    def _start_replica(self) -> Replica:
        args = ["--leader-election", "on", "--lease-name", self.lease_name,
                "--lease-namespace", self.namespace, *self.cfg.scheduler_args]
        r = Replica(f"r{self._replica_seq}", self.kubeconfig, self.workdir, args).start()
        self._replica_seq += 1
        self.replicas.append(r)
        return r

    def _new_gang(self, size: int, fraction: float | None) -> str:
        name = f"{'f' if fraction else 'g'}{self._gang_seq}"
        self._gang_seq += 1
        self.gangs[name] = (size, fraction)
        return name

    def _create_gang(self, name: str) -> None:
        size, fraction = self.gangs[name]
        queue = self.queues[int(name[1:]) % len(self.queues)]
        ns = self.namespace
        self._post(PODGROUP.path(ns),
                   _podgroup(name, queue, size, self.run_id))
        for i in range(size):
            self._post(f"/api/v1/namespaces/{ns}/pods",
                       _pod(f"{name}-{i}", name, queue, self.run_id, self.pool,
                            self.cfg.gpus_per_pod, fraction))

    def _delete_gang(self, name: str) -> None:
        """The PodGroup first: a gang being deleted is never seen as a partial one."""
        with self._lock:
            size, _ = self.gangs.pop(name)
        ns = self.namespace
        self._delete(PODGROUP.path(ns, name))
        for i in range(size):
            self._delete(f"/api/v1/namespaces/{ns}/pods/{name}-{i}")

    def churn(self, count: int, whole_gpus_only: bool = False) -> list[str]:
        """Delete `count` whole bound gangs and create as many new ones of the same kinds, so
        that binding goes on; returns the deleted gangs."""
        if count <= 0:
            return []
        bound: Counter[str] = Counter()
        for p in _holding(self._our_pods()):
            bound[(_meta(p).get("labels") or {}).get(GANG_LABEL, "")] += 1
        whole = sorted(g for g, (size, frac) in self.gangs.items()
                       if bound[g] >= size and not (whole_gpus_only and frac))
        victims = self.rng.sample(whole, min(count, len(whole)))
        # the new gangs first (pending: no room), then the room at once, so that one cycle
        # binds them all in a burst (gang by gang, each cycle would bind one in a blink)
        new = [self._new_gang(*self.gangs[g]) for g in victims]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(self._create_gang, new))
            list(pool.map(self._delete_gang, victims))
        return victims

    # -- observers ------------------------------------------------------------------------------
    def _start_observers(self) -> None:
        for target, name in ((self._watch_binds, "chaos-binds"),
                             (self._poll_lease, "chaos-lease")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _watch_binds(self) -> None:
        """Every pod of the workload whose nodeName appears, with the time it was seen."""
        nodes: dict[str, str] = {}
        rv: str | None = None
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        while not self._stop.is_set():
            try:
                if rv is None:
                    listed = self._get(path)
                    now = time.monotonic()
                    for p in listed.get("items") or []:
                        self._seen(nodes, p, now, fresh=bool(nodes))
                    rv = (listed.get("metadata") or {}).get("resourceVersion")
                resp = self.api.call_api(*self.api.param_serialize(
                    "GET", path, query_params=[("watch", "true"), ("resourceVersion", rv),
                                               ("allowWatchBookmarks", "true"),
                                               ("timeoutSeconds", "10")],
                    header_params={"Accept": "application/json"},
                    auth_settings=["BearerToken"]), _request_timeout=(5, 30))
                try:
                    if resp.status != 200:
                        rv = None
                        time.sleep(0.5)
                        continue
                    for line in iter_resp_lines(resp.response):
                        event = json.loads(line)
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":
                            rv = None  # expired: list again
                            break
                        rv = _meta(obj).get("resourceVersion") or rv
                        if event.get("type") in ("ADDED", "MODIFIED"):
                            self._seen(nodes, obj, time.monotonic(), fresh=True)
                        elif event.get("type") == "DELETED":
                            nodes.pop(str(_meta(obj).get("uid")), None)
                        if self._stop.is_set():
                            return
                finally:
                    resp.response.release_conn()
            except Exception:
                rv = None
                if self._stop.wait(0.5):
                    return

    def _seen(self, nodes: dict[str, str], pod: Mapping[str, Any], now: float,
              fresh: bool) -> None:
        uid = str(_meta(pod).get("uid"))
        node = (pod.get("spec") or {}).get("nodeName") or ""
        before = nodes.get(uid)
        nodes[uid] = node
        if node and not before and fresh:
            with self._lock:
                self.binds.append((now, str(_meta(pod).get("name"))))

    def _poll_lease(self) -> None:
        path = (f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/"
                f"{self.lease_name}")
        while not self._stop.wait(0.1):
            try:
                lease = self._get(path)
            except Exception:
                continue
            holder = (lease.get("spec") or {}).get("holderIdentity") or ""
            with self._lock:
                if holder != self.holders[-1][1]:
                    self.holders.append((time.monotonic(), holder))

    def holder(self) -> str:
        with self._lock:
            return self.holders[-1][1]

    def replica_of(self, identity: str) -> Replica | None:
        pid = _pid_of(identity)
        return next((r for r in self.replicas if r.proc.proc and r.pid == pid), None)

    def wait_leader(self, timeout: float) -> Replica:
        """The replica that holds the Lease (alive, not frozen)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.replica_of(self.holder())
            if r is not None and r.alive() and not r.frozen:
                return r
            self.sample()
            time.sleep(0.1)
        raise TimeoutError(f"no replica leads after {timeout:.0f}s (holder "
                           f"{self.holder()!r}; replicas {self.replicas})")

    # -- invariants -----------------------------------------------------------------------------
    def sample(self, force: bool = False) -> list[str]:
        """Check the invariants now (at most every sample_every_s unless `force`); new
        violations are recorded and returned."""
        now = time.monotonic()
        if not force and now - self._last_sample < self.cfg.sample_every_s:
            return []
        self._last_sample = now
        try:
            pods, nodes, pgs = self.snapshot()
        except Exception as e:  # the API server is fine here; still, a sample may fail
            self.print(f"  (sample failed: {type(e).__name__}: {e})")
            return []
        new = []
        for v in find_violations(pods, nodes, pgs, time.time(), self.cfg.bind_deadline_s):
            if v.key not in self.violations:
                self.violations[v.key] = f"[{self._round_label}] {v}"
                new.append(str(v))
        return new

    def _in_flight(self) -> tuple[int, int]:
        """(gangs with a bind intent, gangs partly bound) of the workload, now."""
        pods = self._our_pods()
        pgs = self._get(PODGROUP.path(self.namespace)).get("items") or []
        intents = sum(1 for pg in pgs if convert.bind_intent(pg))
        return intents, gang_counts(pods, pgs)["partial"]

    def _partial_gangs(self) -> int:
        return self._in_flight()[1]

    # -- rounds ---------------------------------------------------------------------------------
    def _observe(self, seconds: float, until: Callable[[], bool] | None = None,
                 result: RoundResult | None = None, poll_s: float = 0.1) -> bool:
        """Sample the invariants for up to `seconds`; True as soon as `until()` holds (asked
        every `poll_s`)."""
        deadline = time.monotonic() + seconds
        asked = float("-inf")
        while True:
            new = self.sample()
            if result is not None:
                result.violations.extend(new)
            if until is not None and time.monotonic() - asked >= poll_s:
                asked = time.monotonic()
                if until():
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def _takeover(self, since: float, old: str) -> tuple[float | None, float | None, str]:
        """(lease_s, takeover_s, new holder) after a signal at `since` to the holder `old`."""
        with self._lock:
            holders = list(self.holders)
            binds = list(self.binds)
        change = next(((t, h) for t, h in holders if t >= since and h not in ("", old)), None)
        if change is None:
            return None, None, ""
        t_bind = next((t for t, _ in binds if t >= max(since, change[0])), None)
        return (max(0.0, change[0] - since), None if t_bind is None else t_bind - since,
                change[1])

    def _binds_since(self, since: float) -> int:
        with self._lock:
            return sum(1 for t, _ in self.binds if t >= since)

    def _wait_moment(self, result: RoundResult) -> None:
        """Wait for the action's moment after a churn: uniform in moment_s, or (a share
        mid_bind_share of the rounds) just after the first bind seen since the churn."""
        c = self.cfg
        churned = time.monotonic()
        if self.rng.random() < c.mid_bind_share:
            delay = self.rng.uniform(*c.after_bind_s)
            deadline = churned + c.moment_s[1]
            while time.monotonic() < deadline and not self._binds_since(churned):
                time.sleep(0.005)  # no sampling here: it would blur the moment
            if self._binds_since(churned):
                time.sleep(delay)
                result.moment = f"bind+{delay:.2f}s"
                return
            result.moment = f"churn+{time.monotonic() - churned:.2f}s (no bind seen)"
            return
        wait = self.rng.uniform(*c.moment_s)
        self._observe(wait, None, result)
        result.moment = f"churn+{time.monotonic() - churned:.2f}s"

    def _next_action(self, i: int) -> str:
        actions = self.cfg.actions
        return actions[i % len(actions)] if self.cfg.cycle else self.rng.choice(actions)

    def _settle(self, result: RoundResult, since: float, old: str) -> None:
        """Wait for the successor's first bind, then for no gang to be partly bound (up to the
        bind deadline), sampling the invariants throughout."""
        c = self.cfg
        got = self._observe(c.takeover_timeout_s,
                            lambda: self._takeover(since, old)[1] is not None, result)
        result.lease_s, result.takeover_s, new = self._takeover(since, old)
        r = self.replica_of(new)
        result.leader_after = f"{r.name}" if r else new
        if not got:
            msg = (f"[{self._round_label}] no bind by a new leader within "
                   f"{c.takeover_timeout_s:g}s of {result.action} (lease holder "
                   f"{self.holder()!r})")
            self.takeover_failures.append(msg)
            result.notes.append(msg)
        self._observe(c.bind_deadline_s, lambda: self._partial_gangs() == 0, result, 1.0)
        for r in self.replicas:
            if r.alive() and not r.frozen:
                r.proc.wait_ready(120)
        result.violations.extend(self.sample(force=True))
        result.binds = self._binds_since(since)

    def _replace_dead(self) -> list[str]:
        """Replicas that exited without being told to are reported and replaced."""
        notes = []
        for r in list(self.replicas):
            if r.alive():
                continue
            rc = r.proc.proc.returncode if r.proc.proc else None
            tail = r.proc.log_tail(3).replace("\n", " | ")
            notes.append(f"{r.name} exited by itself (status {rc}): {tail}")
            self.unexpected_exits.append(f"[{self._round_label}] {notes[-1]}")
            self.replicas.remove(r)
            self._start_replica().proc.wait_ready(120)
        return notes

    def chaos_round(self, i: int) -> RoundResult:
        c = self.cfg
        action = self._next_action(i)
        self._round_label = f"round {i + 1} {action}"
        notes = self._replace_dead()
        leader = self.wait_leader(c.takeover_timeout_s)
        old = self.holder()
        result = RoundResult(i + 1, "chaos", action, leader_before=leader.name, notes=notes)
        self.churn(c.churn)
        self._wait_moment(result)
        since = time.monotonic()
        result.at_s = since - self._t0
        sig = getattr(signal, action)
        offset = leader.log_size()
        leader.signal(sig)
        self.kills[action] += 1
        result.in_flight, result.partial_at_signal = self._in_flight()
        if action == "SIGKILL":
            leader.wait_exit(10)
            self.replicas.remove(leader)
            self._start_replica()
        # the successor must have something to bind, whatever the old leader finished
        self.churn(1, whole_gpus_only=True)
        if action == "SIGTERM":
            if not leader.wait_exit(c.term_timeout_s):
                result.notes.append(f"did not exit {c.term_timeout_s:g}s after SIGTERM: "
                                    "SIGKILLed")
                leader.proc.kill()
            result.exit_s = time.monotonic() - since
            self.replicas.remove(leader)
            self._start_replica()
        elif action == "SIGSTOP":
            # frozen past the lease, and woken while the successor binds (its stale cycle may
            # go on binding: what fencing must stop)
            hold = c.lease_duration_s + self.rng.uniform(*c.stop_extra_s)
            self._observe(hold, None, result)
            self._observe(c.takeover_timeout_s,
                          lambda: self._takeover(since, old)[0] is not None, result)
            self._observe(self.rng.uniform(*c.resume_after_takeover_s), None, result)
            leader.signal(signal.SIGCONT)
            result.stopped_s = time.monotonic() - since
        self._settle(result, since, old)
        result.stale_cycles = leader.stale_cycles(offset)
        return result

    def rolling_step(self, i: int) -> RoundResult:
        c = self.cfg
        self._round_label = f"rolling {i + 1}"
        notes = self._replace_dead()
        leader = self.wait_leader(c.takeover_timeout_s)
        old = self.holder()
        result = RoundResult(i + 1, "rolling", "SIGTERM", leader_before=leader.name,
                             notes=notes)
        new = self._start_replica()
        new.proc.wait_ready(120)
        self.churn(c.churn)
        self._wait_moment(result)
        since = time.monotonic()
        result.at_s = since - self._t0
        offset = leader.log_size()
        leader.signal(signal.SIGTERM)
        self.kills["SIGTERM"] += 1
        result.in_flight, result.partial_at_signal = self._in_flight()
        self.churn(1, whole_gpus_only=True)
        if not leader.wait_exit(c.term_timeout_s):
            result.notes.append(f"did not exit {c.term_timeout_s:g}s after SIGTERM: SIGKILLed")
            leader.proc.kill()
        result.exit_s = time.monotonic() - since
        self.replicas.remove(leader)
        self._settle(result, since, old)
        result.stale_cycles = leader.stale_cycles(offset)
        return result

    def _report(self, r: RoundResult) -> None:
        def s(v: float | None) -> str:
            return "   -  " if v is None else f"{v:6.2f}"

        extra = f" exit {r.exit_s:.1f}s" if r.exit_s is not None else ""
        extra += f" stopped {r.stopped_s:.1f}s" if r.stopped_s is not None else ""
        self.print(f"{r.mode:7s} {r.round:3d} {r.action:7s} at {r.moment:11s} "
                   f"{r.leader_before}->{r.leader_after or '?'} in-flight {r.in_flight:2d} "
                   f"partial {r.partial_at_signal:2d} lease {s(r.lease_s)}s "
                   f"takeover {s(r.takeover_s)}s binds {r.binds:3d}{extra} "
                   f"violations {len(r.violations)}")
        for line in [*r.violations, *r.notes]:
            self.print(f"        ! {line}")
        for line in r.stale_cycles:
            self.print(f"        ~ {line}")

    def finish(self) -> None:
        """No more churn: wait for every gang to be whole or pending, then a last check."""
        self._round_label = "final"
        deadline = self.cfg.bind_deadline_s + 15
        self._observe(deadline, lambda: self._in_flight() == (0, 0), None, 1.0)
        self._replace_dead()
        self.sample(force=True)
        pods, nodes, pgs = self.snapshot()
        ours = [p for p in pods if _meta(p).get("namespace") == self.namespace]
        pgs = [pg for pg in pgs if _meta(pg).get("namespace") == self.namespace]
        pool = [n for n in nodes if (_meta(n).get("labels") or {}).get(POOL_LABEL) == self.pool]
        # whole-GPU pods and reservation pods (one per shared device) on the pool's nodes
        held = sum(whole_gpus(p) for p in _holding(pods)
                   if p["spec"]["nodeName"] in self.node_names)
        self.final = {**gang_counts(ours, pgs),
                      "intents": sum(1 for pg in pgs if convert.bind_intent(pg)),
                      "gpus_held": held,
                      "gpus": sum(_quantity(((n.get("status") or {}).get("allocatable") or {})
                                            .get(GPU, 0)) for n in pool)}
        self.print(f"final: {self.final}")

    def run(self, rounds: int, rolling: int) -> dict[str, Any]:
        self.setup()
        for i in range(rounds):
            r = self.chaos_round(i)
            self.results.append(r)
            self._report(r)
        for i in range(rolling):
            r = self.rolling_step(i)
            self.results.append(r)
            self._report(r)
        self.finish()
        return self.summary()

    def replica_errors(self) -> list[str]:
        """ERROR lines of every replica's log, each with the exception that follows it."""
        out = []
        for path in sorted(self.workdir.glob("r*/kai-ray-run-*.log")):
            try:
                lines = path.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for i, line in enumerate(lines):
                if " ERROR " not in line:
                    continue
                exc = ""
                if i + 1 < len(lines) and lines[i + 1].startswith("Traceback"):
                    exc = next((x for x in lines[i + 2:] if x and not x[0].isspace()), "")
                out.append(f"{path.parent.name}: {line}{' -> ' + exc if exc else ''}")
        return out

    def summary(self) -> dict[str, Any]:
        def stats(values: list[float]) -> dict[str, Any]:
            if not values:
                return {"n": 0, "min": None, "median": None, "max": None}
            return {"n": len(values), "min": round(min(values), 3),
                    "median": round(statistics.median(values), 3),
                    "max": round(max(values), 3)}

        takeovers = [r.takeover_s for r in self.results if r.takeover_s is not None]
        by_action = {}
        for mode, action in sorted({(r.mode, r.action) for r in self.results}):
            by_action[f"{mode}:{action}"] = stats(
                [r.takeover_s for r in self.results
                 if (r.mode, r.action) == (mode, action) and r.takeover_s is not None])
        return {
            "rounds": sum(1 for r in self.results if r.mode == "chaos"),
            "rolling": sum(1 for r in self.results if r.mode == "rolling"),
            "kills": dict(self.kills),
            "violations": sorted(self.violations.values()),
            "takeover_failures": list(self.takeover_failures),
            "unexpected_exits": list(self.unexpected_exits),
            "replica_errors": self.replica_errors(),
            "stale_cycles": [f"[{r.mode} {r.round} {r.action}] {c}" for r in self.results
                             for c in r.stale_cycles],
            "takeover_s": stats(takeovers),
            "takeover_by_action_s": by_action,
            "lease_s": stats([r.lease_s for r in self.results if r.lease_s is not None]),
            "final": self.final,
            "config": {k: v for k, v in asdict(self.cfg).items()},
            "run_id": self.run_id,
            "logs": str(self.workdir),
            "round_results": [asdict(r) for r in self.results],
        }

    def ok(self) -> bool:
        return not self.violations and not self.takeover_failures

    # -- tear-down ------------------------------------------------------------------------------
    def close(self, delete_objects: bool = False) -> None:
        self._stop.set()
        for r in self.replicas:
            with contextlib.suppress(Exception):
                r.stop()
        for t in self._threads:
            t.join(timeout=15)
        if delete_objects:
            with contextlib.suppress(Exception):
                self._delete(f"/api/v1/namespaces/{self.namespace}")
            for q in [*self.queues, self.root_queue]:
                with contextlib.suppress(Exception):
                    self._delete(QUEUE.path(name=q))
            for n in self.node_names:
                with contextlib.suppress(Exception):
                    self._delete(f"/api/v1/nodes/{n}")

    def _wait(self, what: str, check: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.1)


# ------------------------------------------------------------------------------ CLI
def _parser() -> argparse.ArgumentParser:
    d = ChaosConfig()
    p = argparse.ArgumentParser(prog="python3 -m kai_ray.testing.chaos",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=20, help="chaos rounds (default 20)")
    p.add_argument("--rolling", type=int, default=10, help="rolling restarts (default 10)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, help="write the JSON summary here")
    p.add_argument("--kubeconfig", type=Path,
                   help="an existing cluster (with KWOK); default: start a local ControlPlane")
    p.add_argument("--workdir", type=Path, help="replicas' logs (default: a temporary folder)")
    p.add_argument("--gangs", type=int, default=d.gangs)
    p.add_argument("--gang-size", type=int, default=d.gang_size)
    p.add_argument("--fraction-pods", type=int, default=d.fraction_pods)
    p.add_argument("--nodes", type=int, default=d.nodes)
    p.add_argument("--gpus-per-node", type=int, default=d.gpus_per_node)
    p.add_argument("--queues", type=int, default=d.queues)
    p.add_argument("--replicas", type=int, default=d.replicas)
    p.add_argument("--churn", type=int, default=d.churn,
                   help="bound gangs replaced before each action")
    p.add_argument("--bind-deadline", type=float, default=d.bind_deadline_s,
                   help="seconds a gang may stay partly bound")
    p.add_argument("--actions", default=",".join(ACTIONS),
                   help="comma-separated subset of SIGKILL,SIGTERM,SIGSTOP")
    p.add_argument("--cycle", action="store_true",
                   help="take the actions in order instead of at random")
    p.add_argument("--config", type=Path, help="a `kai-ray run --config` file for the replicas")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    actions = tuple(a.strip().upper() for a in args.actions.split(",") if a.strip())
    if not actions or set(actions) - set(ACTIONS):
        print(f"--actions: choose among {','.join(ACTIONS)}", file=sys.stderr)
        return 2
    cfg = ChaosConfig(gangs=args.gangs, gang_size=args.gang_size,
                      fraction_pods=args.fraction_pods, nodes=args.nodes,
                      gpus_per_node=args.gpus_per_node, queues=max(1, args.queues),
                      replicas=max(2, args.replicas), churn=args.churn,
                      bind_deadline_s=args.bind_deadline, actions=actions, cycle=args.cycle,
                      seed=args.seed,
                      scheduler_args=("--config", str(args.config)) if args.config else ())
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kai-ray-chaos-"))
    plane = None
    kubeconfig = args.kubeconfig
    if kubeconfig is None:
        from kai_ray.testing.plane import ControlPlane

        plane = ControlPlane()
        print("starting a local control plane ...", flush=True)
        plane.start()
        kubeconfig = plane.kubeconfig
    chaos = Chaos(kubeconfig, workdir, cfg, out=lambda s: print(s, flush=True))
    summary: dict[str, Any] = {}
    code = 0
    try:
        summary = chaos.run(args.rounds, args.rolling)
        code = 0 if chaos.ok() else 1
    except KeyboardInterrupt:
        summary = chaos.summary()
        summary["interrupted"] = True
        code = 130
    finally:
        chaos.close(delete_objects=plane is None)
        if plane is not None:
            plane.stop()
    summary = summary or chaos.summary()
    t = summary["takeover_s"]
    print(f"rounds {summary['rounds']} + rolling {summary['rolling']}; kills "
          f"{summary['kills']}; violations {len(summary['violations'])}; rounds without a "
          f"takeover {len(summary['takeover_failures'])}; takeover s min {t['min']} median "
          f"{t['median']} max {t['max']}; cycles ending after the lease was lost "
          f"{len(summary['stale_cycles'])}")
    for v in [*summary["violations"], *summary["takeover_failures"]]:
        print(f"  ! {v}")
    for c in summary["stale_cycles"]:
        print(f"  ~ {c}")
    for e in [*summary["unexpected_exits"], *summary["replica_errors"]]:
        print(f"  ? {e}")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
