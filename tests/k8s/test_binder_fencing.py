"""Fencing: the binder writes only while its replica surely leads (`Binder.fence`, the
elector's lease_left), each request's timeout ends within that time, and a gang's intent is
written only over the PodGroup version it was decided on. Requests go to fakes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray import api_names
from kai_ray.controller.scheduler_loop import LoopConfig, SchedulerLoop
from kai_ray.k8s import rawapi
from kai_ray.k8s.binder import Binder, BinderConfig
from kai_ray.k8s.fencing import MIN_LEASE_LEFT_S, Fenced
from tests.k8s.test_binder_faults import _Binder, _setup, unbound


def test_no_lease_left_no_writes_and_the_intent_stays_for_the_next_leader() -> None:
    pods, pgs, result = _setup(["a", "b", "c"])
    binder = _Binder({})
    left = iter([10.0, 0.2])  # the lease runs out after the first bind
    binder.fence = lambda: next(left, 0.0)
    pgs["g"]["metadata"]["annotations"][api_names.BIND_INTENT_ANNOTATION] = json.dumps(
        {n: {"node": "n1"} for n in ("a", "b", "c")})
    assert binder.resume(pgs.values(), pods) == 1
    assert binder.bound == ["a"] and binder.fenced == 1
    assert unbound(pgs["g"]) == {"b", "c"}, "left for the next leader"
    assert not binder.gave_up and not binder._attempts and not binder._retry_at
    binder.fence = lambda: 0.0
    assert binder.apply_binds(result, pgs, pods) == 0 and binder.bound == ["a"]


def test_a_write_times_out_within_the_lease_left() -> None:
    binder = Binder(client.ApiClient(client.Configuration()), None)  # type: ignore[arg-type]
    assert binder.write_timeout() is None  # no election: the client's own timeout
    binder.fence = lambda: 4.0
    assert binder.write_timeout() == (4.0, 4.0)
    binder.fence = lambda: 60.0
    assert binder.write_timeout() == (5.0, 30.0)
    binder.fence = lambda: MIN_LEASE_LEFT_S / 2
    with pytest.raises(Fenced):
        binder.write_timeout()


def test_the_intent_is_written_only_over_the_version_decided_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[str, dict, Any]] = []
    current = {"rv": "7"}

    def request_json(api: Any, method: str, path: str, body: Any = None,
                     content_type: str = "", timeout: Any = None) -> dict:
        sent.append((method, body, timeout))
        if "binding" in path:
            return {}
        wanted = body["metadata"].get("resourceVersion")
        if wanted is not None and wanted != current["rv"]:
            raise ApiException(status=409, reason="Conflict")
        current["rv"] = str(int(current["rv"]) + 1)
        return {"metadata": {"resourceVersion": current["rv"]}}

    monkeypatch.setattr(rawapi, "request_json", request_json)
    monkeypatch.setattr(rawapi, "request", request_json)
    pods, pgs, result = _setup(["a", "b"])
    pgs["g"]["metadata"]["resourceVersion"] = "7"
    binder = Binder(client.ApiClient(client.Configuration()), _NoEvents(),  # type: ignore[arg-type]
                    BinderConfig(workers=1))
    binder.fence = lambda: 8.0
    assert binder.apply_binds(result, pgs, pods) == 2
    intent_patch = sent[0][1]["metadata"]
    assert intent_patch["resourceVersion"] == "7" and sent[0][2] == (5.0, 8.0)
    assert "resourceVersion" not in sent[-1][1]["metadata"]  # clearing names only our pods
    # another replica (or a user) changed the PodGroup since it was read: nothing is bound
    sent.clear()
    pods, pgs, result = _setup(["c", "d"])
    pgs["g"]["metadata"]["resourceVersion"] = "3"
    assert binder.apply_binds(result, pgs, pods) == 0
    assert [m for m, _, _ in sent] == ["PATCH"]


class _NoEvents:
    def emit(self, *_: Any, **__: Any) -> None:
        pass


def test_a_stopping_loop_fences_its_own_writes() -> None:
    loop = SchedulerLoop(client.ApiClient(client.Configuration()), object(),  # type: ignore[arg-type]
                         LoopConfig())
    loop.lease_left = lambda: 12.0
    assert loop.binder.fence() == 12.0
    ran: list[str] = []
    assert loop._step("status", "skipped", lambda: ran.append("x") or "ran") == "ran"
    loop.stopping.set()  # SIGTERM: no write after it, the lease is released after the loop
    assert loop.binder.fence() == 0.0
    assert loop._step("status", "skipped", lambda: ran.append("y")) == "skipped"
    assert ran == ["x"]


def test_a_cycle_writes_nothing_once_its_leadership_ended() -> None:
    """Lost and won back within one cycle: another leader may have bound meanwhile, so the
    rest of a cycle decided under the old leadership is not written."""
    loop = SchedulerLoop(client.ApiClient(client.Configuration()), object(),  # type: ignore[arg-type]
                         LoopConfig())
    epoch = [3]
    loop.leader_epoch = lambda: epoch[0]
    loop.lease_left = lambda: 9.0
    loop._cycle_epoch = loop.leader_epoch()  # as run() does at the start of each cycle
    assert loop.fence() == 9.0
    epoch[0] = 4
    assert loop.fence() == 0.0 and loop.binder.fence() == 0.0
