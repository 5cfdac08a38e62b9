"""Gang latency while the scheduler runs, and time to first bind after a restart, on the real
local control plane with KWOK nodes, per scheduler (kai_ray/testing/peers.py; the same choices
as bind_throughput.py).

    python benchmarks/gang_latency.py --scheduler kai kai-scheduler --gangs 500 --rate 4
    python benchmarks/gang_latency.py --scheduler all --restart

Latency (default): a fresh plane with --nodes KWOK nodes; the scheduler starts, one bare warm-up
pod proves it binds; then --gangs RayCluster-shaped gangs (a PodGroup and --gang-size pods, made
the scheduler's way) are created at a steady --rate gangs per second, each by one client thread
(its group object, then its pods one by one). Per gang: the time from just before its group
object is created (its first pod, where the scheduler has no group object) until the last of its
pods is bound (from a watch). Reported: p50, p90, p99, max and mean over the gangs.

--restart: --single bare pods and --gangs gangs (bind_throughput.py's workload, 9,000 pods by
default) are created while no scheduler runs; then the scheduler's processes start. Reported: the
time from the start to the first pod bound, and to the first whole gang bound.

Every process of a scheduler gets --qps and burst 2*QPS, as in bind_throughput.py. JSON lines
on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from bind_throughput import (
    NS,
    BindWatch,
    add_common_args,
    check_alive,
    create_all,
    schedulers,
    start_plane,
    stop_run,
    workload,
)
from kubernetes import client

from kai_ray.testing.peers import make


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    s = sorted(values)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def _wait(event: threading.Event, timeout: float, what: str, check: Callable[[], None]) -> None:
    deadline = time.monotonic() + timeout
    while not event.wait(1.0):
        check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not after {timeout:.0f}s")


def latency(key: str, args: argparse.Namespace) -> dict:
    peer = make(key)
    plane, api = start_plane(args.nodes)
    core = client.CoreV1Api(api)
    try:
        peer.install(plane, NS)
        size = args.gang_size
        gangs = [f"gang-{g}" for g in range(args.gangs)]
        pods_of = {g: [f"{g}-{k}" for k in range(size)] for g in gangs}
        names = {"warmup"} | {p for ps in pods_of.values() for p in ps}
        created_at: dict[str, float] = {}
        created_wall: dict[str, float] = {}  # to find a slow gang in the scheduler's log
        with BindWatch(api, names) as watch:
            watch.informer.synced.wait(60)
            start = time.monotonic()
            peer.start(plane, args.qps, args.qps * 2)
            core.create_namespaced_pod(NS, peer.pod("warmup", None, 1, args.gpus_per_pod))

            def alive() -> None:
                check_alive(plane, peer)

            _wait(watch.first, 300, "the warm-up pod bound", alive)
            warmup = watch.bound_at["warmup"] - start
            print(f"  warm-up pod bound {warmup:.1f}s after the start", file=sys.stderr)

            def create_gang(g: str) -> None:
                _, pods = peer.gang(g, size, args.gpus_per_pod) if peer.gangs else \
                    (None, [peer.pod(p, None, 1, args.gpus_per_pod) for p in pods_of[g]])
                created_at[g] = time.monotonic()
                created_wall[g] = time.time()
                if peer.gangs:
                    peer.create_group(api, NS, g, size)
                for p in pods:
                    core.create_namespaced_pod(NS, p)

            t0 = time.monotonic()
            with ThreadPoolExecutor(args.client_threads) as pool:
                futures = []
                for i, g in enumerate(gangs):
                    delay = t0 + i / args.rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    futures.append(pool.submit(create_gang, g))
                    if i % 50 == 49:
                        alive()
                        print(f"  {i + 1} gangs submitted, {len(watch.bound_at)} pods bound",
                              file=sys.stderr)
                for f in futures:
                    f.result()
            offered = time.monotonic() - t0
            deadline = time.monotonic() + args.timeout
            while not watch.all_bound.wait(1.0) and time.monotonic() < deadline:
                if time.monotonic() - max(watch.bound_at.values()) > args.stall_timeout:
                    break  # it gave up on some pods: report the gangs that were bound
                alive()
                print(f"  {len(watch.bound_at)}/{len(names)} bound", file=sys.stderr)
        lat = {g: max(watch.bound_at[p] for p in ps) - created_at[g]
               for g, ps in pods_of.items() if all(p in watch.bound_at for p in ps)}
        values = list(lat.values())
        out = {"scheduler": key, "mode": "latency", "gangs": len(gangs), "gang_size": size,
               "gangs_bound": len(values), "rate_offered": args.rate,
               "rate_achieved": round(len(gangs) / offered, 2) if offered else None,
               "warmup_bind_s": round(warmup, 2), "qps": args.qps, "all_or_nothing": peer.gangs,
               "load_avg_1m_at_end": round(os.getloadavg()[0], 1)}
        if values:
            # in creation order: a latency that grows from the first gangs to the last means
            # the scheduler does not keep up with the offered rate
            ordered = [lat[g] for g in gangs if g in lat]
            tenth = max(1, len(ordered) // 10)
            out["mean_first_tenth_s"] = round(sum(ordered[:tenth]) / tenth, 3)
            out["mean_last_tenth_s"] = round(sum(ordered[-tenth:]) / tenth, 3)
            # where the tail is: at the start (warming up) or spread over the run
            slowest = sorted(lat, key=lat.__getitem__, reverse=True)[:5]
            out["slowest"] = {g: round(lat[g], 3) for g in slowest}
            out["slowest_created_utc"] = {
                g: time.strftime("%H:%M:%S", time.gmtime(created_wall[g]))
                + f".{int(created_wall[g] % 1 * 1000):03d}" for g in slowest}
            out.update({f"{name}_s": round(v, 3) for name, v in (
                ("p50", percentile(values, 50)), ("p90", percentile(values, 90)),
                ("p99", percentile(values, 99)), ("max", max(values)),
                ("mean", sum(values) / len(values)))})
        return out
    finally:
        stop_run(plane, peer, args)


def restart(key: str, args: argparse.Namespace) -> dict:
    peer = make(key)
    plane, api = start_plane(args.nodes)
    try:
        peer.install(plane, NS)
        groups, pods = workload(peer, args.single, args.gangs, args.gang_size, args.gpus_per_pod)
        created = create_all(api, peer, groups, pods)
        print(f"  {len(pods)} pods created in {created:.1f}s (no scheduler yet)",
              file=sys.stderr)
        # a gang's pods, also where the scheduler has no gangs (kube-scheduler: pods one by one)
        gang_pods = {f"gang-{g}": [f"gang-{g}-{k}" for k in range(args.gang_size)]
                     for g in range(args.gangs)}
        with BindWatch(api, {p["metadata"]["name"] for p in pods}) as watch:
            watch.informer.synced.wait(60)
            start = time.monotonic()
            peer.start(plane, args.qps, args.qps * 2)
            _wait(watch.first, args.timeout, "a first bind", lambda: check_alive(plane, peer))
            first = min(watch.bound_at.values()) - start
            first_pod = min(watch.bound_at, key=watch.bound_at.__getitem__)
            print(f"  first bind ({first_pod}) {first:.2f}s after the start", file=sys.stderr)
            first_gang = None
            deadline = time.monotonic() + args.timeout
            while gang_pods and first_gang is None and time.monotonic() < deadline:
                done = [max(watch.bound_at[p] for p in ps) for ps in gang_pods.values()
                        if all(p in watch.bound_at for p in ps)]
                if done:
                    first_gang = min(done) - start
                else:
                    check_alive(plane, peer)
                    time.sleep(0.2)
        return {"scheduler": key, "mode": "restart", "pending_pods": len(pods),
                "first_bind_s": round(first, 2), "first_bound_pod": first_pod,
                "first_gang_bound_s": round(first_gang, 2) if first_gang is not None else None,
                "qps": args.qps, "load_avg_1m": round(os.getloadavg()[0], 1)}
    finally:
        stop_run(plane, peer, args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser)
    parser.add_argument("--gangs", type=int, default=500)
    parser.add_argument("--rate", type=float, default=4.0,
                        help="gangs created per second (latency mode)")
    parser.add_argument("--client-threads", type=int, default=16,
                        help="gangs being created at once, at most (latency mode)")
    parser.add_argument("--restart", action="store_true",
                        help="time to first bind with bind_throughput's workload pending")
    parser.add_argument("--single", type=int, default=5000,
                        help="bare pods pending before the start (--restart)")
    args = parser.parse_args()
    for s in schedulers(args):
        print(f"== {s}", file=sys.stderr)
        print(json.dumps(restart(s, args) if args.restart else latency(s, args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
