"""`kai-ray dev-cluster up|down|env|status`: the test control plane, detached, for a user.

State lives in $KAI_RAY_DEV_CLUSTER_DIR (default ~/.kai-ray/dev-cluster): state.json (pids,
ports), the kubeconfig, PKI, etcd data, logs/, and bin/ (links to the built kubectl and helm).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

from kai_ray.testing import binaries

STATE_FILE = "state.json"


def state_dir() -> Path:
    env = os.environ.get("KAI_RAY_DEV_CLUSTER_DIR")
    return Path(env) if env else Path.home() / ".kai-ray" / "dev-cluster"


def _load_state(directory: Path) -> dict[str, Any] | None:
    path = directory / STATE_FILE
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _env_lines(directory: Path) -> list[str]:
    return [f"export KUBECONFIG={directory / 'kubeconfig'}",
            f'export PATH="{directory / "bin"}:$PATH"']


def _link_tools(directory: Path) -> None:
    """bin/ with just kubectl and helm, so `env` does not shadow anything else on PATH."""
    bin_path = directory / "bin"
    bin_path.mkdir(parents=True, exist_ok=True)
    for name, path in binaries.require("kubectl", "helm").items():
        link = bin_path / name
        link.unlink(missing_ok=True)
        link.symlink_to(path)


def _stop(directory: Path, state: dict[str, Any]) -> int:
    from kai_ray.testing.plane import ControlPlane

    plane = ControlPlane.from_state(state)
    running = [n for n, alive in plane.check_alive().items() if alive]
    plane.stop()
    left = [n for n, alive in ControlPlane.from_state(state).check_alive().items() if alive]
    if left:
        print(f"dev-cluster: still running after SIGKILL: {', '.join(left)}", file=sys.stderr)
        return 1
    shutil.rmtree(directory, ignore_errors=True)
    print(f"dev-cluster: stopped {len(running)} processes"
          f"{' (' + ', '.join(running) + ')' if running else ''}; removed {directory}")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from kai_ray.testing.kuberay import start_kuberay_operator
    from kai_ray.testing.plane import ControlPlane, save_state

    real_node = bool(getattr(args, "real_node", False))
    real_node_gpus = getattr(args, "real_node_gpus", 2)
    install = bool(getattr(args, "install", False))
    if install and not real_node:
        print("dev-cluster up: --install needs --real-node (the chart's pods need a node that "
              "runs containers; KWOK nodes only pretend to)", file=sys.stderr)
        return 2
    if args.nodes < 0 or args.gpus_per_node < 0 or real_node_gpus < 0:
        print("dev-cluster up: --nodes, --gpus-per-node and --real-node-gpus must be >= 0",
              file=sys.stderr)
        return 2
    directory = state_dir()
    state = _load_state(directory)
    if state is not None:
        alive = ControlPlane.from_state(state).check_alive()
        if alive and all(alive.values()):
            print(f"dev-cluster: already running ({directory}); `kai-ray dev-cluster down` "
                  "first to change its shape")
            print("\n".join(_env_lines(directory)))
            return 0
        print("dev-cluster: cleaning up a previous cluster that is partly down")
        _stop(directory, state)
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)

    t0 = time.monotonic()
    # with a real node, kube-scheduler places the pods that are not ours (the chart's own)
    plane = ControlPlane(directory, detached=True, real_node=real_node,
                         kube_scheduler=real_node)
    try:
        _link_tools(directory)
        plane.start()
        nodes = plane.add_gpu_nodes(args.nodes, args.gpus_per_node) if args.nodes else []
        if real_node:
            from kai_ray.testing.realnode import RealNode

            node = RealNode(plane, gpus=real_node_gpus).start()
            _load_images(node)
        if args.kuberay:
            start_kuberay_operator(plane)
        if install:
            from kai_ray.testing.install import ChartInstall

            chart = ChartInstall(plane.kubeconfig, node).install()
    except BaseException as e:
        plane.stop()
        print(f"dev-cluster up failed: {e}\n(logs kept in {plane.logs_dir})", file=sys.stderr)
        return 1
    real = ({"name": socket.gethostname().lower(), "gpus": real_node_gpus,
             "ready_seconds": round(plane.timings.get("node_ready", 0.0), 1)}
            if real_node else None)
    save_state(plane, directory / STATE_FILE, nodes=nodes, gpus_per_node=args.gpus_per_node,
               kuberay=bool(args.kuberay), real_node_info=real)
    parts = ", ".join(plane.components)
    print(f"dev-cluster: up in {time.monotonic() - t0:.1f} s: {parts}; "
          f"{len(nodes)} KWOK nodes x {args.gpus_per_node} nvidia.com/gpu; API {plane.api_url}")
    if real:
        print(f"dev-cluster: real node {real['name']} Ready in {real['ready_seconds']} s with "
              f"{real_node_gpus} fake nvidia.com/gpu (kubelet, containerd; docs/real-node.md)")
    if install:
        print(f"dev-cluster: kai-ray installed by helm (release {chart.release}, namespace "
              f"{chart.namespace}): scheduler and webhook Ready {chart.timings['ready_s']} s "
              "after `helm install`; `kubectl -n kai-ray logs deploy/kai-ray-scheduler`")
    print("# use it from this shell with:  eval \"$(kai-ray dev-cluster env)\"")
    print("\n".join(_env_lines(directory)))
    return 0


def _load_images(node: Any) -> None:
    """busybox for small pods, and kai-ray's reservation image also under the name the
    scheduler asks for by default, so `kai-ray run` shares GPUs on the real node as it is
    (images are built on first use, then cached: docs/images.md)."""
    from kai_ray.k8s.binder import RESERVATION_IMAGE
    from kai_ray.testing import images

    for name in ("busybox", "kai-ray-reservation"):
        node.import_image(images.ensure(name))
    node.tag_image(images.ensure("kai-ray-reservation").ref, RESERVATION_IMAGE)
    print(f"dev-cluster: images on the real node: {images.ensure('busybox').ref}, "
          f"{RESERVATION_IMAGE} (pods: imagePullPolicy Never or IfNotPresent)")


def cmd_down(args: argparse.Namespace) -> int:
    directory = state_dir()
    state = _load_state(directory)
    if state is None:
        print(f"dev-cluster: nothing running (no {directory / STATE_FILE})")
        return 0
    return _stop(directory, state)


def cmd_env(args: argparse.Namespace) -> int:
    directory = state_dir()
    if _load_state(directory) is None:
        print("dev-cluster: not running; start it with `kai-ray dev-cluster up`", file=sys.stderr)
        return 1
    print("\n".join(_env_lines(directory)))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from kai_ray.testing.plane import ControlPlane

    directory = state_dir()
    state = _load_state(directory)
    if state is None:
        print("dev-cluster: not running")
        return 1
    alive = ControlPlane.from_state(state).check_alive()
    print(f"dev-cluster at {directory}, API {state['api_url']}")
    for name, ok in alive.items():
        pid = state["components"][name]["pid"]
        print(f"  {name:<25} pid {pid:<8} {'running' if ok else 'NOT RUNNING'}")
    print(f"  nodes: {len(state.get('nodes', []))} x {state.get('gpus_per_node')} nvidia.com/gpu")
    real = state.get("real_node_info")
    if real:
        print(f"  real node: {real['name']} (kubelet), {real['gpus']} fake nvidia.com/gpu")
    return 0 if all(alive.values()) else 1


_ACTIONS = {"up": cmd_up, "down": cmd_down, "env": cmd_env, "status": cmd_status}


def cmd_dev_cluster(args: argparse.Namespace) -> int:
    try:
        return _ACTIONS[args.action](args)
    except binaries.BinariesMissing as e:
        print(f"dev-cluster: {e}", file=sys.stderr)
        return 1
