"""A handle on a Kubernetes cluster reached through a kubeconfig (ours or anyone's).

`ControlPlane` (plane.py) starts one; `Cluster` alone points at an existing cluster (kind, a real
one) so tests and tools take either.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from kai_ray.k8s.crds import crd_manifests
from kai_ray.testing import binaries
from kai_ray.testing.nodes import create_gpu_nodes, wait_nodes_ready


class Cluster:
    """Any cluster reached through `kubeconfig`."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = Path(kubeconfig)
        self._api: client.ApiClient | None = None

    # -- clients ------------------------------------------------------------------------------
    def api_client(self) -> client.ApiClient:
        """A kubernetes ApiClient for this cluster (cached)."""
        if self._api is None:
            self._api = config.new_client_from_config(config_file=str(self.kubeconfig))
        return self._api

    def kubectl_path(self) -> str:
        """The kubectl built by tools/cluster/build.sh, else one on PATH."""
        try:
            return str(binaries.require("kubectl")["kubectl"])
        except binaries.BinariesMissing:
            found = shutil.which("kubectl")
            if found is None:
                raise
            return found

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; raises with its stderr when check and it fails."""
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        out = subprocess.run([self.kubectl_path(), *args], input=input, capture_output=True,
                             text=True, env=env, timeout=timeout, check=False)
        if check and out.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({out.returncode}): "
                               f"{out.stderr.strip()}")
        return out

    # -- CRDs ---------------------------------------------------------------------------------
    def install_crds(self, manifests: Iterable[dict[str, Any]] | None = None,
                     timeout: float = 30.0) -> list[str]:
        """Create (or update) CRDs, by default kai-ray's, and wait until they are Established."""
        ext = client.ApiextensionsV1Api(self.api_client())
        names = []
        for m in crd_manifests() if manifests is None else manifests:
            name = m["metadata"]["name"]
            try:
                ext.create_custom_resource_definition(m)
            except ApiException as e:
                if e.status != 409:
                    raise
                current = ext.read_custom_resource_definition(name)
                m = {**m, "metadata": {**m["metadata"],
                                       "resourceVersion": current.metadata.resource_version}}
                ext.replace_custom_resource_definition(name, m)
            names.append(name)
        self.wait_crds_established(names, timeout)
        return names

    def wait_crds_established(self, names: Sequence[str], timeout: float = 30.0) -> None:
        ext = client.ApiextensionsV1Api(self.api_client())
        deadline = time.monotonic() + timeout
        for name in names:
            while True:
                crd = ext.read_custom_resource_definition(name)
                conds = (crd.status.conditions or []) if crd.status else []
                if any(c.type == "Established" and c.status == "True" for c in conds):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"CRD {name} not Established after {timeout:.0f}s")
                time.sleep(0.05)

    # -- nodes --------------------------------------------------------------------------------
    def add_gpu_nodes(self, count: int, gpus_per_node: int, *, wait: bool = True,
                      timeout: float = 60.0, **kwargs: Any) -> list[str]:
        """Create KWOK GPU nodes (see nodes.gpu_node_manifest) and wait until they are Ready."""
        names = create_gpu_nodes(self.api_client(), count, gpus_per_node, **kwargs)
        if wait:
            wait_nodes_ready(self.api_client(), names, timeout)
        return names

    # -- objects ------------------------------------------------------------------------------
    def create_yaml(self, text: str, namespace: str | None = None) -> str:
        """`kubectl create` a YAML text (any kinds, CRs included); returns kubectl's output."""
        args = ["create", "-f", "-"]
        if namespace:
            args += ["-n", namespace]
        return self.kubectl(*args, input=text).stdout

    def wait_service_account(self, namespace: str, name: str = "default",
                             timeout: float = 30.0) -> None:
        """Wait for the controller-manager to create a namespace's ServiceAccount."""
        core = client.CoreV1Api(self.api_client())
        deadline = time.monotonic() + timeout
        while True:
            try:
                core.read_namespaced_service_account(name, namespace)
                return
            except ApiException as e:
                if e.status != 404:
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"ServiceAccount {namespace}/{name} not created after {timeout:.0f}s "
                    "(is kube-controller-manager running?)")
            time.sleep(0.05)


def load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    """Every non-empty YAML document in a file."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d]
