"""A bind, resume or eviction that fails is that gang's (or victim's) outcome: never raised
into the cycle. A refusal is counted per pod, and after `bind_attempts` of them the pod and its
gang's unbound pods go back to Pending with a BindFailed condition; a transient fault keeps the
gang in its intent, retried after a back-off, however long it lasts. API calls are replaced by
fakes that fail on purpose."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray import api_names
from kai_ray.core.result import Bind, CycleResult
from kai_ray.k8s import convert
from kai_ray.k8s.binder import Binder, BinderConfig


class _Events:
    def __init__(self) -> None:
        self.emitted: list[tuple[str, str, str]] = []

    def emit(self, obj: dict, reason: str, message: str, **_: Any) -> None:
        self.emitted.append((obj["metadata"]["name"], reason, message))


class _Core:
    def __init__(self, evict_error: Exception | None = None) -> None:
        self.evict_error = evict_error
        self.evicted: list[str] = []
        self.patched: list[tuple[str, dict]] = []
        self.deleted_configmaps: list[str] = []

    def patch_namespaced_pod(self, name: str, ns: str, body: dict) -> None:
        self.patched.append((name, body))

    def delete_namespaced_config_map(self, name: str, ns: str) -> None:
        self.deleted_configmaps.append(name)

    def create_namespaced_pod_eviction(self, name: str, ns: str, body: Any, **_: Any) -> None:
        if self.evict_error is not None:
            raise self.evict_error
        self.evicted.append(name)


class _Binder(Binder):
    """Binds fail for the pods named in `refuse` with the exception given there."""

    def __init__(self, refuse: dict[str, Exception], attempts: int = 3,
                 retry_s: tuple[float, float] = (1.0, 30.0), workers: int = 1,
                 gang_bind_workers: int = 1) -> None:
        super().__init__(client.ApiClient(client.Configuration()), _Events(),  # type: ignore[arg-type]
                         BinderConfig(bind_attempts=attempts, workers=workers,
                                      retry_s=retry_s, gang_bind_workers=gang_bind_workers))
        self.refuse = refuse
        self.core = _Core()  # type: ignore[assignment]
        self.conditions: list[tuple[str, str, str]] = []  # (pod, reason, message)
        self.bound: list[str] = []
        self.tries: list[str] = []
        self.patches: list[dict] = []
        self.server_bound: set[str] = set()
        self.unreadable_now: set[str] = set()

    def _not_scheduled(self, pod: dict, reason: str, message: str) -> None:
        self.conditions.append((pod["metadata"]["name"], reason, message))

    def _post_eviction(self, pod: dict, timeout: Any) -> None:
        m = pod["metadata"]  # to the fake API below (`core`), which the tests replace
        self.core.create_namespaced_pod_eviction(m["name"], m["namespace"], None)

    def _bind(self, pod: dict, node: str, annotations: object = None) -> None:
        name = pod["metadata"]["name"]
        self.tries.append(name)
        if name in self.refuse:
            raise self.refuse[name]
        self.bound.append(name)

    def _bound_now_on_server(self, pod: dict) -> bool | None:
        """What a fresh read of the pod says: `server_bound` names pods bound there (a bind
        that timed out but landed), `unreadable_now` those that cannot be read now."""
        name = pod["metadata"]["name"]
        return None if name in self.unreadable_now else name in self.server_bound

    def _patch_pg_annotations(self, pg: dict, annotations: Any, guarded: bool = False) -> None:
        self.patches.append(dict(annotations))


def _pod(name: str, group: str = "g") -> dict:
    """A pending pod of our scheduler in PodGroup `group` (an intent acts only on those)."""
    return {"metadata": {"name": name, "namespace": "ns", "uid": name,
                         "annotations": {api_names.POD_GROUP_ANNOTATION: group}},
            "spec": {"schedulerName": api_names.SCHEDULER_NAME}, "status": {"phase": "Pending"}}


def unbound(pg: dict) -> set[str]:
    """The intent's entries not bound yet (bound ones stay, marked, until the gang is whole)."""
    return {k for k, v in convert.bind_intent(pg).items() if not v.get("bound")}


def _setup(names: list[str]) -> tuple[dict, dict, CycleResult]:
    pods = {f"ns/{n}": _pod(n) for n in names}
    pg = {"metadata": {"name": "g", "namespace": "ns", "annotations": {}}}
    result = CycleResult()
    result.binds.extend(Bind(job="g", namespace="ns", pod=n, node="n1") for n in names)
    return pods, {"g": pg}, result


def test_a_reset_connection_keeps_the_gang_in_its_intent_and_stops_its_binds() -> None:
    pods, pgs, result = _setup(["a", "b"])
    binder = _Binder({"a": ConnectionResetError("reset by peer")})
    assert binder.apply_binds(result, pgs, pods) == 0  # no exception
    assert binder.bound == [] and not binder.gave_up
    intent = convert.bind_intent(pgs["g"])
    assert set(intent) == {"a", "b"}  # a later cycle's resume() goes on


def test_after_the_allowed_tries_the_gang_goes_back_to_pending() -> None:
    pods, pgs, result = _setup(["a", "b"])
    refusal = ApiException(status=422, reason="Unprocessable Entity")
    refusal.body = json.dumps({"message": "bindings of a are not allowed by policy p"})
    binder = _Binder({"a": refusal}, attempts=3)
    binder.apply_binds(result, pgs, pods)
    for _ in range(2):
        assert not binder.gave_up
        binder.resume(pgs.values(), pods)  # what the next cycles do
    # both back off: b alone could never make the gang, and must not take its room meanwhile
    assert set(binder.gave_up) == {"ns/a", "ns/b"}
    assert not convert.bind_intent(pgs["g"]), "the gang's unbound pods leave the intent"
    assert binder.bound == []
    conditions = {pod: (reason, message) for pod, reason, message in binder.conditions}
    assert {reason for reason, _ in conditions.values()} == {"BindFailed"}
    assert "not allowed by policy p" in conditions["a"][1]
    assert "3 times" in conditions["a"][1]
    assert "the bind of a, a pod of the same gang, was refused" in conditions["b"][1]
    assert any(r == "BindFailed" for _, r, _ in binder.events.emitted)  # type: ignore[attr-defined]


def test_a_refusal_midway_leaves_the_bound_pods_and_returns_the_rest() -> None:
    pods, pgs, result = _setup(["a", "b", "c"])
    binder = _Binder({"b": ApiException(status=403, reason="Forbidden")}, attempts=1)
    assert binder.apply_binds(result, pgs, pods) == 1
    assert binder.bound == ["a"] and set(binder.gave_up) == {"ns/b", "ns/c"}
    assert not convert.bind_intent(pgs["g"])
    # the transaction is rolled back: no pod of the gang is left bound by it
    assert binder.core.evicted == ["a"]  # type: ignore[attr-defined]
    assert ("g", "BindRolledBack") in [(n, r) for n, r, _ in binder.events.emitted]  # type: ignore[attr-defined]


def test_transient_faults_are_retried_with_back_off_and_never_given_up() -> None:
    for fault in (ConnectionResetError("reset by peer"), TimeoutError("read timed out"),
                  ApiException(status=503, reason="Service Unavailable"),
                  ApiException(status=429, reason="Too Many Requests"),
                  ApiException(status=500, reason="Internal Server Error")):
        pods, pgs, result = _setup(["a", "b"])
        binder = _Binder({"a": fault}, attempts=2, retry_s=(0.0, 0.0))
        binder.apply_binds(result, pgs, pods)
        for _ in range(10):  # far more cycles than bind_attempts
            binder.resume(pgs.values(), pods)
        assert not binder.gave_up and set(convert.bind_intent(pgs["g"])) == {"a", "b"}, fault
        assert binder.tries == ["a"] * 11 and binder.conditions == []
        assert any(r == "BindRetrying" for _, r, _ in binder.events.emitted)  # type: ignore[attr-defined]
        del binder.refuse["a"]  # the fault ends: the gang is bound
        assert binder.resume(pgs.values(), pods) == 2 and not convert.bind_intent(pgs["g"])


def test_a_transient_fault_waits_out_its_back_off() -> None:
    pods, pgs, result = _setup(["a"])
    pods["ns/b"] = _pod("b")
    result.binds.append(Bind(job="g", namespace="ns", pod="b", node="n1"))
    binder = _Binder({"a": ConnectionResetError("reset")}, retry_s=(60.0, 60.0))
    binder.apply_binds(result, pgs, pods)
    binder.resume(pgs.values(), pods)  # the next cycle, well within the minute
    assert binder.tries == ["a"], "tried again before its back-off ended"


def test_a_denial_over_500_is_a_refusal() -> None:
    denied = ApiException(status=500, reason="Internal Server Error")
    denied.body = json.dumps({"message": 'admission webhook "x" denied the request: no'})
    pods, pgs, result = _setup(["a"])
    result.binds.append(Bind(job="g", namespace="ns", pod="b", node="n1"))
    pods["ns/b"] = _pod("b")
    binder = _Binder({"a": denied}, attempts=1)
    binder.apply_binds(result, pgs, pods)
    assert set(binder.gave_up) == {"ns/a", "ns/b"}


def test_gangs_resume_concurrently_each_on_its_own() -> None:
    pods: dict = {}
    pgs: dict = {}
    for g in range(6):
        names = [f"p{g}-{i}" for i in range(3)]
        pods.update({f"ns/{n}": _pod(n, f"g{g}") for n in names})
        pgs[f"g{g}"] = {"metadata": {"name": f"g{g}", "namespace": "ns", "annotations": {
            api_names.BIND_INTENT_ANNOTATION: json.dumps({n: {"node": "n1"} for n in names})}}}
    binder = _Binder({"p2-1": ApiException(status=422, reason="Invalid")}, attempts=5,
                     workers=4)
    assert binder.resume(pgs.values(), pods) == 16
    assert binder.bound_total == 16 and len(binder.resumed) == 16
    assert unbound(pgs["g2"]) == {"p2-1", "p2-2"}
    assert convert.bind_intent(pgs["g2"])["p2-0"]["bound"] is True  # kept for a rollback


def test_gone_or_already_bound_pods_are_not_failures() -> None:
    pods, pgs, result = _setup(["a", "b"])
    binder = _Binder({"a": ApiException(status=409, reason="Conflict")})
    assert binder.apply_binds(result, pgs, pods) == 1
    assert binder.bound == ["b"] and not binder.gave_up and not binder._attempts


def test_an_unreadable_intent_entry_is_dropped_not_raised() -> None:
    pods, pgs, _ = _setup(["a", "b"])
    pgs["g"]["metadata"]["annotations"][api_names.BIND_INTENT_ANNOTATION] = json.dumps(
        {"a": {"node": "n1"}, "b": "garbage"})
    binder = _Binder({})
    assert binder.resume(pgs.values(), pods) == 1
    assert binder.bound == ["a"]
    assert not convert.bind_intent(pgs["g"])
    # a string where a list belongs would be one GPU group per character
    pgs["g"]["metadata"]["annotations"][api_names.BIND_INTENT_ANNOTATION] = json.dumps(
        {"b": {"node": "n1", "gpu_groups": "g-1"}})
    binder.resume(pgs.values(), pods)
    assert binder.bound == ["a"] and not convert.bind_intent(pgs["g"])


def test_reservation_clean_up_reads_a_hand_edited_intent_without_raising() -> None:
    pg = {"metadata": {"name": "g", "namespace": "ns", "annotations": {
        api_names.BIND_INTENT_ANNOTATION: json.dumps({"a": "x", "b": {"gpu_groups": "abc"}})}}}
    assert _Binder({}).collect_reservations([], [pg]) == 0


def test_a_refused_or_failed_eviction_is_reported_on_the_victim() -> None:
    for error, shown in ((ApiException(status=500, reason="Internal Server Error"), "500"),
                         (ApiException(status=429, reason="Too Many Requests"), "429"),
                         (TimeoutError("read timed out"), "TimeoutError")):
        binder = _Binder({})
        binder.core = _Core(error)  # type: ignore[assignment]
        assert binder.evict(_pod("victim"), "preempted", "preempt") is False
        (name, reason, message), = binder.events.emitted  # type: ignore[attr-defined]
        assert (name, reason) == ("victim", "EvictionRefused") and shown in message


def _with_intent(pods: dict, pgs: dict, since: float, **entries: dict) -> None:
    pgs["g"]["metadata"]["annotations"][api_names.BIND_INTENT_ANNOTATION] = json.dumps(
        {n: {"node": "n1", "since": since, **e} for n, e in entries.items()})


def test_a_transaction_past_its_deadline_is_rolled_back() -> None:
    import time

    pods, pgs, _ = _setup(["a", "b"])
    pods["ns/a"]["spec"]["nodeName"] = "n1"  # bound by the transaction
    pods["ns/b"]["metadata"]["labels"] = {api_names.GPU_GROUP_LABEL: "grp"}  # set up, not bound
    binder = _Binder({})
    _with_intent(pods, pgs, time.time() - 10, a={"bound": True}, b={})
    assert binder.resume(pgs.values(), pods) == 1, "within its deadline it goes on"
    pods, pgs, _ = _setup(["a", "b"])
    pods["ns/a"]["spec"]["nodeName"] = "n1"
    pods["ns/b"]["metadata"]["labels"] = {api_names.GPU_GROUP_LABEL: "grp"}
    pods["ns/b"]["spec"]["containers"] = [{"name": "main"}]
    binder = _Binder({})
    _with_intent(pods, pgs, time.time() - binder.config.bind_deadline_s - 1,
                 a={"bound": True}, b={})
    assert binder.resume(pgs.values(), pods) == 0 and binder.bound == []
    assert binder.core.evicted == ["a"]  # type: ignore[attr-defined]
    assert set(binder.gave_up) == {"ns/b"} and "not bound whole within 300s" in \
        binder.gave_up["ns/b"]
    assert binder.core.patched == [  # type: ignore[attr-defined]
        ("b", {"metadata": {"labels": {api_names.GPU_GROUP_LABEL: None}}})]
    assert binder.core.deleted_configmaps == ["b-shared-gpu-0"]  # type: ignore[attr-defined]
    assert not convert.bind_intent(pgs["g"])


def test_a_gang_is_not_resumed_onto_a_node_that_is_gone() -> None:
    import time

    pods, pgs, _ = _setup(["a", "b"])
    binder = _Binder({})
    binder.nodes = {"n2": {"metadata": {"name": "n2"}}}
    _with_intent(pods, pgs, time.time(), a={}, b={})
    assert binder.resume(pgs.values(), pods) == 0 and binder.bound == []
    assert "node n1, where a was to be bound, is gone" in binder.gave_up["ns/a"]
    assert not convert.bind_intent(pgs["g"])


def test_bound_entries_stay_marked_until_the_gang_is_whole() -> None:
    import time

    pods, pgs, _ = _setup(["a", "b"])
    binder = _Binder({"b": ConnectionResetError("reset")}, retry_s=(0.0, 0.0))
    _with_intent(pods, pgs, time.time(), a={}, b={})
    binder.resume(pgs.values(), pods)
    assert convert.bind_intent(pgs["g"])["a"]["bound"] is True and unbound(pgs["g"]) == {"b"}
    pods["ns/a"]["spec"]["nodeName"] = "n1"
    del binder.refuse["b"]
    assert binder.resume(pgs.values(), pods) == 1
    assert not convert.bind_intent(pgs["g"]), "whole: the transaction ends"
    # a crash after the last bind but before the clean-up: the next leader ends it
    _with_intent(pods, pgs, time.time(), a={"bound": True}, b={"bound": True})
    assert binder.resume(pgs.values(), pods) == 0 and not convert.bind_intent(pgs["g"])


def test_shared_gpu_set_up_only_over_the_pod_as_read() -> None:
    from kai_ray.k8s.binder import StaleRead, is_transient

    class _Conflicting(_Core):
        def patch_namespaced_pod(self, name: str, ns: str, body: dict, **_: Any) -> None:
            self.patched.append((name, body))
            raise ApiException(status=409, reason="Conflict")

    pod = _pod("a")
    pod["metadata"]["resourceVersion"] = "41"
    pod["spec"]["containers"] = [{"name": "main"}]
    binder = _Binder({})
    binder.core = _Conflicting()  # type: ignore[assignment]
    bind = Bind(job="ns/g", namespace="ns", pod="a", node="n1", gpu_groups=("grp",),
                gpu_portion=0.5)
    with pytest.raises(StaleRead) as info:
        binder._prepare_shared_gpu(pod, bind, ["GPU-1"])
    assert is_transient(info.value)  # retried on the next cycle's view, never given up
    (_, body), = binder.core.patched  # type: ignore[attr-defined]
    assert body["metadata"]["resourceVersion"] == "41"
    assert binder.core.deleted_configmaps == []  # type: ignore[attr-defined]


def test_an_intent_acts_only_on_the_pods_of_its_gang_as_decided() -> None:
    """A forged or stale entry never binds, nor has evicted, a pod that is not this gang's
    (another scheduler's, another PodGroup's, or one made anew under the same name)."""
    import time

    pods, pgs, _ = _setup(["a"])
    pods["ns/foreign"] = {**_pod("foreign"), "spec": {"schedulerName": "default-scheduler"}}
    pods["ns/other"] = _pod("other", group="someone-else")
    pods["ns/victim"] = {**_pod("victim", group="someone-else"),
                         "spec": {"schedulerName": api_names.SCHEDULER_NAME, "nodeName": "n1"}}
    pods["ns/renewed"] = _pod("renewed")
    binder = _Binder({})
    _with_intent(pods, pgs, 0.0, a={"uid": "a"}, foreign={}, other={}, victim={"bound": True},
                 renewed={"uid": "the-old-one"}, ghost={})
    binder.resume(pgs.values(), pods)
    # past its deadline (since 0): rolled back, but only its own pod a was ever touched
    assert binder.bound == [] and binder.core.evicted == []  # type: ignore[attr-defined]
    assert set(binder.gave_up) == {"ns/a"} and not convert.bind_intent(pgs["g"])
    _with_intent(pods, pgs, time.time(), a={"uid": "a"}, foreign={}, other={},
                 renewed={"uid": "the-old-one"})
    binder = _Binder({})
    assert binder.resume(pgs.values(), pods) == 1 and binder.bound == ["a"]


def test_a_rollback_asks_the_api_server_and_finishes_over_cycles() -> None:
    """A pod the cache shows Pending but the API server has bound (a bind that timed out and
    landed) is evicted, not told it is Pending; a pod that cannot be read now, or whose
    eviction a disruption budget refuses, keeps the rollback going next cycle."""
    pods, pgs, _ = _setup(["landed", "unsure", "guarded", "pending"])
    pods["ns/guarded"]["spec"]["nodeName"] = "n1"
    binder = _Binder({})
    binder.server_bound = {"landed"}
    binder.unreadable_now = {"unsure"}
    refusing = ApiException(status=429, reason="Too Many Requests")
    evicted: list[str] = []

    def evict(name: str, ns: str, body: Any, **_: Any) -> None:
        if name == "guarded":
            raise refusing
        evicted.append(name)

    binder.core.create_namespaced_pod_eviction = evict  # type: ignore[attr-defined]
    _with_intent(pods, pgs, 0.0, landed={}, unsure={}, guarded={"bound": True}, pending={})
    binder.resume(pgs.values(), pods)
    assert evicted == ["landed"]
    assert set(binder.gave_up) == {"ns/pending"}
    left = convert.bind_intent(pgs["g"])
    assert set(left) == {"unsure", "guarded"} and all(v["rollback"] for v in left.values())
    # next cycle: the budget allows it, the pod can be read (not bound): the rollback ends
    refusing.status = 0
    binder.unreadable_now = set()
    binder.core.create_namespaced_pod_eviction = (  # type: ignore[attr-defined]
        lambda name, *a, **k: evicted.append(name))
    binder.resume(pgs.values(), pods)
    assert evicted == ["landed", "guarded"] and "ns/unsure" in binder.gave_up
    assert not convert.bind_intent(pgs["g"])


def test_the_start_is_stamped_once_not_with_every_later_bind() -> None:
    import time

    pods, pgs, _ = _setup(["a", "b"])
    binder = _Binder({"b": ConnectionResetError("reset")}, retry_s=(0.0, 0.0))
    _with_intent(pods, pgs, time.time(), a={"start": True}, b={"start": True})
    binder.resume(pgs.values(), pods)
    stamps = [p for p in binder.patches if api_names.LAST_START_ANNOTATION in p]
    assert len(stamps) == 1 and not any(
        v.get("start") for v in convert.bind_intent(pgs["g"]).values())
    del binder.refuse["b"]
    binder.resume(pgs.values(), pods)  # b binds later: the start stays when a began
    assert len([p for p in binder.patches if api_names.LAST_START_ANNOTATION in p]) == 1


def test_the_after_binds_hook_runs_once_per_bind_phase_even_when_a_gang_fails() -> None:
    pods, pgs, result = _setup(["a", "b"])
    binder = _Binder({"a": ConnectionResetError("reset by peer")})
    calls: list[int] = []
    binder.after_binds = lambda: calls.append(len(binder.tries))
    binder.apply_binds(result, pgs, pods)
    assert calls == [1]  # after the gang's try, not before


def test_a_gangs_later_binds_go_out_together_once_its_first_went_through() -> None:
    pods, pgs, result = _setup(["a", "b", "c", "d"])
    binder = _Binder({}, gang_bind_workers=3)
    assert binder.apply_binds(result, pgs, pods) == 4
    assert binder.tries[0] == "a" and sorted(binder.bound) == ["a", "b", "c", "d"]
    assert not unbound(pgs["g"]) and binder.bound_total == 4
    scheduled = [n for n, r, _ in binder.events.emitted if r == "Scheduled"]  # type: ignore[attr-defined]
    assert sorted(scheduled) == ["a", "b", "c", "d"]


def test_a_first_bind_refused_sends_none_of_the_rest() -> None:
    pods, pgs, result = _setup(["a", "b", "c"])
    binder = _Binder({"a": ApiException(status=403, reason="Forbidden")}, attempts=1,
                     gang_bind_workers=3)
    assert binder.apply_binds(result, pgs, pods) == 0
    assert binder.tries == ["a"] and set(binder.gave_up) == {"ns/a", "ns/b", "ns/c"}


def test_a_refusal_after_the_first_rolls_back_what_went_out_with_it() -> None:
    """b is refused for good while c and d, sent with it, were bound: the transaction is
    rolled back over every pod it bound (a, c and d are evicted), none is left half made."""
    pods, pgs, result = _setup(["a", "b", "c", "d"])
    binder = _Binder({"b": ApiException(status=403, reason="Forbidden")}, attempts=1,
                     gang_bind_workers=3)
    binder.apply_binds(result, pgs, pods)
    # c and d went out with b, or were still queued when b was refused (never sent)
    assert binder.bound[0] == "a" and set(binder.bound) <= {"a", "c", "d"}
    assert sorted(binder.core.evicted) == sorted(binder.bound)  # type: ignore[attr-defined]
    never_sent = {"c", "d"} - set(binder.tries)
    assert set(binder.gave_up) == {f"ns/{n}" for n in {"b"} | never_sent}
    assert not convert.bind_intent(pgs["g"])


def test_a_transient_fault_after_the_first_keeps_the_rest_in_the_intent() -> None:
    pods, pgs, result = _setup(["a", "b", "c"])
    binder = _Binder({"b": ConnectionResetError("reset by peer")}, gang_bind_workers=3)
    done = binder.apply_binds(result, pgs, pods)
    # c went out with b (bound) or was still queued when b failed (not sent, kept unbound)
    assert done == len(binder.bound) and binder.bound[0] == "a"
    assert unbound(pgs["g"]) == {"b", "c"} - set(binder.bound)
    assert "b" in unbound(pgs["g"]) and not binder.gave_up


def test_a_pod_sent_ahead_and_found_bound_already_counts_as_bound() -> None:
    """c's bind, sent with b's, answers 409 (an earlier try landed): bound, as in turn; b's
    refusal stops the gang, and the rollback evicts a and c both."""
    pods, pgs, result = _setup(["a", "b", "c"])
    binder = _Binder({"b": ApiException(status=403, reason="Forbidden"),
                      "c": ApiException(status=409, reason="Conflict")},
                     attempts=1, gang_bind_workers=2)
    binder.apply_binds(result, pgs, pods)
    sent_c = "c" in binder.tries  # else still queued when b was refused: never sent
    assert set(binder.gave_up) == ({"ns/b"} if sent_c else {"ns/b", "ns/c"})
    assert sorted(binder.core.evicted) == (["a", "c"] if sent_c else ["a"])  # type: ignore[attr-defined]
