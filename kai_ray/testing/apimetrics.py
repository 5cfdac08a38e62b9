"""Requests the API server served, from its own metrics (`apiserver_request_total`), by verb,
resource and subresource: read before and after a piece of work, the difference is what the
work cost the API server, whoever's client sent it."""

from __future__ import annotations

from collections import Counter
from typing import Any

from kubernetes import client

from kai_ray.k8s import rawapi

Key = tuple[str, str, str]  # (verb, resource, subresource)
WRITES = ("POST", "PUT", "PATCH", "DELETE", "CREATE", "UPDATE")


def _labels(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split('",'):
        name, _, value = part.partition('="')
        out[name.strip().lstrip(",")] = value.rstrip('"')
    return out


def metric_sums(api: client.ApiClient, metric: str, by: tuple[str, ...]
                ) -> Counter[tuple[str, ...]]:
    """One metric of the API server's /metrics, summed by the labels `by` (the others summed
    over)."""
    totals: Counter[tuple[str, ...]] = Counter()
    prefix = metric + "{"
    for line in rawapi.get_text(api, "/metrics").splitlines():
        if not line.startswith(prefix):
            continue
        labels, _, value = line[len(prefix):].rpartition("} ")
        lab = _labels(labels)
        totals[tuple(lab.get(name, "") for name in by)] += float(value)
    return totals


def request_totals(api: client.ApiClient) -> Counter[Key]:
    """apiserver_request_total summed over codes, scopes and components."""
    sums = metric_sums(api, "apiserver_request_total", ("verb", "resource", "subresource"))
    return Counter({(k[0], k[1], k[2]): int(v) for k, v in sums.items()})


def serving_seconds(api: client.ApiClient) -> Counter[Key]:
    """Seconds the API server spent serving requests, by verb and resource (from
    apiserver_request_duration_seconds_sum; WATCH requests, which last as long as the watch,
    left out): where its time goes, not its CPU, but the two follow each other."""
    sums = metric_sums(api, "apiserver_request_duration_seconds_sum",
                       ("verb", "resource", "subresource"))
    return Counter({(k[0], k[1], k[2]): v for k, v in sums.items()
                    if k[0] not in ("WATCH", "WATCHLIST", "CONNECT")})


def watch_events(api: client.ApiClient) -> Counter[str]:
    """Watch events the API server sent, by kind, and their bytes (kind + ' bytes'): a write
    costs once per watcher of its kind."""
    out: Counter[str] = Counter()
    # labelled by kind before Kubernetes 1.32, by resource since
    for metric, suffix in (("apiserver_watch_events_total", ""),
                           ("apiserver_watch_events_sizes_sum", " bytes")):
        for (kind, resource), n in metric_sums(api, metric, ("kind", "resource")).items():
            out[(kind or resource) + suffix] += n
    return out


def difference(after: Counter[Any], before: Counter[Any]) -> dict[Any, Any]:
    """What was served between the two reads (keys with none left out)."""
    return {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}


def writes(diff: dict[Key, int]) -> int:
    return sum(n for (verb, _, _), n in diff.items() if verb.upper() in WRITES)
