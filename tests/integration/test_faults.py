"""The fault suite: `kai-ray run` against a real control plane, reached through a TCP proxy
that can cut, reset or slow its connections, meets bad objects and API faults. In every case
an unrelated gang binds within three cycles, the bad object gets an event or condition that
names it and the field, no thread dies, and /healthz stays healthy or fails only while the
loop truly cannot work (and is healthy again after).

Runs on a control plane of its own (module `plane`): one scheduler process, restarted only
to change its core."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.k8s import convert
from kai_ray.testing import procs
from kai_ray.testing.faultproxy import FaultProxy, kubeconfig_via
from kai_ray.testing.scheduler_process import KaiRayProcess
from tests.integration.helpers import (
    PG,
    Q,
    create_queues,
    gang,
    pod,
    pool_nodes,
    queue,
    wait_for,
)

pytestmark = pytest.mark.integration

QUEUE = "faults"
# short watches and thresholds, so the blackhole's 30 s are long enough to be noticed
CONFIG = """\
cyclePeriodSeconds: 1
clientConnection: {connectTimeoutSeconds: 3, timeoutSeconds: 10, watchTimeoutSeconds: 5}
health: {maxCycleAgeSeconds: 20, maxInformerSilenceSeconds: 12}
"""
CYCLES = 3  # an unrelated gang binds within this many cycles


@dataclass
class Faults:
    plane: Any
    proxy: FaultProxy
    kubeconfig: Path
    config: Path
    workdir: Path
    pool: str
    proc: KaiRayProcess | None = None
    health_port: int = 0
    samples: list[tuple[float, int, dict[str, Any]]] = field(default_factory=list)
    _sampling: threading.Event = field(default_factory=threading.Event)

    @property
    def api(self) -> client.ApiClient:
        return self.plane.api_client()

    def start(self, core: str = "auto") -> None:
        self.health_port = procs.free_ports(1)[0]
        self.proc = KaiRayProcess(self.kubeconfig, self.workdir, [
            "--leader-election", "off", "--config", str(self.config),
            "--health-port", str(self.health_port), "--core", core])
        self.proc.start()
        self.proc.wait_ready()
        wait_for("kai-ray ready", lambda: self.ready(), timeout=30, detail=self.proc.log_tail)
        threading.Thread(target=self._sample, daemon=True).start()

    def stop(self) -> None:
        self._sampling.set()
        if self.proc is not None:
            self.proc.stop()
        self._sampling = threading.Event()

    def ready(self) -> bool:
        return self._get("/readyz")[0] == 200

    def health(self) -> tuple[int, dict[str, Any]]:
        return self._get("/healthz")

    def _get(self, path: str) -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}{path}",
                                        timeout=5) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")
        except OSError as e:
            return 0, {"error": str(e)}

    def _sample(self) -> None:
        stop = self._sampling
        while not stop.wait(0.5):
            code, body = self.health()
            self.samples.append((time.monotonic(), code, body))

    def cycles(self) -> int:
        _, body = self.health()
        return int(body["checks"]["loop"]["cycles"])

    def unhealthy_since(self, t0: float) -> list[tuple[float, dict[str, Any]]]:
        return [(t - t0, {k: c for k, c in b.get("checks", {}).items() if not c.get("ok")})
                for t, code, b in self.samples if t >= t0 and code != 200]

    def unrelated_gang_binds(self, ns: str, cycles: int = CYCLES) -> int:
        """A fresh 2-pod gang in a healthy queue binds within `cycles` cycles; returns the
        cycles it took."""
        name = f"ok-{uuid.uuid4().hex[:6]}"
        core = client.CoreV1Api(self.api)
        gang(self.api, ns, name, QUEUE, 2, gpus=1, node_selector={"kai-ray.io/pool": self.pool})
        start = self.cycles()

        def bound() -> bool:
            return all(core.read_namespaced_pod(f"{name}-{i}", ns).spec.node_name
                       for i in range(2))

        wait_for(f"unrelated gang {name} bound", bound, timeout=30, detail=self.log)
        took = self.cycles() - start
        assert took <= cycles, f"gang {name} took {took} cycles (limit {cycles})"
        return took

    def threads_alive(self) -> None:
        _, body = self.health()
        dead = {k: c for k, c in body["checks"].items()
                if (k.startswith("thread:") or k.startswith("informer:"))
                and "not running" in str(c.get("detail"))}
        assert not dead, f"threads died: {dead}"
        assert self.proc is not None and self.proc.alive(), self.log()
        assert "Exception in thread" not in self.proc.log_tail(100_000), self.log()

    def log(self) -> str:
        return self.proc.log_tail(60) if self.proc else ""


def _events(core: client.CoreV1Api, ns: str, name: str, reason: str) -> list[str]:
    return [e.message or "" for e in core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name}").items if e.reason == reason]


@pytest.fixture(scope="module")
def faults(plane: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Faults]:
    workdir = tmp_path_factory.mktemp("faults")
    server = urlparse(plane.api_url)
    proxy = FaultProxy(server.hostname or "127.0.0.1", server.port or 443).start()
    kubeconfig = workdir / "kubeconfig-via-proxy"
    kubeconfig_via(plane.kubeconfig, proxy.port, kubeconfig)
    config = workdir / "config.yaml"
    config.write_text(CONFIG)
    api = plane.api_client()
    create_queues(api, queue("faults-root"), queue(QUEUE, "faults-root"))
    pool, _ = pool_nodes(api, 4, 8, pool="faults")
    f = Faults(plane, proxy, kubeconfig, config, workdir, pool)
    f.start()
    try:
        yield f
    finally:
        f.stop()
        proxy.stop()


@pytest.fixture
def ns(faults: Faults) -> Iterator[str]:
    name = f"faults-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(faults.api)
    core.create_namespace({"metadata": {"name": name}})
    faults.plane.wait_service_account(name)
    yield name
    core.delete_namespace(name)


BAD_SHARING = [("gpu-fraction", {"gpu-fraction": "abc"}),
               ("gpu-memory", {"gpu-memory": "-5"}),
               ("gpu-fraction-num-devices", {"gpu-fraction": "0.5",
                                             "gpu-fraction-num-devices": "0"})]


def test_bad_gpu_annotations_on_bound_pods_of_another_scheduler(faults: Faults, ns: str) -> None:
    """The first finding: one such pod, anywhere, stopped all scheduling."""
    core = client.CoreV1Api(faults.api)
    t0 = time.monotonic()
    node = f"{faults.pool}-0"
    for i, (_, bad) in enumerate(BAD_SHARING):
        p = pod(f"foreign-{i}", annotations=bad)
        p["spec"]["schedulerName"] = "default-scheduler"
        p["spec"]["nodeName"] = node  # bound at creation, as another scheduler would
        core.create_namespaced_pod(ns, p)
    faults.unrelated_gang_binds(ns)
    for i, (key, _) in enumerate(BAD_SHARING):
        wait_for(f"InvalidSpec event on foreign-{i} naming {key}",
                 lambda i=i, key=key: any(f"metadata.annotations[{key}]" in m
                                          for m in _events(core, ns, f"foreign-{i}",
                                                           "InvalidSpec")), timeout=20)
    faults.threads_alive()
    assert not faults.unhealthy_since(t0)


def test_bad_gpu_annotations_on_our_own_pods_keep_their_gang_pending(faults: Faults,
                                                                    ns: str) -> None:
    """Without the webhook (not installed here) a bad value reaches the scheduler: it is
    reported on the pod, and its gang waits; it is never read as "no GPU"."""
    core = client.CoreV1Api(faults.api)
    t0 = time.monotonic()
    custom = client.CustomObjectsApi(faults.api)
    custom.create_namespaced_custom_object(
        *PG[:2], ns, PG[2], {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
                             "metadata": {"name": "bad"},
                             "spec": {"queue": QUEUE, "minMember": 2}})
    for i, sharing in enumerate(({"gpu-fraction": "1.5"}, {"gpu-fraction": "0.5"})):
        core.create_namespaced_pod(ns, pod(f"bad-{i}", QUEUE, annotations={
            **sharing, "pod-group-name": "bad"}))
    faults.unrelated_gang_binds(ns)
    wait_for("InvalidSpec event on bad-0 naming gpu-fraction",
             lambda: any("metadata.annotations[gpu-fraction]" in m and "1.5" in m
                         for m in _events(core, ns, "bad-0", "InvalidSpec")), timeout=20)
    time.sleep(2)
    assert not core.read_namespaced_pod("bad-1", ns).spec.node_name, "half a gang bound"
    faults.threads_alive()
    assert not faults.unhealthy_since(t0)


def _pdb(name: str, selector: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": selector}}}


def test_evictions_refused_with_500_and_429(faults: Faults, ns: str) -> None:
    """A victim under two PodDisruptionBudgets (the eviction API answers 500) and then one
    that allows no disruption (429): the preemptor waits, the victim is told why."""
    api = faults.api
    core = client.CoreV1Api(api)
    sched = client.SchedulingV1Api(api)
    policy = client.PolicyV1Api(api)
    low, high = f"{ns}-low", f"{ns}-high"
    sched.create_priority_class({"metadata": {"name": low}, "value": 40})
    sched.create_priority_class({"metadata": {"name": high}, "value": 200})
    pool, nodes = pool_nodes(api, 1, 1, pool=f"pdb{uuid.uuid4().hex[:4]}")
    try:
        victim = pod("victim", QUEUE, gpus=1, labels={"app": "victim"},
                     node_selector={"kai-ray.io/pool": pool}, priority_class=low)
        core.create_namespaced_pod(ns, victim)
        wait_for("victim bound", lambda: core.read_namespaced_pod("victim", ns).spec.node_name)
        wait_for("victim running",
                 lambda: core.read_namespaced_pod("victim", ns).status.phase == "Running")
        policy.create_namespaced_pod_disruption_budget(ns, _pdb("one", {"app": "victim"}))
        policy.create_namespaced_pod_disruption_budget(ns, _pdb("two", {"app": "victim"}))
        t0 = time.monotonic()
        core.create_namespaced_pod(ns, pod("preemptor", QUEUE, gpus=1,
                                           node_selector={"kai-ray.io/pool": pool},
                                           priority_class=high))
        wait_for("EvictionRefused (500) on the victim",
                 lambda: any("500" in m for m in _events(core, ns, "victim", "EvictionRefused")),
                 timeout=30, detail=faults.log)
        faults.unrelated_gang_binds(ns)
        policy.delete_namespaced_pod_disruption_budget("two", ns)
        wait_for("EvictionRefused (429) on the victim",
                 lambda: any("429" in m for m in _events(core, ns, "victim", "EvictionRefused")),
                 timeout=30, detail=faults.log)
        faults.unrelated_gang_binds(ns)
        assert core.read_namespaced_pod("victim", ns).metadata.deletion_timestamp is None
        assert not core.read_namespaced_pod("preemptor", ns).spec.node_name
        faults.threads_alive()
        assert not faults.unhealthy_since(t0)
    finally:
        for name in (low, high):
            sched.delete_priority_class(name)
        for node in nodes:
            core.delete_node(node)


@pytest.mark.parametrize("core_name", ["python", "native"])
def test_queue_parent_cycles(faults: Faults, ns: str, core_name: str) -> None:
    """A Queue that is its own parent is refused by the API server (the CRD's rule); a cycle
    of two it cannot see is reported on both Queues, and both cores schedule the rest."""
    custom = client.CustomObjectsApi(faults.api)
    suffix = uuid.uuid4().hex[:4]
    selfish = queue(f"selfish-{suffix}", f"selfish-{suffix}")
    try:
        custom.create_cluster_custom_object(*Q, selfish)
    except ApiException as e:
        assert e.status == 422 and "parentQueue" in str(e.body), e.body
        refused = True
    else:
        refused = False
    a, b = f"loop-a-{suffix}", f"loop-b-{suffix}"
    create_queues(faults.api, queue(a, b), queue(b, a))
    faults.stop()
    faults.start(core_name)
    t0 = time.monotonic()
    try:
        faults.unrelated_gang_binds(ns)
        names = [a, b] + ([] if refused else [selfish["metadata"]["name"]])
        for name in names:
            def reported(name: str = name) -> bool:
                q = custom.get_cluster_custom_object(*Q, name)
                return any(c.get("status") == "False" and "spec.parentQueue" in c.get("message",
                                                                                       "")
                           for c in (q.get("status") or {}).get("conditions") or [])

            wait_for(f"Queue {name}: condition naming spec.parentQueue", reported, timeout=20,
                     detail=faults.log)
        faults.threads_alive()
        assert not faults.unhealthy_since(t0)
    finally:
        for name in (a, b, selfish["metadata"]["name"]):
            with contextlib.suppress(ApiException):
                custom.delete_cluster_custom_object(*Q, name)
        faults.stop()
        faults.start()


@pytest.mark.parametrize("mode", ["blackhole", "reset", "delay"])
def test_api_server_unreachable_slow_or_resetting(faults: Faults, ns: str, mode: str) -> None:
    """30 s of a fault between kai-ray and the API server; scheduling resumes within 10 s of
    its end. During a blackhole /healthz fails once the informers' silence passes its limit,
    and is healthy again after."""
    core = client.CoreV1Api(faults.api)
    faults.unrelated_gang_binds(ns)
    t0 = time.monotonic()
    faults.proxy.set_mode(mode, delay_s=5.0)
    time.sleep(3)
    name = f"during-{mode}"
    gang(faults.api, ns, name, QUEUE, 2, gpus=1, node_selector={"kai-ray.io/pool": faults.pool})
    time.sleep(27)
    faults.proxy.set_mode("pass")
    t_end = time.monotonic()

    def bound() -> bool:
        return all(core.read_namespaced_pod(f"{name}-{i}", ns).spec.node_name for i in range(2))

    wait_for(f"gang {name} bound after the {mode} ended", bound, timeout=30, detail=faults.log)
    took = time.monotonic() - t_end
    assert took <= 10, f"scheduling resumed {took:.1f}s after the {mode} ended"
    wait_for("healthy again", lambda: faults.health()[0] == 200, timeout=20, detail=faults.log)
    bad = faults.unhealthy_since(t0)
    if mode == "blackhole":
        failing = {k for _, checks in bad for k in checks}
        assert any(k.startswith("informer:") for k in failing), \
            f"/healthz never failed during a 30 s blackhole: {bad[:3]}"
    faults.unrelated_gang_binds(ns)
    faults.threads_alive()


def test_binding_refused_by_a_policy(faults: Faults, ns: str) -> None:
    """A ValidatingAdmissionPolicy refuses the Binding of one pod: after a bounded number
    of tries its gang is Pending again with a BindFailed condition; the others bind."""
    api = faults.api
    core = client.CoreV1Api(api)
    adm = client.AdmissionregistrationV1Api(api)
    core.patch_namespace(ns, {"metadata": {"labels": {"kai-ray.io/faults": "refuse"}}})
    policy = f"refuse-binding-{ns}"
    adm.create_validating_admission_policy({
        "metadata": {"name": policy},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {
                     "namespaceSelector": {"matchLabels": {"kai-ray.io/faults": "refuse"}},
                     "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                        "operations": ["CREATE"],
                                        "resources": ["pods/binding"]}]},
                 "validations": [{"expression": "!object.metadata.name.startsWith('refused') && "
                                                "object.metadata.name != 'mixed-1'",
                                  "message": "bindings of refused-* pods are not allowed"}]}})
    adm.create_validating_admission_policy_binding({
        "metadata": {"name": policy},
        "spec": {"policyName": policy, "validationActions": ["Deny"]}})
    try:
        time.sleep(2)  # the policy reaches the API server's cache
        t0 = time.monotonic()
        gang(api, ns, "refused", QUEUE, 2, gpus=1,
             node_selector={"kai-ray.io/pool": faults.pool})

        def bind_failed() -> Any:
            messages = {}
            for i in range(2):
                p = core.read_namespaced_pod(f"refused-{i}", ns)
                assert not p.spec.node_name, "a pod of the refused gang was bound"
                for c in p.status.conditions or []:
                    if c.type == "PodScheduled" and c.reason == "BindFailed":
                        messages[i] = c.message
            return messages if len(messages) == 2 else None

        # both pods: the refused one and its gang mate, which goes back to Pending with it
        messages = wait_for("BindFailed conditions", bind_failed, timeout=40, detail=faults.log)
        assert "not allowed" in messages[0], messages
        assert "refused-0, a pod of the same gang" in messages[1], messages
        # the pods are told first, then the transaction ends: its intent goes right after
        wait_for("the gang's bind intent removed", lambda: not convert.bind_intent(
            client.CustomObjectsApi(api).get_namespaced_custom_object(
                "scheduling.run.ai", "v2alpha2", ns, "podgroups", "refused")),
            timeout=10, detail=faults.log)
        faults.unrelated_gang_binds(ns)

        # backed off: no new bind tries for a while (the scheduler logs each one)
        def tries() -> int:
            assert faults.proc is not None
            return faults.proc.log_path.read_text().count(f"bind {ns}/refused-0 -> ")

        before = tries()
        assert before >= 1
        time.sleep(5)
        assert tries() == before, "tried again during its back-off"

        # refused after a pod of its gang was bound: the transaction is rolled back, so no pod
        # of the gang stays bound (the bound one is evicted: a bare pod is deleted with it)
        gang(api, ns, "mixed", QUEUE, 2, gpus=1, node_selector={"kai-ray.io/pool": faults.pool})

        def rolled_back() -> Any:
            events = [e for e in core.list_namespaced_event(
                ns, field_selector="involvedObject.name=mixed").items
                if e.reason == "BindRolledBack"]
            return events[0].message if events else None

        message = wait_for("the mixed gang rolled back", rolled_back, timeout=60,
                           detail=faults.log)
        assert "the bind of mixed-1 was refused" in message, message

        def none_bound() -> bool:
            for i in range(2):
                try:
                    p = core.read_namespaced_pod(f"mixed-{i}", ns)
                except ApiException as e:
                    if e.status == 404:
                        continue  # evicted
                    raise
                if p.spec.node_name and not p.metadata.deletion_timestamp:
                    return False
            return True

        wait_for("no pod of the mixed gang bound", none_bound, timeout=30, detail=faults.log)
        faults.threads_alive()
        assert not faults.unhealthy_since(t0)
    finally:
        adm.delete_validating_admission_policy_binding(policy)
        adm.delete_validating_admission_policy(policy)
