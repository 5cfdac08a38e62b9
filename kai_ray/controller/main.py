"""`kai-ray run`: the pod grouper, the scheduler loop and its status writers in one process,
out of cluster (a kubeconfig) or in cluster (the service account)."""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import sys
import threading
from typing import Any

from kai_ray.controller import logsetup, raywatch
from kai_ray.controller.health import Health, HealthConfig, HealthServer
from kai_ray.controller.leader import LeaderElector, LeaseConfig
from kai_ray.controller.metrics import SchedulerMetrics, start_metrics_server
from kai_ray.controller.podgrouper import PodGrouper
from kai_ray.controller.scheduler_loop import LoopConfig, SchedulerLoop
from kai_ray.grouping import GroupingConfig
from kai_ray.k8s import config_file
from kai_ray.k8s.cache import ClusterCache
from kai_ray.k8s.client import api_client
from kai_ray.k8s.ratelimit import RateLimitedApiClient, validate

log = logging.getLogger("kai_ray")


def load_config(path: str | None) -> LoopConfig:
    """The loop's configuration from the YAML file (see kai_ray.k8s.config_file)."""
    return _loop_config(config_file.load(path))


def _loop_config(file: config_file.ConfigFile) -> LoopConfig:
    core, period = file.scheduler()
    return LoopConfig(period_s=period, core=core, binder=file.binder())


def client_connection(args: argparse.Namespace,
                      file: config_file.ConfigFile | None = None) -> config_file.ClientConnection:
    """The client's rate limit: --kube-api-qps/--kube-api-burst when given, else the config
    file's clientConnection (`file`, else the file --config names), else kube-scheduler's
    defaults (50, 100). The values are checked together, the error naming where each came
    from: a flag can make the file's other value wrong (a limiting QPS with burst 0)."""
    if file is None:
        file = config_file.load(getattr(args, "config", None))
    conn = file.client_connection()
    qps = getattr(args, "kube_api_qps", None)
    burst = getattr(args, "kube_api_burst", None)
    key = f"clientConnection.{{}} in {file.path}" if file.path else "clientConnection.{}"
    try:
        checked = validate(conn.qps if qps is None else qps, conn.burst if burst is None else burst,
                           key.format("qps") if qps is None else "--kube-api-qps",
                           key.format("burst") if burst is None else "--kube-api-burst")
    except ValueError as e:
        raise SystemExit(f"kai-ray run: {e}") from None
    return config_file.ClientConnection(*checked)


def api_clients(args: argparse.Namespace, conn: config_file.ClientConnection | None = None,
                file: config_file.ConfigFile | None = None
                ) -> tuple[RateLimitedApiClient, RateLimitedApiClient]:
    """(client for everything, client for events), each with its own token bucket of the same
    QPS and burst, as kube-scheduler builds its clientset and its event clientset, and the
    config file's request timeouts. `conn`, `file`: the rate limit and the parsed --config
    when the caller has them already (else read from the flags and --config)."""
    if file is None:
        file = config_file.load(getattr(args, "config", None))
    if conn is None:
        conn = client_connection(args, file)
    timeout = file.api_timeouts()
    request = (timeout.connect_s, timeout.request_s)
    return (api_client(args.kubeconfig, qps=conn.qps, burst=conn.burst, timeout=request),
            api_client(args.kubeconfig, pool_size=8, qps=conn.qps, burst=conn.burst,
                       timeout=request))


def grouper_client(args: argparse.Namespace, conn: config_file.ClientConnection,
                   file: config_file.ConfigFile) -> RateLimitedApiClient:
    """The pod grouper's client, with a token bucket of its own of the same QPS and burst:
    KAI runs its pod grouper as a process of its own, with its own client limit, and grouping
    (PodGroup writes, owner reads) must not take the binds' tokens."""
    timeout = file.api_timeouts()
    return api_client(args.kubeconfig, qps=conn.qps, burst=conn.burst,
                      timeout=(timeout.connect_s, timeout.request_s))


def _health_config(file: config_file.ConfigFile) -> HealthConfig:
    h = file.health()
    return HealthConfig(max_cycle_age_s=h.max_cycle_age_s,
                        max_informer_silence_s=h.max_informer_silence_s)


def run_settings(args: argparse.Namespace
                 ) -> tuple[LoopConfig, config_file.ClientConnection, config_file.ConfigFile]:
    """The loop's configuration, the client's rate limit and the parsed file, from one read
    of --config (every section checked before anything starts)."""
    file = config_file.load(getattr(args, "config", None))
    file.health()
    return _loop_config(file), client_connection(args, file), file


def cmd_run(args: argparse.Namespace) -> int:
    logsetup.configure(getattr(args, "log_level", "info"))
    loop_config, conn, file = run_settings(args)
    timeouts = file.api_timeouts()
    api, events_api = api_clients(args, conn, file)
    # the loop's own client, of the same rate limit: /healthz reads when the API server last
    # answered the loop, which lease renewals, the grouper and the watches (on `api`) do not
    # (no urllib3 retries: each would resend a write with a whole timeout, past the lease the
    # write was fenced on; the loop tries again next cycle)
    # (a connection per binder worker too: they write gangs' intents and PodGroups on it)
    loop_api = api.sibling(retries=False, pool_size=loop_config.binder.workers + 8)
    # the Bindings on a bucket of their own: KAI's binder is a deployment of its own, with
    # its own client limit (docs/configuration.md); a connection per binder worker
    bind_api = loop_api.sibling(retries=False, own_bucket=True,
                                pool_size=loop_config.binder.workers
                                + loop_config.binder.gang_bind_workers + 8)
    metrics = SchedulerMetrics()
    cache = ClusterCache(api, watch_timeout=max(1, round(timeouts.watch_s)),
                         connect_timeout=timeouts.connect_s,
                         reservation_namespace=loop_config.binder.reservation_namespace)
    loop = SchedulerLoop(loop_api, cache, loop_config, grouper=None,  # no API call yet
                         on_cycle=lambda r: (metrics.record_cycle(r, r.action_seconds.get(
                             "cycle")), metrics.record_events(loop.events.stats())),
                         events_api=events_api, bind_api=bind_api)
    # checked as each request is sent (kai_ray.k8s.fencing)
    loop_api.fence = bind_api.fence = loop.fence
    worker: threading.Thread | None = None
    elector: LeaderElector | None = None
    extras: list[Any] = []
    health: Health | None = None
    if getattr(args, "health_port", 0):
        # up before the cache lists (a minute on a big cluster), so that the liveness probe
        # does not kill the pod meanwhile: /healthz is 200 while starting, /readyz 503
        health = Health(_health_config(file), loop, cache, lambda: worker,
                        threads=lambda: _workers(loop, elector),
                        watches=lambda: _watches(loop),
                        last_answer=lambda: max(loop_api.last_answer, bind_api.last_answer),
                        starting="waiting for the watch cache to sync")
        health_server = HealthServer(health, args.health_port,
                                     getattr(args, "health_addr", "127.0.0.1"))
        extras.append(health_server)
        log.info("health on %s/healthz and /readyz", health_server.url)
    log.info("listing the cluster into the watch cache%s", logsetup.age_note())
    # the first list is millions of acyclic JSON objects that live as long as the cache:
    # collecting while they arrive (each generation-2 pass walks all of them again) doubled
    # the sync's CPU (benchmarks/cache_parse.py), and frozen they are never walked again
    # (freed by refcount as events replace them)
    logsetup.GcPauses().install()
    gc.disable()
    try:
        cache.start()
    except (RuntimeError, TimeoutError) as e:
        print(f"kai-ray run: {e}", file=sys.stderr)
        for extra in extras:
            extra.stop()
        return 2
    finally:
        gc.freeze()
        gc.enable()
    # 16: a bare pod that waits costs the grouper two round trips (its PodGroup, its
    # annotation); one scheduled at once, one (its PodGroup, after the bind)
    grouper_api = grouper_client(args, conn, file)
    loop.grouper = PodGrouper(grouper_api, cache, loop.events, workers=16)
    stop = threading.Event()

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
        # imported only here: kopf takes a fifth of a second to import, a scheduler without
        # its webhook need not wait for it before it schedules
        from kai_ray.controller.webhook import WebhookConfig, start_webhook

        if health is not None:
            health.starting = "waiting for the admission webhook"
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
        is_leader = elector.is_leader
        loop.lease_left = elector.lease_left  # every write is fenced on it
        loop.leader_epoch = lambda: elector.transitions
    log.info("kai-ray scheduler running (cycle every %.1fs)%s", loop_config.period_s,
             logsetup.age_note())
    worker = threading.Thread(target=loop.run, args=(is_leader,), name="scheduler-loop",
                              daemon=True)
    worker.start()
    if health is not None:
        health.is_leader = is_leader
        health.started()  # from now on the loop's thread and cycles count
    code = 0
    while not stop.wait(0.5):
        if not worker.is_alive():
            log.error("scheduler loop stopped unexpectedly")
            code = 1
            break
    # the lease goes last, and only once the loop has stopped writing: released earlier, a
    # successor could bind while this replica's bind phase still runs (stopping fences each
    # write at once, so the wait is one in-flight request)
    loop.stop()
    worker.join(STOP_GRACE_S)
    if elector is not None:
        stopped = not worker.is_alive()
        if not stopped:
            log.warning("the scheduling loop did not stop within %.0fs; leaving the lease to "
                        "expire instead of releasing it", STOP_GRACE_S)
        elector.stop(release=stopped)
    for extra in reversed(extras):
        extra.stop()
    loop.events.flush(5.0)  # events still queued (they are written off the bind path)
    cache.stop()
    # the loop's client takes its tokens from `api`'s bucket: counted there
    for name, c in (("API", api), ("binds", bind_api), ("events", events_api),
                    ("pod grouper", grouper_api)):
        limiter = getattr(c, "limiter", None)
        if limiter is not None:
            log.info("%s client: %d requests, %.1fs waited for the rate limit", name,
                     limiter.taken, limiter.waited_s)
    return code


STOP_GRACE_S = 30.0  # for the loop to finish the write in flight at SIGTERM


def _watches(loop: SchedulerLoop) -> dict[str, dict[str, object]]:
    """The optional watches' states for /healthz and /readyz (the grouper starts its RayCluster
    watch on its first pass)."""
    watch = getattr(loop.grouper, "ray_watch", None)
    return {} if watch is None else {raywatch.RESOURCE: watch.state()}


def _workers(loop: SchedulerLoop, elector: LeaderElector | None) -> list[threading.Thread]:
    """The threads /healthz watches beside the loop's and the informers'."""
    threads = [t for t in (loop._grouping, elector._thread if elector else None) if t]
    threads.extend(getattr(loop.events, "_threads", ()))
    return threads


if __name__ == "__main__":  # pragma: no cover
    sys.exit(cmd_run(argparse.Namespace(kubeconfig=sys.argv[1] if len(sys.argv) > 1 else None)))
