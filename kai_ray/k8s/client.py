"""The API client of `kai-ray run` and the command-line tools: a kubeconfig path, else
$KUBECONFIG / ~/.kube/config, else the pod's service account (in cluster)."""

from __future__ import annotations

import os
from typing import Any

from kubernetes import client, config

from kai_ray.k8s.ratelimit import DEFAULT_TIMEOUT, RateLimitedApiClient, bucket


def api_client(kubeconfig: str | None = None, pool_size: int = 64, qps: float = -1.0,
               burst: int = 0, timeout: tuple[float, float] = DEFAULT_TIMEOUT
               ) -> RateLimitedApiClient:
    """`pool_size` kept connections: more than the threads that use one client at a time
    (binder, grouper and status workers, one per watch), else urllib3 opens and drops extra
    ones, a TLS handshake each;
    `qps`/`burst`: one token bucket for every request of this client (negative QPS: no limit,
    the default for the tools); `timeout`: (connect, read) seconds of every request that does
    not name its own."""
    configuration = client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST") \
            and not os.environ.get("KUBECONFIG"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    return RateLimitedApiClient(configuration, bucket(qps, burst), timeout)


class LazyCoreV1Api:
    """`client.CoreV1Api(api)`, made on first use. Importing the generated class takes 0.4 s
    (it loads every core model), which a starting scheduler would otherwise spend before its
    first bind: the lists, binds, events, conditions and evictions go through
    `kai_ray.k8s.rawapi`, and this class is needed only by the rarer writes (a GPU-sharing bind's
    reservation pod and configmap, its namespace and service account)."""

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api
        self._made: client.CoreV1Api | None = None

    def __getattr__(self, name: str) -> Any:
        made = self._made
        if made is None:  # two threads may both make one: either serves
            made = self._made = client.CoreV1Api(self._api)
        return getattr(made, name)
