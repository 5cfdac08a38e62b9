"""Event aggregation against a real API server: a repeat updates the one Event (count,
lastTimestamp) at most once per interval, an Event gone (expired, deleted) is written again, a
changed message is a new Event. The interval runs on a fake clock; the API is real."""

from __future__ import annotations

from kubernetes import client

from kai_ray.k8s.events import EventRecorder
from kai_ray.testing.cluster import Cluster


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _events(core: client.CoreV1Api, namespace: str, pod: str) -> list[client.CoreV1Event]:
    items = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={pod}").items
    return list(items)


def test_repeats_update_one_event_and_a_deleted_one_is_written_again(
        cluster: Cluster, namespace: str) -> None:
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    pod = core.create_namespaced_pod(namespace, {
        "metadata": {"name": "waits"},
        # no scheduler serves it: only this test's recorder writes events on it
        "spec": {"schedulerName": "nobody",
                 "containers": [{"name": "c", "image": "example.invalid/x:1"}]}})
    obj = api.sanitize_for_serialization(pod)
    clock = Clock()
    rec = EventRecorder(api, clock=clock, repeat_interval=600)
    message = "NotEnoughResources: no node has 16 free GPUs"

    rec.emit(obj, "Unschedulable", message, type_="Warning")
    for _ in range(60):  # a minute of one-second cycles: nothing more written
        clock.now += 1
        rec.emit(obj, "Unschedulable", message, type_="Warning")
    assert rec.flush(10)
    (first,) = _events(core, namespace, "waits")
    assert (first.count, first.reason, first.type, first.message) == (
        1, "Unschedulable", "Warning", message)
    assert first.involved_object.uid == pod.metadata.uid
    assert (rec.written, rec.suppressed) == (1, 60)

    clock.now += 600  # past the interval: the same Event, updated
    rec.emit(obj, "Unschedulable", message, type_="Warning")
    assert rec.flush(10)
    (same,) = _events(core, namespace, "waits")
    assert same.metadata.name == first.metadata.name
    assert same.count == 2 and same.last_timestamp >= first.last_timestamp
    assert same.first_timestamp == first.first_timestamp
    assert rec.aggregated == 1

    core.delete_namespaced_event(same.metadata.name, namespace)  # as if it had expired
    clock.now += 600
    rec.emit(obj, "Unschedulable", message, type_="Warning")
    assert rec.flush(10)
    (again,) = _events(core, namespace, "waits")
    assert again.metadata.name != first.metadata.name
    assert again.count == 3 and again.first_timestamp == first.first_timestamp

    rec.emit(obj, "Unschedulable", "OverQuota: queue team-a is over its limit",
             type_="Warning")  # a changed message: a new Event at once
    assert rec.flush(10)
    events = _events(core, namespace, "waits")
    assert sorted(e.message for e in events) == [message,
                                                 "OverQuota: queue team-a is over its limit"]
    assert rec.failed == 0 and rec.dropped == 0
