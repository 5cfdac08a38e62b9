"""`kai-ray webhook` settings and the Service-based webhook configurations."""

from __future__ import annotations

import pytest

from kai_ray.cli import build_parser
from kai_ray.controller.webhook import WebhookConfig, webhook_configurations
from kai_ray.controller.webhook_server import webhook_config


def test_service_client_config_replaces_the_url() -> None:
    config = WebhookConfig(service=("kai-ray", "kai-ray-webhook", 443))
    validating, mutating = webhook_configurations(config, "https://ignored:1", "Q0E=")
    for doc, path in ((validating, "/validate-pod"), (mutating, "/mutate-pod")):
        client_config = doc["webhooks"][0]["clientConfig"]
        assert "url" not in client_config
        assert client_config["service"] == {"namespace": "kai-ray", "name": "kai-ray-webhook",
                                            "path": path, "port": 443}
        assert client_config["caBundle"] == "Q0E="


def test_cli_flags_reach_the_webhook_config() -> None:
    args = build_parser().parse_args([
        "webhook", "--addr", "0.0.0.0", "--port", "9443", "--cert-file", "/c/tls.crt",
        "--key-file", "/c/tls.key", "--gpu-sharing", "off", "--validate-queue",
        "--scheduler-name", "my-sched", "--service", "ns/svc/443"])
    config = webhook_config(args)
    assert (config.addr, config.port, config.certfile, config.keyfile) == \
        ("0.0.0.0", 9443, "/c/tls.crt", "/c/tls.key")
    assert config.grouping.gpu_sharing_enabled is False
    assert config.grouping.validate_queue is True
    assert config.grouping.scheduler_name == "my-sched"
    assert config.service == ("ns", "svc", 443)
    assert config.manage_configurations is False  # the chart owns the configurations


@pytest.mark.parametrize("argv,message", [
    (["--cert-file", "/c/tls.crt"], "--cert-file and --key-file go together"),
    (["--service", "ns/svc"], "expected NAMESPACE/NAME/PORT"),
])
def test_bad_flags_say_which(argv: list[str], message: str) -> None:
    args = build_parser().parse_args(["webhook", *argv])
    with pytest.raises(SystemExit, match=message):
        webhook_config(args)
