"""The Queue CRD's rules on a real API server: what it refuses (a Queue that is its own parent,
quota or limit below -1, a negative weight, a fractional priority), what it cannot see (a
cycle of two Queues: the scheduler reports that one), and that a self-parent stored before the
rule existed can still be written to (its status condition, its labels, the fix).

A control plane of this module's own: one test swaps the Queue CRD for a version without the
rule, which the shared `cluster`'s other tests must not see."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.k8s.crds import crd_manifests
from kai_ray.testing.plane import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

QUEUE_API = ("scheduling.run.ai", "v2", "queues")
OPEN = {"quota": -1, "limit": -1, "overQuotaWeight": 1}


def queue(name: str, parent: str | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"resources": {"gpu": dict(OPEN)}, **spec}
    if parent is not None:
        body["parentQueue"] = parent
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name},
            "spec": body}


def queue_crd(with_rules: bool = True) -> dict[str, Any]:
    crd = copy.deepcopy(next(m for m in crd_manifests()
                             if m["metadata"]["name"] == "queues.scheduling.run.ai"))
    if not with_rules:
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].pop("x-kubernetes-validations")
    return crd


@pytest.fixture
def api(plane: ControlPlane) -> Iterator[client.CustomObjectsApi]:
    """Queues are cluster-scoped: every Queue a test created is deleted after it, and the
    Queue CRD is the package's again."""
    api = client.CustomObjectsApi(plane.api_client())
    yield api
    plane.install_crds([queue_crd()])
    for q in api.list_cluster_custom_object(*QUEUE_API)["items"]:
        api.delete_cluster_custom_object(*QUEUE_API, q["metadata"]["name"])


def refused(call: Any, *args: Any) -> str:
    with pytest.raises(ApiException) as err:
        call(*args)
    assert err.value.status == 422, err.value.body
    return str(err.value.body)


def test_a_queue_that_is_its_own_parent_is_refused(api: client.CustomObjectsApi) -> None:
    body = refused(api.create_cluster_custom_object, *QUEUE_API, queue("loop", "loop"))
    assert "spec.parentQueue" in body and "cannot be its own parent" in body, body
    # nor can an update make one
    api.create_cluster_custom_object(*QUEUE_API, queue("top"))
    body = refused(api.patch_cluster_custom_object, *QUEUE_API, "top",
                   {"spec": {"parentQueue": "top"}})
    assert "spec.parentQueue" in body, body
    # a parent of another name, an empty one, none: accepted
    api.create_cluster_custom_object(*QUEUE_API, queue("leaf", "top"))
    api.create_cluster_custom_object(*QUEUE_API, queue("root-empty", ""))


@pytest.mark.parametrize(("resources", "field"), [
    ({"cpu": {"quota": -2}}, "spec.resources.cpu.quota"),
    ({"gpu": {"quota": 0, "limit": -1.5}}, "spec.resources.gpu.limit"),
    ({"memory": {"overQuotaWeight": -0.5}}, "spec.resources.memory.overQuotaWeight"),
])
def test_numbers_below_their_minimum_are_refused(api: client.CustomObjectsApi,
                                                 resources: dict[str, Any], field: str) -> None:
    body = refused(api.create_cluster_custom_object, *QUEUE_API,
                   queue("bad", resources=resources))
    assert field in body, body
    # the edges themselves are fine: -1 is unlimited, 0 is no weight
    api.create_cluster_custom_object(*QUEUE_API, queue("edge", resources={
        "cpu": {"quota": -1, "limit": -1, "overQuotaWeight": 0}}))


def test_a_fractional_priority_is_refused(api: client.CustomObjectsApi) -> None:
    body = refused(api.create_cluster_custom_object, *QUEUE_API, queue("half", priority=1.5))
    assert "spec.priority" in body, body


def test_a_cycle_of_two_queues_passes_the_api_server(api: client.CustomObjectsApi) -> None:
    """One object at a time, the API server cannot see it: the scheduler reports it."""
    api.create_cluster_custom_object(*QUEUE_API, queue("a", "b"))
    api.create_cluster_custom_object(*QUEUE_API, queue("b", "a"))
    assert api.get_cluster_custom_object(*QUEUE_API, "b")["spec"]["parentQueue"] == "a"


def test_a_self_parent_stored_before_the_rule_can_still_be_written(
        plane: ControlPlane, api: client.CustomObjectsApi) -> None:
    plane.install_crds([queue_crd(with_rules=False)])
    api.create_cluster_custom_object(*QUEUE_API, queue("legacy", "legacy"))
    plane.install_crds([queue_crd()])
    # the scheduler's condition, a label, another field: every write is checked by the rule
    condition = {"type": "Valid", "status": "False", "reason": "ParentCycle",
                 "message": "spec.parentQueue: legacy -> legacy"}
    api.patch_cluster_custom_object_status(*QUEUE_API, "legacy",
                                           {"status": {"conditions": [condition]}})
    api.patch_cluster_custom_object(*QUEUE_API, "legacy", {"metadata": {"labels": {"x": "y"}}})
    api.patch_cluster_custom_object(*QUEUE_API, "legacy", {"spec": {"priority": 7}})
    stored = api.get_cluster_custom_object(*QUEUE_API, "legacy")
    assert stored["status"]["conditions"][0]["reason"] == "ParentCycle"
    # fixed, it cannot go back
    api.patch_cluster_custom_object(*QUEUE_API, "legacy", {"spec": {"parentQueue": ""}})
    refused(api.patch_cluster_custom_object, *QUEUE_API, "legacy",
            {"spec": {"parentQueue": "legacy"}})
