"""kai-ray installed as users install it: the images built here, loaded onto the real node, and the
Helm chart of this checkout installed with its own ServiceAccounts; the scheduler and webhook run
as pods on the real node.

    install = ChartInstall(plane.kubeconfig, node)   # node: a started RealNode
    install.install()          # builds/loads the images, `helm install`, waits for Ready pods
    install.upgrade("--set", "logLevel=debug")
    install.uninstall()        # `helm uninstall`, waits until the pods are gone

`kai-ray dev-cluster up --real-node --install` does the same for a person trying kai-ray.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubernetes import client, config

import kai_ray
from kai_ray.testing import binaries, images

if TYPE_CHECKING:
    from kai_ray.testing.realnode import RealNode

CHART = Path(kai_ray.__file__).resolve().parent.parent / "charts" / "kai-ray"
RELEASE = "kai-ray"
NAMESPACE = "kai-ray"
# the chart's pods go to the real node: a KWOK node would only pretend to run them
REAL_NODE_SELECTOR = "kai-ray.io/real-node"
COMPONENTS = ("scheduler", "webhook")
Log = Callable[[str], None]


class InstallError(RuntimeError):
    """helm failed, or the chart's pods did not become Ready; the message says which pod and why."""


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def image_values(operator: images.ImageArchive, reservation: images.ImageArchive) -> list[str]:
    """helm flags that point the chart at the locally built images (exact tags: never pulled)."""
    repo, tag = operator.ref.rsplit(":", 1)
    res_repo, res_tag = reservation.ref.rsplit(":", 1)
    return ["--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
            "--set", "image.pullPolicy=Never",
            "--set", f"reservation.image.repository={res_repo}",
            "--set", f"reservation.image.tag={res_tag}"]


def placement_values() -> list[str]:
    key = REAL_NODE_SELECTOR.replace(".", "\\.")  # helm's --set splits keys on unescaped dots
    return [arg for component in COMPONENTS
            for arg in ("--set-string", f"{component}.nodeSelector.{key}=true")]


@dataclasses.dataclass
class ChartInstall:
    kubeconfig: Path
    node: RealNode | None = None  # None: the images are already on the nodes
    release: str = RELEASE
    namespace: str = NAMESPACE
    log: Log = _stderr
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    values: list[str] = dataclasses.field(default_factory=list)  # the last install's flags

    def __post_init__(self) -> None:
        self.api = config.new_client_from_config(config_file=str(self.kubeconfig))
        self.apps = client.AppsV1Api(self.api)
        self.core = client.CoreV1Api(self.api)

    # -- helm -----------------------------------------------------------------------------------
    def helm(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        cmd = [str(binaries.require("helm")["helm"]), "--kubeconfig", str(self.kubeconfig), *args]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                             env={**os.environ, "HELM_CACHE_HOME": str(self.kubeconfig.parent /
                                                                        "helm-cache")})
        if out.returncode != 0:
            raise InstallError(f"helm {' '.join(args[:2])} failed ({out.returncode}): "
                               f"{(out.stderr or out.stdout).strip()}")
        return out

    def load_images(self) -> tuple[images.ImageArchive, images.ImageArchive]:
        """The kai-ray and reservation images, built if this content is new, on the node."""
        start = time.monotonic()
        operator = images.ensure("kai-ray", log=self.log)
        reservation = images.ensure("kai-ray-reservation", log=self.log)
        self.timings["images_s"] = round(time.monotonic() - start, 1)
        if self.node is not None:
            start = time.monotonic()
            for archive in (operator, reservation):
                self.log(f"   loading {archive.ref} onto the real node")
                self.node.import_image(archive)
            self.timings["load_s"] = round(time.monotonic() - start, 1)
        return operator, reservation

    def install(self, *extra: str, timeout: float = 180) -> ChartInstall:
        """`helm install` of this checkout's chart, then waits until every scheduler and webhook
        replica is Ready; `timings["ready_s"]` is the time from `helm install` to that."""
        operator, reservation = self.load_images()
        self.values = [*image_values(operator, reservation), *placement_values(), *extra]
        self.log(f"== helm install {self.release} -n {self.namespace} ({CHART})")
        start = time.monotonic()
        self.helm("install", self.release, str(CHART), "-n", self.namespace, "--create-namespace",
                  *self.values)
        self.timings["helm_s"] = round(time.monotonic() - start, 1)
        self.wait_ready(timeout, since=start)
        self.wait_webhook_answers(timeout, since=start)
        self.timings["ready_s"] = round(time.monotonic() - start, 1)
        self.log(f"   scheduler and webhook Ready {self.timings['ready_s']} s after helm install")
        return self

    def upgrade(self, *extra: str, timeout: float = 180) -> None:
        """`helm upgrade` with the install's flags plus `extra`; waits for the rolled pods."""
        start = time.monotonic()
        self.helm("upgrade", self.release, str(CHART), "-n", self.namespace, *self.values, *extra)
        self.wait_ready(timeout, since=start)
        self.wait_webhook_answers(timeout, since=start)
        self.timings["upgrade_ready_s"] = round(time.monotonic() - start, 1)

    def uninstall(self, timeout: float = 120) -> None:
        """`helm uninstall`, then waits until the chart's pods are gone."""
        self.helm("uninstall", self.release, "-n", self.namespace, "--wait",
                  "--timeout", f"{int(timeout)}s", timeout=timeout + 30)
        deadline = time.monotonic() + timeout
        while self.pods():
            if time.monotonic() > deadline:
                raise InstallError(f"pods of {self.release} still there {timeout:.0f} s after "
                                   f"helm uninstall: {[p.metadata.name for p in self.pods()]}")
            time.sleep(1)

    # -- state ----------------------------------------------------------------------------------
    def pods(self, component: str | None = None) -> list[Any]:
        selector = f"app.kubernetes.io/instance={self.release}"
        if component:
            selector += f",app.kubernetes.io/component={component}"
        return list(self.core.list_namespaced_pod(self.namespace,
                                                  label_selector=selector).items)

    def deployment_name(self, component: str) -> str:
        """The component's Deployment name (the chart's kai-ray.fullname + component)."""
        # the chart's kai-ray.fullname: the release name when it contains "kai-ray"
        base = self.release if "kai-ray" in self.release else f"{self.release}-kai-ray"
        return f"{base[:50].rstrip('-')}-{component}"

    def wait_ready(self, timeout: float, since: float | None = None) -> None:
        """Until each Deployment has rolled out: every replica updated and Ready, and no pod of
        an older revision left, not even terminating."""
        start = since if since is not None else time.monotonic()
        deadline = start + timeout
        said = 0.0
        while True:
            waiting = [c for c in COMPONENTS if not self._rolled_out(c)]
            if not waiting:
                return
            now = time.monotonic()
            if now > deadline:
                raise InstallError(f"{', '.join(waiting)} not Ready {timeout:.0f} s after helm: "
                                   f"{self.describe(waiting)}")
            if now - said >= 15:
                said = now
                self.log(f"   waiting for {', '.join(waiting)} "
                         f"({now - start:.0f} s): {self.describe(waiting)}")
            time.sleep(0.5)

    def wait_webhook_answers(self, timeout: float, since: float | None = None) -> None:
        """Until the API server reaches the webhook: a dry-run create of a pod it intercepts
        is admitted. Ready replicas are not enough: their Service endpoints reach the node's
        proxy rules a moment later, and a pod created meanwhile is refused ("failed calling
        webhook ... connection refused"), as docs/install.md tells users."""
        if self.pods("webhook") == []:
            return  # webhook.enabled=false
        start = since if since is not None else time.monotonic()
        probe = {"metadata": {"name": "kai-ray-webhook-probe"},
                 "spec": {"schedulerName": "kai-scheduler",
                          "containers": [{"name": "c", "image": "busybox"}]}}
        while True:
            try:
                self.core.create_namespaced_pod("default", probe, dry_run="All")
                return
            except client.ApiException as e:
                if "failed calling webhook" not in str(e.body):
                    return  # the webhook answered (a refusal of the probe is an answer too)
                why = str(e.body)
            if time.monotonic() > start + timeout:
                raise InstallError(f"the API server does not reach the webhook {timeout:.0f} s "
                                   f"after helm: {why}")
            time.sleep(0.5)

    def _rolled_out(self, component: str) -> bool:
        try:
            dep = self.apps.read_namespaced_deployment(self.deployment_name(component),
                                                       self.namespace)
        except client.ApiException as e:
            if e.status == 404 and component == "webhook":
                return True  # webhook.enabled=false
            raise
        want = dep.spec.replicas or 0
        status = dep.status
        rolled = (status.observed_generation == dep.metadata.generation
                  and (status.updated_replicas or 0) == want
                  and (status.ready_replicas or 0) == want
                  and (status.replicas or 0) == want)
        # and the old pods gone, not only terminating (an old webhook replica still answers)
        return rolled and len(self.pods(component)) == want

    def describe(self, components: list[str] | tuple[str, ...] = COMPONENTS) -> str:
        """Each pod's phase and, when not Ready, what its containers wait on."""
        parts = []
        for component in components:
            for pod in self.pods(component):
                states = []
                for cs in pod.status.container_statuses or []:
                    st = cs.state
                    if st.waiting:
                        states.append(f"{cs.name} waiting {st.waiting.reason}: "
                                      f"{st.waiting.message or ''}".strip())
                    elif st.terminated:
                        states.append(f"{cs.name} exited {st.terminated.exit_code} "
                                      f"({st.terminated.reason})")
                    elif not cs.ready:
                        states.append(f"{cs.name} running, not ready "
                                      f"(restarts {cs.restart_count})")
                conds = [f"{c.type}={c.status}: {c.message}" for c in
                         pod.status.conditions or [] if c.status != "True" and c.message]
                parts.append(f"{pod.metadata.name} {pod.status.phase} "
                             f"{'; '.join(states + conds)}".strip())
        return "; ".join(parts) or "no pods yet"

    def logs(self, component: str = "scheduler", tail: int = 200) -> str:
        """The logs of the component's pods, each under a header line."""
        out = []
        for pod in self.pods(component):
            try:
                text = self.core.read_namespaced_pod_log(pod.metadata.name, self.namespace,
                                                         tail_lines=tail)
            except client.ApiException as e:
                text = f"(no log: {e.status} {e.reason})"
            out.append(f"--- {pod.metadata.name}\n{text}")
        return "\n".join(out)


class InClusterScheduler:
    """The integration suite's scheduler when kai-ray already runs in the cluster, installed by
    its chart (`kai-ray dev-cluster up --real-node --install`): the interface the tests use of
    a `kai-ray run` process (log_tail, alive, wait_ready), on the Deployment's pod. Restarting it
    means rolling the Deployment; `with_values` changes its configuration by `helm upgrade`."""

    def __init__(self, kubeconfig: Path, release: str = RELEASE,
                 namespace: str = NAMESPACE) -> None:
        self.chart = ChartInstall(Path(kubeconfig), None, release, namespace)
        self.kubeconfig = Path(kubeconfig)
        self.values: list[str] = []

    def log_tail(self, lines: int = 40) -> str:
        return self.chart.logs("scheduler", tail=lines)

    def alive(self) -> bool:
        return self.chart._rolled_out("scheduler")

    def wait_ready(self, timeout: float = 60.0) -> None:
        self.chart.wait_ready(timeout)

    def with_values(self, *values: str, timeout: float = 180) -> None:
        """`helm upgrade --reuse-values` with `values` (e.g. "--set", "k=v"); waits for the
        rolled pods and for the new scheduler to lead."""
        start = time.monotonic()
        self.chart.helm("upgrade", self.chart.release, str(CHART), "-n", self.chart.namespace,
                        "--reuse-values", *values)
        self.chart.wait_ready(timeout, since=start)
        deadline = time.monotonic() + 60
        while "became leader" not in self.log_tail(500):
            if time.monotonic() > deadline:
                raise InstallError(f"the upgraded scheduler does not lead: {self.log_tail()}")
            time.sleep(0.5)
