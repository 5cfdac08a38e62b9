"""Kubernetes events with CamelCase reasons, deduplicated: the same reason and message on the
same object is written once, not once per cycle."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)
COMPONENT = "kai-scheduler"


class EventRecorder:
    def __init__(self, api: client.ApiClient, max_remembered: int = 50_000) -> None:
        self.core = client.CoreV1Api(api)
        self.seen: dict[tuple[str, str], str] = {}
        self.max_remembered = max_remembered

    def emit(self, obj: dict[str, Any], reason: str, message: str, kind: str = "Pod",
             api_version: str = "v1", type_: str = "Normal", dedupe: bool = True) -> None:
        m = obj.get("metadata") or {}
        uid = m.get("uid", m.get("name", ""))
        key = (uid, reason)
        if dedupe and self.seen.get(key) == message:
            return
        if len(self.seen) > self.max_remembered:
            self.seen.clear()
        self.seen[key] = message
        now = datetime.now(UTC)
        namespace = m.get("namespace") or "default"
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{m.get('name', 'obj')}.",
                                         namespace=namespace),
            involved_object=client.V1ObjectReference(
                kind=kind, api_version=api_version, name=m.get("name"), namespace=namespace,
                uid=m.get("uid"), resource_version=m.get("resourceVersion")),
            reason=reason, message=message[:1024], type=type_,
            source=client.V1EventSource(component=COMPONENT),
            reporting_component=COMPONENT, reporting_instance=COMPONENT,
            first_timestamp=now, last_timestamp=now, count=1)
        try:
            self.core.create_namespaced_event(namespace, body)
        except ApiException as e:  # events are best effort; never fail a cycle for one
            log.warning("event %s on %s/%s not written: %s", reason, namespace, m.get("name"),
                        e.status)
