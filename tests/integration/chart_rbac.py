"""The chart's ServiceAccounts and RBAC in a test cluster, and kubeconfigs that authenticate as
those accounts, so the controllers run out of cluster (no chart pod runs here: KWOK has no
kubelet, and there is no image) with exactly the credentials the chart gives their pods. A
call the chart's RBAC does not allow fails in the tests as it would in a cluster: the fix is
the chart's, never a grant made here."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.testing import binaries
from kai_ray.testing.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kai-ray"
# what `kai-ray run` needs of the chart: the ServiceAccounts, the scheduler's roles and the
# policy that narrows its writes, the reservation namespace with the reservation pods' account
# and role, and the scheduler's configuration
SCHEDULER_TEMPLATES = ("templates/serviceaccounts.yaml", "templates/rbac-scheduler.yaml",
                       "templates/rbac-scheduler-writes.yaml",
                       "templates/reservation-namespace.yaml",
                       "templates/reservation-rbac.yaml", "templates/scheduler-config.yaml")


def helm_template(release: str, namespace: str, *templates: str,
                  sets: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The chart's objects as `helm template` renders them (only `templates` when given)."""
    args = [str(binaries.require("helm")["helm"]), "template", release, str(CHART), "-n",
            namespace]
    for t in templates:
        args += ["--show-only", t]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, f"helm template:\n{out.stdout}\n{out.stderr}"
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def token_kubeconfig(cluster: Cluster, sa: str, namespace: str, path: Path,
                     expiration_s: int = 3600) -> Path:
    """A kubeconfig that authenticates as ServiceAccount `namespace/sa`, with a TokenRequest
    token (valid `expiration_s`), against the cluster the admin kubeconfig names."""
    core = client.CoreV1Api(cluster.api_client())
    tr = core.create_namespaced_service_account_token(
        sa, namespace, {"spec": {"expirationSeconds": expiration_s}})
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    context = next((c["context"] for c in admin.get("contexts") or []
                    if c["name"] == admin.get("current-context")), None)
    clusters = {c["name"]: c["cluster"] for c in admin["clusters"]}
    server = clusters[context["cluster"]] if context else admin["clusters"][0]["cluster"]
    doc = {"apiVersion": "v1", "kind": "Config",
           "clusters": [{"name": "cluster", "cluster": server}],
           "users": [{"name": sa, "user": {"token": tr.status.token}}],
           "contexts": [{"name": sa, "context": {"cluster": "cluster", "user": sa}}],
           "current-context": sa}
    path.write_text(yaml.safe_dump(doc))
    return path


@dataclass(frozen=True)
class ChartScheduler:
    """How the chart's scheduler Deployment runs `kai-ray run`: its token, its config."""

    kubeconfig: Path
    config: Path
    args: list[str]  # besides --kubeconfig
    service_account: str  # system:serviceaccount:<namespace>:<name>


def install_scheduler_rbac(cluster: Cluster, workdir: Path, release: str = "kai-ray",
                           namespace: str = "kube-system",
                           token_expiration_s: int = 86400) -> ChartScheduler:
    """Apply SCHEDULER_TEMPLATES of release `release` in `namespace` and return how to run
    the scheduler as the chart does (its args, its ConfigMap's config, its account's token)."""
    docs = helm_template(release, namespace, *SCHEDULER_TEMPLATES)
    core = client.CoreV1Api(cluster.api_client())
    try:
        core.create_namespace({"metadata": {"name": namespace}})
    except ApiException as e:
        if e.status != 409:
            raise
    # namespaces first, as helm installs them (kubectl applies in the order given)
    docs.sort(key=lambda d: d["kind"] != "Namespace")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    config = workdir / "config.yaml"
    config.write_text(cm["data"]["config.yaml"])
    (args,) = [d["spec"]["template"]["spec"]["containers"][0]["args"] for d in helm_template(
        release, namespace, "templates/scheduler-deployment.yaml") if d["kind"] == "Deployment"]
    # the Deployment's own flags, but for those that only make sense in its pod (the config
    # mounted elsewhere, the ports probes and Prometheus reach)
    run = ["--config", str(config)] + [
        a for a in args[1:] if a.startswith(("--leader-election=", "--lease-namespace=",
                                             "--lease-name=", "--log-level="))]
    (sa_doc,) = [d for d in docs if d["kind"] == "ServiceAccount"
                 and d["metadata"]["name"].endswith("-scheduler")]
    sa = sa_doc["metadata"]["name"]
    cluster.wait_service_account(namespace, sa)
    kubeconfig = token_kubeconfig(cluster, sa, namespace, workdir / f"{sa}.kubeconfig",
                                  token_expiration_s)
    return ChartScheduler(kubeconfig, config, run, f"system:serviceaccount:{namespace}:{sa}")
