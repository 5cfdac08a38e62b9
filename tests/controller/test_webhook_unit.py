"""The webhook's configuration manifests, certificate and settings checks (no cluster)."""

from __future__ import annotations

import asyncio
import ipaddress
import re

import kopf
import pytest
from cryptography import x509

from kai_ray.controller.leader import LeaseConfig
from kai_ray.controller.webhook import (
    MUTATE_ID,
    VALIDATE_ID,
    WebhookConfig,
    WebhookHandle,
    _NoMemories,
    _registry,
    self_signed_certificate,
    webhook_configurations,
)
from kai_ray.grouping.config import GroupingConfig


def test_configurations_match_only_our_scheduler_and_fail_closed() -> None:
    config = WebhookConfig(grouping=GroupingConfig(scheduler_name="my-sched"),
                           namespace_selector={"matchLabels": {"x": "y"}})
    validating, mutating = webhook_configurations(config, "https://127.0.0.1:8443", "Q0E=")
    for manifest, handler in ((validating, VALIDATE_ID), (mutating, MUTATE_ID)):
        (hook,) = manifest["webhooks"]
        assert hook["clientConfig"] == {"url": f"https://127.0.0.1:8443/{handler}",
                                        "caBundle": "Q0E="}
        assert hook["matchConditions"][0] == {
            "name": "scheduler-name",
            "expression": "has(object.spec.schedulerName) && "
                          "object.spec.schedulerName == 'my-sched'"}
        # validation: an UPDATE only when it changes annotations (all it checks on UPDATE)
        assert [c["name"] for c in hook["matchConditions"][1:]] == (
            ["annotations-changed"] if handler == VALIDATE_ID else [])
        assert hook["rules"][0]["resources"] == ["pods"]
        # validation sees UPDATEs too (forged scheduler annotations, edited fractions)
        assert hook["rules"][0]["operations"] == (
            ["CREATE", "UPDATE"] if handler == VALIDATE_ID else ["CREATE"])
        assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Fail", 5)
        assert hook["namespaceSelector"] == {"matchLabels": {"x": "y"}}
    assert validating["kind"] == "ValidatingWebhookConfiguration"
    assert mutating["kind"] == "MutatingWebhookConfiguration"


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"failure_policy": "Sometimes"}, "failure_policy"),
    ({"timeout_seconds": 31}, "timeout_seconds"),
    ({"grouping": GroupingConfig(scheduler_name="a'b")}, "scheduler_name"),
])
def test_bad_webhook_settings_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        WebhookConfig(**kwargs)  # type: ignore[arg-type]


def test_self_signed_certificate_covers_the_hostnames() -> None:
    cert_pem, key_pem = self_signed_certificate(["127.0.0.1", "localhost", "0.0.0.0"])
    cert = x509.load_pem_x509_certificate(cert_pem)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert b"PRIVATE KEY" in key_pem


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"lease_duration": 10, "renew_deadline": 10}, "lease_duration"),
    ({"renew_deadline": 2, "retry_period": 2}, "renew_deadline"),
])
def test_bad_lease_timings_are_rejected(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LeaseConfig(**kwargs)


def test_exempt_updaters_skip_the_webhook_only_for_their_updates() -> None:
    sa = "system:serviceaccount:kai-ray:kai-ray-scheduler"
    config = WebhookConfig(exempt_updaters=(sa,))
    validating, mutating = webhook_configurations(config, "https://127.0.0.1:8443", None)
    assert validating["webhooks"][0]["matchConditions"][2] == {
        "name": "not-an-exempt-update",
        "expression": f"request.operation != 'UPDATE' || "
                      f"!(request.userInfo.username in ['{sa}'])"}
    assert len(mutating["webhooks"][0]["matchConditions"]) == 1
    with pytest.raises(ValueError, match="exempt_updaters"):
        WebhookConfig(exempt_updaters=("x' || true || '",))


def _handle(**grouping: object) -> WebhookHandle:
    return WebhookHandle(None, WebhookConfig(  # type: ignore[arg-type]  # no API call is made
        grouping=GroupingConfig(**grouping)))  # type: ignore[arg-type]


def _our_pod(**annotations: str) -> dict[str, object]:
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": dict(annotations)},
            "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "main"}]}}


def test_handle_refuses_forged_scheduler_annotations_on_create_and_update() -> None:
    handle = _handle()
    with pytest.raises(kopf.AdmissionError, match=r"kai-ray\.io/bind-intent"):
        handle.validate(_our_pod(**{"kai-ray.io/bind-intent": "{}"}))
    old = _our_pod()
    last_start = "kai.scheduler/last-start-timestamp"
    with pytest.raises(kopf.AdmissionError, match=re.escape(last_start)):
        handle.validate(_our_pod(**{last_start: "2999-01-01T00:00:00Z"}), old)
    with pytest.raises(kopf.AdmissionError, match="gpu-fraction") as info:
        handle.validate(_our_pod(**{"gpu-fraction": "1.5"}), _our_pod(**{"gpu-fraction": "0.5"}))
    assert info.value.code == 400
    handle.validate(_our_pod(note="x"), old)  # an update of anything else passes
    assert handle.calls[VALIDATE_ID] == 4


def test_the_kopf_handler_passes_the_old_object_on_update_only() -> None:
    seen: list[tuple[dict[str, object], object]] = []

    class Handle:
        def validate(self, pod: dict[str, object], old: object = None) -> None:
            seen.append((pod, old))

    registry = _registry(Handle(), None)  # type: ignore[arg-type]
    (handler,) = [h for h in registry._webhooks.get_all_handlers() if h.id == VALIDATE_ID]
    assert set(handler.operations or ()) == {"CREATE", "UPDATE"}
    body, before = kopf.Body({"metadata": {"name": "new"}}), kopf.Body({"metadata": {"name": "o"}})
    handler.fn(body=body, old=None, operation="CREATE")
    handler.fn(body=body, old=before, operation="UPDATE")
    assert seen == [({"metadata": {"name": "new"}}, None),
                    ({"metadata": {"name": "new"}}, {"metadata": {"name": "o"}})]


def test_kopf_keeps_no_memory_per_admitted_pod() -> None:
    memories = _NoMemories()
    for uid in ("a", "b"):
        asyncio.run(memories.recall_memo({"metadata": {"uid": uid}}, ephemeral=False))
    assert list(memories.iter_all_memories()) == []
