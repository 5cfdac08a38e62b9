"""`kai-ray run`: the pod grouper, the scheduler loop and its status writers in one process,
out of cluster (a kubeconfig) or in cluster (the service account)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from kai_ray.controller.leader import LeaderElector, LeaseConfig
from kai_ray.controller.metrics import SchedulerMetrics, start_metrics_server
from kai_ray.controller.podgrouper import PodGrouper
from kai_ray.controller.scheduler_loop import LoopConfig, SchedulerLoop
from kai_ray.controller.webhook import WebhookConfig, start_webhook
from kai_ray.core.model import NodePlacement, SchedulerConfig
from kai_ray.core.packing import POLICIES
from kai_ray.grouping import GroupingConfig
from kai_ray.k8s.cache import ClusterCache

log = logging.getLogger("kai_ray")


def api_client(kubeconfig: str | None, pool_size: int = 32) -> client.ApiClient:
    """A client whose connection pool fits the binder's concurrent writes."""
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            config.load_kube_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


def load_config(path: str | None) -> LoopConfig:
    """YAML: {cyclePeriodSeconds, placement: {gpu, cpu}, gpuPacking, stalenessGracePeriodSeconds,
    actions: [...], maxConsolidationPreemptees}. Unknown keys are an error."""
    cfg = LoopConfig()
    if not path:
        return cfg
    raw: dict[str, Any] = yaml.safe_load(Path(path).read_text()) or {}
    known = {"cyclePeriodSeconds", "placement", "stalenessGracePeriodSeconds", "actions",
             "maxConsolidationPreemptees", "gpuPacking"}
    unknown = set(raw) - known
    if unknown:
        raise SystemExit(f"kai-ray run: {path}: unknown key(s) {sorted(unknown)}; "
                         f"known: {sorted(known)}")
    placement = raw.get("placement") or {}
    for key, value in placement.items():
        if key not in ("gpu", "cpu") or value not in ("binpack", "spread"):
            raise SystemExit(f"kai-ray run: {path}: placement.{key}: expected binpack|spread, "
                             f"got {value!r}")
    packing_policy = raw.get("gpuPacking", "kai")
    if packing_policy not in POLICIES:
        raise SystemExit(f"kai-ray run: {path}: gpuPacking: expected one of {list(POLICIES)}, "
                         f"got {packing_policy!r}")
    core = SchedulerConfig(
        gpu_packing=packing_policy,
        placement=NodePlacement(gpu=placement.get("gpu", "binpack"),
                                cpu=placement.get("cpu", "binpack")),
        staleness_grace_period_s=float(raw.get("stalenessGracePeriodSeconds", 60)),
        max_consolidation_preemptees=int(raw.get("maxConsolidationPreemptees", 16)),
        actions=tuple(raw.get("actions") or SchedulerConfig().actions))
    cfg.core = core
    cfg.period_s = float(raw.get("cyclePeriodSeconds", 1.0))
    return cfg


def cmd_run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    api = api_client(args.kubeconfig)
    loop_config = load_config(getattr(args, "config", None))
    metrics = SchedulerMetrics()
    cache = ClusterCache(api)
    try:
        cache.start()
    except (RuntimeError, TimeoutError) as e:
        print(f"kai-ray run: {e}", file=sys.stderr)
        return 2
    loop = SchedulerLoop(api, cache, loop_config, grouper=None,
                         on_cycle=lambda r: metrics.record_cycle(r, r.action_seconds.get("cycle")))
    loop.grouper = PodGrouper(api, cache, loop.events)
    stop = threading.Event()
    extras: list[Any] = []

    def _stop(*_: object) -> None:
        stop.set()
        loop.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    if getattr(args, "metrics_port", 0):
        server = start_metrics_server(args.metrics_port, args.metrics_addr, metrics)
        extras.append(server)
        log.info("metrics on %s", server.url)
    if getattr(args, "webhook", False):
        grouping = GroupingConfig(validate_queue=bool(args.validate_queue))
        hook = start_webhook(args.kubeconfig, WebhookConfig(grouping=grouping,
                                                            port=args.webhook_port), api=api)
        hook.wait_ready()
        extras.append(hook)
        log.info("admission webhook on %s", hook.url)
    is_leader = None
    if getattr(args, "leader_election", "off") == "on":
        elector = LeaderElector(api, LeaseConfig(name=args.lease_name,
                                                 namespace=args.lease_namespace))
        elector.start(lambda: log.info("became leader (%s)", elector.identity),
                      lambda: log.info("lost leadership"))
        extras.append(elector)
        is_leader = elector.is_leader
    log.info("kai-ray scheduler running (cycle every %.1fs)", loop_config.period_s)
    worker = threading.Thread(target=loop.run, args=(is_leader,), name="scheduler-loop",
                              daemon=True)
    worker.start()
    code = 0
    while not stop.wait(0.5):
        if not worker.is_alive():
            log.error("scheduler loop stopped unexpectedly")
            code = 1
            break
    for extra in reversed(extras):
        extra.stop()
    cache.stop()
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(cmd_run(argparse.Namespace(kubeconfig=sys.argv[1] if len(sys.argv) > 1 else None)))
