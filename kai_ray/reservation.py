"""The GPU reservation pod's program: find the GPU this pod was given, report it on the pod.

kai-ray shares a GPU the way KAI does: one reservation pod per shared device asks the device
plugin for one whole `nvidia.com/gpu` and holds it; the pods sharing that device are pointed at
it through NVIDIA_VISIBLE_DEVICES. Only a process inside the reservation pod can learn which
physical GPU the device plugin picked, so this program reports it on its own pod, in KAI's
annotation `run.ai/reserve_for_gpu_index` (a GPU UUID, despite the name), then holds the device
until the pod is deleted.

Discovery: NVML when a driver library is present (the device the container sees), otherwise
the `NVIDIA_VISIBLE_DEVICES` the device plugin set (a UUID). A failure is written to the
container's termination message and the program exits 1: the scheduler reads the message from
the pod's status and tells the waiting pods.

Standard library only (plus `pynvml` from nvidia-ml-py where installed), so the image stays a
Python interpreter and this file.

    python3 -m kai_ray.reservation            report, then hold the device until SIGTERM
    python3 -m kai_ray.reservation --discover print the device id and exit
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

GPU_INDEX_ANNOTATION = "run.ai/reserve_for_gpu_index"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TERMINATION_LOG = Path("/dev/termination-log")
REQUEST_TIMEOUT_S = 10.0
REPORT_DEADLINE_S = 120.0


class ReservationError(RuntimeError):
    """The device cannot be found or reported; the message says why, for the pod's status."""


# ---------------------------------------------------------------------------- discovery
def _visible(value: str | None) -> list[str] | None:
    """NVIDIA_VISIBLE_DEVICES as a list; None for `all`, [] for unset/empty/`void`/`none`."""
    if value is None or value.strip().lower() in ("", "void", "none"):
        return []
    if value.strip().lower() == "all":
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def _is_uuid(device: str) -> bool:
    return device.startswith(("GPU-", "MIG-"))


def discover(visible_devices: str | None, nvml_uuids: list[str] | None) -> str:
    """The id of the one GPU this pod holds.

    `visible_devices` is NVIDIA_VISIBLE_DEVICES as set (None when unset); `nvml_uuids` the
    UUIDs NVML lists in this container, or None when no NVIDIA driver is present.
    """
    entries = _visible(visible_devices)
    shown = repr(visible_devices) if visible_devices is not None else "unset"
    if entries is not None and len(entries) > 1:
        raise ReservationError(
            f"{VISIBLE_DEVICES}={shown} names {len(entries)} devices; a reservation pod asks "
            "for exactly one nvidia.com/gpu")
    if entries and entries[0].startswith("MIG-"):
        return entries[0]  # NVML lists the parent GPU; the MIG instance is what was given
    if nvml_uuids is not None:
        if len(nvml_uuids) == 1:
            return nvml_uuids[0]  # the container sees exactly the device it was given
        entry = entries[0] if entries else None
        if entry is not None and entry in nvml_uuids:
            return entry
        if entry is not None and entry.isdigit() and int(entry) < len(nvml_uuids):
            return nvml_uuids[int(entry)]
        raise ReservationError(
            f"NVML lists {len(nvml_uuids)} GPUs and {VISIBLE_DEVICES} is {shown}: cannot tell "
            "which one the device plugin gave this pod")
    if entries is None:
        raise ReservationError(
            f"{VISIBLE_DEVICES} is {shown} and no NVIDIA driver library was found to tell "
            "which GPU this pod was given")
    if not entries:
        raise ReservationError(
            f"{VISIBLE_DEVICES} is {shown} and no NVIDIA driver library was found: this pod "
            "was given no GPU (does the node run a GPU device plugin?)")
    if not _is_uuid(entries[0]):
        raise ReservationError(
            f"{VISIBLE_DEVICES}={shown} is an index, not a GPU UUID, and no NVIDIA driver "
            "library was found to translate it")
    return entries[0]


def nvml_uuids() -> list[str] | None:
    """UUIDs of the GPUs NVML shows this process, or None without a driver (or pynvml)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        print(f"reservation: NVML unavailable ({e}); using {VISIBLE_DEVICES}", file=sys.stderr)
        return None
    try:
        uuids = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            uuids.append(uuid.decode() if isinstance(uuid, bytes) else str(uuid))
        return uuids
    except pynvml.NVMLError as e:  # a driver that answers init but not this: say so
        raise ReservationError(f"NVML could not list the GPUs: {e}") from None
    finally:
        pynvml.nvmlShutdown()


# ---------------------------------------------------------------------------- reporting
class InCluster:
    """The API server as a pod sees it: the `kubernetes` Service and the pod's ServiceAccount."""

    def __init__(self, env: Mapping[str, str], sa_dir: Path = SA_DIR) -> None:
        host = env.get("KUBERNETES_SERVICE_HOST")
        port = env.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise ReservationError("KUBERNETES_SERVICE_HOST is not set: not running in a pod")
        if ":" in host:
            host = f"[{host}]"
        self.base = f"https://{host}:{port}"
        self.sa_dir = sa_dir
        try:
            self.namespace_default = (sa_dir / "namespace").read_text().strip()
            self.context = ssl.create_default_context(cafile=str(sa_dir / "ca.crt"))
        except OSError as e:
            raise ReservationError(
                f"no ServiceAccount credentials in {sa_dir} ({e}): the reservation pod needs "
                "its token mounted (automountServiceAccountToken)") from None

    def patch_pod(self, namespace: str, name: str, body: dict[str, object]) -> None:
        # the token file is re-read on every call: the kubelet rotates it
        token = (self.sa_dir / "token").read_text().strip()
        req = urllib.request.Request(
            f"{self.base}/api/v1/namespaces/{namespace}/pods/{name}",
            data=json.dumps(body).encode(), method="PATCH",
            headers={"Authorization": f"Bearer {token}",
                     "Content-Type": "application/merge-patch+json",
                     "Accept": "application/json"})
        with urllib.request.urlopen(req, context=self.context, timeout=REQUEST_TIMEOUT_S):
            pass


def report(api: InCluster, namespace: str, name: str, device: str,
           deadline_s: float = REPORT_DEADLINE_S, stop: threading.Event | None = None) -> bool:
    """Annotate pod namespace/name with `device`, retrying transient failures until the
    deadline; an answer that retrying cannot change (401, 403, 404, 422) fails at once.
    False when `stop` was set first (the pod is being deleted: nothing left to report)."""
    stop = stop or threading.Event()
    body: dict[str, object] = {"metadata": {"annotations": {GPU_INDEX_ANNOTATION: device}}}
    deadline = time.monotonic() + deadline_s
    delay = 0.5
    while True:
        try:
            api.patch_pod(namespace, name, body)
            return True
        except urllib.error.HTTPError as e:
            if e.code in (401, 403, 404, 422) or time.monotonic() + delay > deadline:
                detail = e.read().decode("utf-8", "replace")[:300]
                raise ReservationError(
                    f"could not annotate pod {namespace}/{name} with {GPU_INDEX_ANNOTATION}: "
                    f"HTTP {e.code} {detail}") from None
            last: str = f"HTTP {e.code}"
        except OSError as e:  # refused, reset, timed out, TLS
            if time.monotonic() + delay > deadline:
                raise ReservationError(
                    f"could not reach the API server at {api.base} to annotate pod "
                    f"{namespace}/{name}: {e}") from None
            last = str(e)
        print(f"reservation: annotating {namespace}/{name} failed ({last}); retrying",
              file=sys.stderr)
        if stop.wait(delay):
            return False
        delay = min(delay * 2, 8.0)


def _fail(message: str, termination_log: Path) -> int:
    print(f"reservation: {message}", file=sys.stderr)
    # the kubelet copies this file into the pod's status, where the scheduler reads it
    with contextlib.suppress(OSError):
        termination_log.write_text(message[:4000])
    return 1


def main(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m kai_ray.reservation",
        description="Report the GPU this reservation pod holds on the pod itself "
                    f"(annotation {GPU_INDEX_ANNOTATION}), then hold it until SIGTERM.")
    parser.add_argument("--discover", action="store_true",
                        help="print the device id (NVML, else NVIDIA_VISIBLE_DEVICES) and exit")
    parser.add_argument("--once", action="store_true", help="exit after reporting")
    args = parser.parse_args(argv)
    env = os.environ if env is None else env
    # first: as PID 1 the default SIGTERM action does nothing, and deletion must end us at once
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        device = discover(env.get(VISIBLE_DEVICES), nvml_uuids())
        if args.discover:
            print(device)
            return 0
        api = InCluster(env, Path(env.get("KAI_RAY_SA_DIR", str(SA_DIR))))
        namespace = env.get("POD_NAMESPACE") or api.namespace_default
        name = env.get("POD_NAME") or env.get("HOSTNAME", "")
        if not name:
            raise ReservationError("neither POD_NAME nor HOSTNAME is set: cannot name this pod")
        if not report(api, namespace, name, device, stop=stop):
            return 0
    except ReservationError as e:
        return _fail(str(e), Path(env.get("KAI_RAY_TERMINATION_LOG", str(TERMINATION_LOG))))
    print(f"reservation: pod {namespace}/{name} holds GPU {device}", flush=True)
    if not args.once:
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
