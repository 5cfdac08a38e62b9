"""Requests with plain-dict JSON bodies, for the hot paths (binds, events, patches): the generated
client validates every body into pydantic models and back, which costs more CPU than the request
itself. Authentication, the connection pool and the client's rate limit stay the ApiClient's."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.api_names import CustomResource

log = logging.getLogger(__name__)
Obj = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
# merges lists by their key (a pod's status.conditions by `type`), where a JSON merge patch
# would replace the whole list
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


Timeout = tuple[float, float] | None  # (connect, read) seconds; None: the client's own


def request(api: client.ApiClient, method: str, path: str, body: Any = None,
            content_type: str = "application/json", timeout: Timeout = None) -> None:
    """`method` on `path` (e.g. /api/v1/namespaces/ns/pods/p/binding); raises ApiException on
    a non-2xx answer as the generated client does. The response is always read to its end, so
    the connection goes back to the pool (an unread one is dropped, and the next request pays a
    new TLS handshake)."""
    _send(api, method, path, body, content_type, timeout)


def _send(api: client.ApiClient, method: str, path: str, body: Any, content_type: str,
          timeout: Timeout = None) -> bytes:
    """The request; its answer's body, read to the end (ApiException on a non-2xx answer)."""
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
    serialized = api.param_serialize(method, path, header_params=headers, body=body,
                                     auth_settings=["BearerToken"])
    resp = api.call_api(*serialized, _request_timeout=timeout)
    data: bytes = resp.read()
    _raise_unless_ok(resp, data)
    return data


def _raise_unless_ok(resp: Any, data: bytes) -> None:
    """ApiException, as the generated client raises it, for a non-2xx answer."""
    if not 200 <= resp.status <= 299:
        raise ApiException.from_response(http_resp=resp, body=data.decode("utf-8", "replace"),
                                         data=None)


def bind(api: client.ApiClient, namespace: str, name: str, uid: str | None, node: str,
         timeout: Timeout = None, annotations: Mapping[str, str] | None = None) -> None:
    """`annotations` land on the pod with the bind (the API server copies a Binding's)."""
    meta: Obj = {"name": name, "namespace": namespace}
    if uid:
        meta["uid"] = uid
    if annotations:
        meta["annotations"] = dict(annotations)
    request(api, "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding",
            {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
             "target": {"apiVersion": "v1", "kind": "Node", "name": node}}, timeout=timeout)


def create_event(api: client.ApiClient, namespace: str, event: Obj) -> None:
    request(api, "POST", f"/api/v1/namespaces/{namespace}/events", event)


def patch_pod(api: client.ApiClient, namespace: str, name: str, patch: Obj) -> None:
    request(api, "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", patch, MERGE_PATCH)


def patch_pod_status(api: client.ApiClient, namespace: str, name: str, patch: Obj) -> None:
    request(api, "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", patch,
            STRATEGIC_MERGE_PATCH)


def evict(api: client.ApiClient, namespace: str, name: str, timeout: Timeout = None) -> None:
    """The eviction API (policy/v1): the API server checks the pod's disruption budgets, 429
    while one forbids it."""
    request(api, "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction",
            {"apiVersion": "policy/v1", "kind": "Eviction",
             "metadata": {"name": name, "namespace": namespace}}, timeout=timeout)


def patch_custom(api: client.ApiClient, resource: CustomResource, namespace: str, name: str,
                 patch: Obj, subresource: str = "") -> None:
    path = resource.path(namespace, name)
    request(api, "PATCH", path + (f"/{subresource}" if subresource else ""), patch, MERGE_PATCH)


def create_custom(api: client.ApiClient, resource: CustomResource, namespace: str,
                  body: Obj) -> None:
    request(api, "POST", resource.path(namespace), body)


def annotate_quietly(api: client.ApiClient, resource: CustomResource, obj: Obj,
                     annotations: Mapping[str, str | None]) -> bool:
    """Merge `annotations` (None removes a key) into `obj`'s, for writes a later cycle repeats
    or can do without: an object already deleted (404) is ignored, any other refusal is logged,
    never raised. True when written."""
    m = obj["metadata"]
    try:
        patch_custom(api, resource, m["namespace"], m["name"],
                     {"metadata": {"annotations": dict(annotations)}})
    except ApiException as e:
        if e.status != 404:
            log.warning("%s %s annotations %s not written: %s", resource.kind, m["name"],
                        sorted(annotations), e.status)
        return False
    except Exception as e:  # a reset or a timeout: as any refusal, logged, never raised
        log.warning("%s %s annotations %s not written: %s: %s", resource.kind, m["name"],
                    sorted(annotations), type(e).__name__, e)
        return False
    return True


def lister(api: client.ApiClient, path: str) -> Callable[..., Any]:
    """A list-and-watch function of the collection at `path` (e.g. /api/v1/pods) that takes
    the generated `list_*` methods' keyword arguments with `_preload_content=False` and answers
    as they do: the urllib3 response, its body unread (ApiException on a non-2xx answer). The
    generated `CoreV1Api` takes 0.4 s to import (its models), which a starting scheduler need
    not wait for before it lists."""
    params = {"watch": "watch", "resource_version": "resourceVersion",
              "timeout_seconds": "timeoutSeconds", "allow_watch_bookmarks": "allowWatchBookmarks",
              "limit": "limit", "_continue": "continue"}

    def call(_preload_content: bool = False, _request_timeout: Any = None, **kw: Any) -> Any:
        if _preload_content:
            raise ValueError("rawapi.lister answers the raw response only")
        unknown = set(kw) - set(params)
        if unknown:
            raise TypeError(f"rawapi.lister: unknown arguments {sorted(unknown)}")
        query = [(params[k], ("true" if v else "false") if isinstance(v, bool) else v)
                 for k, v in kw.items() if v is not None]
        serialized = api.param_serialize("GET", path, query_params=query,
                                         header_params={"Accept": "application/json"},
                                         auth_settings=["BearerToken"])
        resp = api.call_api(*serialized, _request_timeout=_request_timeout)
        if not 200 <= resp.status <= 299:
            _raise_unless_ok(resp, resp.read())
        return resp.response

    return call


def get_bytes(api: client.ApiClient, path: str, timeout: Timeout = None) -> bytes:
    """GET `path`, the answer's body as it came (e.g. a pprof profile)."""
    return _send(api, "GET", path, None, "", timeout)


def get_text(api: client.ApiClient, path: str, timeout: Timeout = None) -> str:
    """GET `path` (e.g. /metrics), the answer as text."""
    return get_bytes(api, path, timeout).decode("utf-8", "replace")


def request_json(api: client.ApiClient, method: str, path: str, body: Any = None,
                 content_type: str = "application/json", timeout: Timeout = None) -> Obj:
    """As `request`, returning the answer's JSON object ({} when it is not one)."""
    data = _send(api, method, path, body, content_type, timeout)
    try:
        answer = orjson.loads(data) if data else {}
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


def create_event_named(api: client.ApiClient, namespace: str, event: Obj) -> str:
    """Create `event`; the name the API server gave it ("" when the answer names none), so a
    repeat can update this Event instead of writing another."""
    answer = request_json(api, "POST", f"/api/v1/namespaces/{namespace}/events", event)
    return str((answer.get("metadata") or {}).get("name") or "")


def patch_event(api: client.ApiClient, namespace: str, name: str, patch: Obj) -> None:
    request(api, "PATCH", f"/api/v1/namespaces/{namespace}/events/{name}", patch, MERGE_PATCH)
