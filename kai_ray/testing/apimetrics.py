"""Requests the API server served, from its own metrics (`apiserver_request_total`), by verb,
resource and subresource: read before and after a piece of work, the difference is what the
work cost the API server, whoever's client sent it."""

from __future__ import annotations

from collections import Counter

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


def request_totals(api: client.ApiClient) -> Counter[Key]:
    """apiserver_request_total summed over codes, scopes and components."""
    totals: Counter[Key] = Counter()
    for line in rawapi.get_text(api, "/metrics").splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels, _, value = line[len("apiserver_request_total{"):].rpartition("} ")
        lab = _labels(labels)
        totals[(lab.get("verb", ""), lab.get("resource", ""), lab.get("subresource", ""))] += \
            int(float(value))
    return totals


def difference(after: Counter[Key], before: Counter[Key]) -> dict[Key, int]:
    """What was served between the two reads (keys with none left out)."""
    return {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}


def writes(diff: dict[Key, int]) -> int:
    return sum(n for (verb, _, _), n in diff.items() if verb.upper() in WRITES)
