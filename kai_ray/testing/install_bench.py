"""Image build times and sizes, and the time from `helm install` to a Ready scheduler, measured
the way BENCHMARKS.md ("Images and install") reports them:

    python3 -m kai_ray.testing.install_bench --out benchmarks/results/install.json [--cold]

--cold builds every image in an empty cache first (a fresh KAI_RAY_IMAGE_CACHE in a temporary
directory: mmdebstrap of the Debian base, wheel downloads, the compiled kai-ray wheel from a cold
cargo target), then measures a cache hit, and a rebuild of the scheduler image alone, as after an
edit of kai-ray's sources (its base image, wheels and cargo target cached). Without --cold the
cache in use is measured as it is. Then a plane with the real node (root) is started, the chart
installed by `helm install` (images loaded first), and the time to Ready pods recorded; then
`helm upgrade` (pods rolled, Ready again) and `helm uninstall`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kai_ray.testing import images

IMAGES = ("debian-python", "kai-ray", "kai-ray-reservation", "kai-ray-ray")


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure_images(cold: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in IMAGES:
        start = time.monotonic()
        image = images.ensure(name, log=_say)
        took = time.monotonic() - start
        out[name] = {"ref": image.ref, "size_mb": round(image.size / 1e6, 1),
                     "built_now": image.built,
                     # the build's own time (a cached archive keeps the time it took then)
                     "build_s": image.build_seconds, "ensure_s": round(took, 1)}
    for name in IMAGES:  # cache hits
        start = time.monotonic()
        images.ensure(name, log=_say)
        out[name]["cache_hit_s"] = round(time.monotonic() - start, 3)
    if cold:
        # the scheduler image again, as after a source edit: only its archive is gone
        path = images.ensure("kai-ray").path.parent
        shutil.rmtree(path)
        start = time.monotonic()
        rebuilt = images.ensure("kai-ray", log=_say)
        out["kai-ray"]["rebuild_after_edit_s"] = round(time.monotonic() - start, 1)
        if not rebuilt.built:
            raise RuntimeError("the scheduler image was not rebuilt after its archive was removed")
    return out


def measure_install() -> dict[str, Any]:
    from kai_ray.testing.install import ChartInstall
    from kai_ray.testing.plane import ControlPlane
    from kai_ray.testing.realnode import RealNode

    plane = ControlPlane(real_node=True, kube_scheduler=True)
    try:
        start = time.monotonic()
        plane.start()
        node = RealNode(plane, gpus=2).start()
        plane_s = round(time.monotonic() - start, 1)
        chart = ChartInstall(plane.kubeconfig, node, log=_say).install()
        chart.upgrade("--set", "logLevel=debug")
        start = time.monotonic()
        chart.uninstall()
        uninstall_s = round(time.monotonic() - start, 1)
        return {"plane_and_node_s": plane_s, **chart.timings, "uninstall_s": uninstall_s}
    finally:
        plane.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m kai_ray.testing.install_bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    parser.add_argument("--cold", action="store_true",
                        help="build every image in an empty cache first (10-15 min)")
    parser.add_argument("--skip-install", action="store_true",
                        help="images only (no real node needed)")
    args = parser.parse_args(argv)
    if not args.skip_install and os.geteuid() != 0:
        print("install_bench: the real node needs root (or --skip-install)", file=sys.stderr)
        return 2
    machine = {"cpus": os.cpu_count(), "python": platform.python_version(),
               "kernel": platform.release()}
    result: dict[str, Any] = {
        "machine": machine, "cold": args.cold,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    # the images' cache only: KAI_RAY_CACHE also holds the control plane's binaries, which a
    # cold image build must not lose
    images_root = tempfile.mkdtemp(prefix="kai-ray-cold-images-") if args.cold else None
    try:
        if images_root:
            os.environ["KAI_RAY_IMAGE_CACHE"] = images_root
        result["images"] = measure_images(args.cold)
        _write(args.out, result)  # kept if the install part fails
        if not args.skip_install:
            result["install"] = measure_install()
    finally:
        os.environ.pop("KAI_RAY_IMAGE_CACHE", None)
        if images_root:
            shutil.rmtree(images_root, ignore_errors=True)
    print(json.dumps(result, indent=1))
    _write(args.out, result)
    return 0


def _write(out: Path | None, result: dict[str, Any]) -> None:
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
