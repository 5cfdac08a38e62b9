"""The fault proxy in front of the real kube-apiserver: TLS passes through it and still verifies
with the kubeconfig `kubeconfig_via` writes, and each fault shows as it should to a client."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3
from kubernetes import client, config

from kai_ray.testing.cluster import Cluster
from kai_ray.testing.faultproxy import FaultProxy, kubeconfig_server, kubeconfig_via

pytestmark = [pytest.mark.integration,
              pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")]


@pytest.fixture
def proxied(cluster: Cluster, tmp_path: Path) -> Iterator[tuple[FaultProxy, client.CoreV1Api]]:
    with FaultProxy(*kubeconfig_server(cluster.kubeconfig)) as proxy:
        path = kubeconfig_via(cluster.kubeconfig, proxy.port, tmp_path / "kubeconfig")
        api = config.new_client_from_config(config_file=str(path))
        assert api.configuration.verify_ssl  # verification on, not skipped
        yield proxy, client.CoreV1Api(api)
        api.close()


def _names(core: client.CoreV1Api) -> set[str]:
    return {n.metadata.name for n in core.list_namespace(_request_timeout=10).items}


def test_list_namespaces_through_the_proxy(proxied: tuple[FaultProxy, client.CoreV1Api]
                                           ) -> None:
    proxy, core = proxied
    assert {"default", "kube-system"} <= _names(core)
    assert proxy.accepted >= 1  # it went through the proxy, not around it


def test_faults_show_to_the_client_and_pass_recovers(
        proxied: tuple[FaultProxy, client.CoreV1Api]) -> None:
    proxy, core = proxied
    _names(core)
    proxy.set_mode("delay", delay_s=1.0)
    t = time.monotonic()
    assert "default" in _names(core)
    assert time.monotonic() - t >= 1.0

    proxy.set_mode("reset")
    with pytest.raises((urllib3.exceptions.HTTPError, OSError)):
        _names(core)

    proxy.set_mode("blackhole")
    with pytest.raises((urllib3.exceptions.HTTPError, OSError)):
        core.list_namespace(_request_timeout=2)

    proxy.set_mode("pass")
    assert "default" in _names(core)
