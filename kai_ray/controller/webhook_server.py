"""`kai-ray webhook`: the admission webhook alone, as the chart's webhook Deployment runs it.

It serves the mounted TLS certificate on the given port and writes nothing to the cluster by
default: the Helm chart owns the webhook configurations (Service clientConfig, CA bundle), so the
webhook's ServiceAccount only reads Queues and namespaces.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from kai_ray.controller import logsetup
from kai_ray.controller.main import api_client
from kai_ray.controller.webhook import WebhookConfig, start_webhook
from kai_ray.grouping.config import GroupingConfig

log = logging.getLogger("kai_ray")


def webhook_config(args: argparse.Namespace) -> WebhookConfig:
    if bool(args.cert_file) != bool(args.key_file):
        raise SystemExit("kai-ray webhook: --cert-file and --key-file go together")
    service = None
    if args.service:
        parts = args.service.split("/")
        if len(parts) != 3 or not parts[2].isdigit():
            raise SystemExit(f"kai-ray webhook: --service {args.service!r}: expected "
                             "NAMESPACE/NAME/PORT")
        service = (parts[0], parts[1], int(parts[2]))
    grouping = GroupingConfig(scheduler_name=args.scheduler_name,
                              validate_queue=bool(args.validate_queue),
                              gpu_sharing_enabled=args.gpu_sharing == "on")
    return WebhookConfig(grouping=grouping, addr=args.addr, port=args.port,
                         certfile=args.cert_file, keyfile=args.key_file, service=service,
                         manage_configurations=bool(args.manage_configurations))


def cmd_webhook(args: argparse.Namespace) -> int:
    logsetup.configure(getattr(args, "log_level", "info"))
    config = webhook_config(args)
    api = api_client(args.kubeconfig, pool_size=8)
    hook = start_webhook(args.kubeconfig, config, api=api)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    hook.wait_ready(60)
    log.info("kai-ray webhook ready at %s", hook.url)
    code = 0
    while not stop.wait(0.5):
        if hook.error is not None or (hook._thread is not None and not hook._thread.is_alive()):
            log.error("admission webhook stopped: %s", hook.error)
            code = 1
            break
    hook.stop()
    return code
