"""Where the control-plane binaries and KubeRay's CRDs/samples are.

`tools/cluster/build.sh` builds the binaries from Go modules into a version-keyed cache and
reports the directory; `KAI_RAY_BIN_DIR` / `KAI_RAY_KUBERAY_DIR` point at existing ones instead.
The real node's binaries (kubelet, ...) live in a directory of their own (`build.sh
--print-node-dir`, or `KAI_RAY_NODE_BIN_DIR`).
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kwok")
ALL_BINARIES = (
    *CONTROL_PLANE, "kube-scheduler", "kubectl", "ray-operator", "helm",
)
#: the real kubelet node's (kai_ray/testing/realnode.py)
NODE_BINARIES = ("kubelet", "kube-proxy", "gpu-device-plugin", "coredns", "crictl")


class BinariesMissing(RuntimeError):
    """The control-plane binaries are not built (and KAI_RAY_BIN_DIR does not name them)."""


def repo_root() -> Path | None:
    """The source checkout this package runs from, if it is one (it holds tools/cluster)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "tools" / "cluster" / "build.sh").is_file() else None


def build_script() -> Path | None:
    root = repo_root()
    return root / "tools" / "cluster" / "build.sh" if root else None


def _ask_build_script(flag: str) -> Path:
    script = build_script()
    if script is None:
        raise BinariesMissing(
            "no tools/cluster/build.sh next to this package: set KAI_RAY_BIN_DIR to a directory "
            f"holding {', '.join(ALL_BINARIES)} (and KAI_RAY_KUBERAY_DIR to KubeRay's assets)"
        )
    out = subprocess.run(
        [str(script), flag], capture_output=True, text=True, check=False, timeout=600
    )
    if out.returncode != 0:
        raise BinariesMissing(f"{script} {flag} failed: {out.stderr.strip()}")
    return Path(out.stdout.strip().splitlines()[-1])


@functools.cache
def bin_dir() -> Path:
    """The directory holding the binaries (not checked: see `require`)."""
    env = os.environ.get("KAI_RAY_BIN_DIR")
    return Path(env) if env else _ask_build_script("--print-dir")


@functools.cache
def node_bin_dir() -> Path:
    """The directory holding the real node's binaries (not checked: see `require_node`)."""
    env = os.environ.get("KAI_RAY_NODE_BIN_DIR")
    return Path(env) if env else _ask_build_script("--print-node-dir")


@functools.cache
def kuberay_dir() -> Path:
    """KubeRay's assets: `crd/` (config/crd/bases) and `samples/` (config/samples)."""
    env = os.environ.get("KAI_RAY_KUBERAY_DIR")
    return Path(env) if env else _ask_build_script("--print-kuberay-dir")


def require(*names: str) -> dict[str, Path]:
    """Paths of the named binaries; raises with the build command when any is missing."""
    return _require(bin_dir(), names, "KAI_RAY_BIN_DIR")


def require_node(*names: str) -> dict[str, Path]:
    """Paths of the named real-node binaries (all of them by default)."""
    return _require(node_bin_dir(), names or NODE_BINARIES, "KAI_RAY_NODE_BIN_DIR")


def _require(directory: Path, names: tuple[str, ...], env: str) -> dict[str, Path]:
    paths = {name: directory / name for name in names}
    missing = [n for n, p in paths.items() if not os.access(p, os.X_OK)]
    if missing:
        raise BinariesMissing(
            f"missing in {directory}: {', '.join(missing)}; build them with "
            f"tools/cluster/build.sh (or set {env})"
        )
    return paths


def kuberay_sample(name: str) -> Path:
    """A file from KubeRay's config/samples, e.g. 'ray-cluster.kai-scheduler.yaml'."""
    path = kuberay_dir() / "samples" / name
    if not path.is_file():
        raise BinariesMissing(f"KubeRay sample {name} not found under {kuberay_dir()}")
    return path


def kuberay_crds() -> list[Path]:
    """KubeRay's CRD files (RayCluster, RayJob, RayService, RayCronJob)."""
    files = sorted((kuberay_dir() / "crd").glob("*.yaml"))
    if not files:
        raise BinariesMissing(f"no KubeRay CRDs under {kuberay_dir() / 'crd'}")
    return files
