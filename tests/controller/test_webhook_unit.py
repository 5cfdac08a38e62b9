"""The webhook's configuration manifests, certificate and settings checks (no cluster)."""

from __future__ import annotations

import ipaddress

import pytest
from cryptography import x509

from kai_ray.controller.leader import LeaseConfig
from kai_ray.controller.webhook import (
    MUTATE_ID,
    VALIDATE_ID,
    WebhookConfig,
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
        assert hook["matchConditions"] == [{
            "name": "scheduler-name",
            "expression": "has(object.spec.schedulerName) && "
                          "object.spec.schedulerName == 'my-sched'"}]
        assert hook["rules"][0]["resources"] == ["pods"]
        assert hook["rules"][0]["operations"] == ["CREATE"]
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
