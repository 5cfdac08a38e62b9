"""The scheduler's YAML configuration file (the chart's ConfigMap, `kai-ray run --config`).

Keys: cyclePeriodSeconds, placement {gpu, cpu: binpack|spread}, gpuPacking, stalenessGracePeriod-
Seconds, actions, maxConsolidationPreemptees, clientConnection {qps, burst} (kube-scheduler's
KubeSchedulerConfiguration keys for the API client's rate limit), reservation {image,
serviceAccountName, timeoutSeconds} (the GPU reservation pods). Unknown keys and bad values stop
with a message naming the file and the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kai_ray.core.model import NodePlacement, SchedulerConfig
from kai_ray.core.packing import POLICIES
from kai_ray.k8s.binder import BinderConfig
from kai_ray.k8s.ratelimit import DEFAULT_BURST, DEFAULT_QPS, validate

KEYS = {"cyclePeriodSeconds", "placement", "stalenessGracePeriodSeconds", "actions",
        "maxConsolidationPreemptees", "gpuPacking", "clientConnection", "reservation"}
RESERVATION_KEYS = {"image", "serviceAccountName", "timeoutSeconds"}
DEFAULT_PERIOD_S = 1.0


@dataclass(frozen=True)
class ClientConnection:
    """Token bucket of the API client: `qps` requests per second, bursts of `burst`; a negative
    `qps` means no limit (as in client-go)."""

    qps: float = DEFAULT_QPS
    burst: int = DEFAULT_BURST


@dataclass(frozen=True)
class ConfigFile:
    """The file parsed once (top-level keys checked); each section is checked when read, so a
    tool that needs only the scheduler's keys is not stopped by a bad clientConnection."""

    path: str | None
    raw: dict[str, Any]

    def scheduler(self) -> tuple[SchedulerConfig, float]:
        """(core configuration, cycle period in seconds); defaults when there is no file."""
        return _scheduler(self.raw, self.path)

    def client_connection(self) -> ClientConnection:
        """clientConnection {qps, burst}; kube-scheduler's defaults (50, 100) when absent."""
        return _client_connection(self.raw, self.path)

    def binder(self) -> BinderConfig:
        """reservation {image, serviceAccountName, timeoutSeconds}; defaults when absent."""
        return _binder(self.raw, self.path)


def load(path: str | None) -> ConfigFile:
    """Read and parse `path` (no file: every default)."""
    if not path:
        return ConfigFile(None, {})
    raw: Any = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(raw, dict):
        raise SystemExit(f"{path}: expected a mapping")
    unknown = set(raw) - KEYS
    if unknown:
        raise SystemExit(f"{path}: unknown key(s) {sorted(unknown)}; known: {sorted(KEYS)}")
    return ConfigFile(path, raw)


def client_connection(path: str | None) -> ClientConnection:
    """clientConnection of the file at `path` (see ConfigFile.client_connection)."""
    return load(path).client_connection()


def read(path: str | None) -> tuple[SchedulerConfig, float]:
    """The scheduler's keys of the file at `path` (see ConfigFile.scheduler)."""
    return load(path).scheduler()


def _client_connection(raw: dict[str, Any], path: str | None) -> ClientConnection:
    conn = raw.get("clientConnection") or {}
    if not isinstance(conn, dict):
        raise SystemExit(f"{path}: clientConnection: expected a mapping with qps and burst")
    unknown = set(conn) - {"qps", "burst"}
    if unknown:
        raise SystemExit(f"{path}: clientConnection: unknown key(s) {sorted(unknown)}; "
                         "known: ['burst', 'qps']")
    try:
        qps, burst = validate(conn.get("qps", DEFAULT_QPS), conn.get("burst", DEFAULT_BURST),
                              "clientConnection.qps", "clientConnection.burst")
    except ValueError as e:
        raise SystemExit(f"{path}: {e}") from None
    return ClientConnection(qps, burst)


def _scheduler(raw: dict[str, Any], path: str | None) -> tuple[SchedulerConfig, float]:
    if not raw:
        return SchedulerConfig(), DEFAULT_PERIOD_S
    placement = raw.get("placement") or {}
    for key, value in placement.items():
        if key not in ("gpu", "cpu") or value not in ("binpack", "spread"):
            raise SystemExit(f"{path}: placement.{key}: expected binpack|spread, got {value!r}")
    packing = raw.get("gpuPacking", "kai")
    if packing not in POLICIES:
        raise SystemExit(f"{path}: gpuPacking: expected one of {list(POLICIES)}, got {packing!r}")
    default = SchedulerConfig()
    core = SchedulerConfig(
        gpu_packing=packing,
        placement=NodePlacement(gpu=placement.get("gpu", "binpack"),
                                cpu=placement.get("cpu", "binpack")),
        staleness_grace_period_s=float(raw.get("stalenessGracePeriodSeconds",
                                               default.staleness_grace_period_s)),
        max_consolidation_preemptees=int(raw.get("maxConsolidationPreemptees",
                                                 default.max_consolidation_preemptees)),
        actions=tuple(raw.get("actions") or default.actions))
    return core, float(raw.get("cyclePeriodSeconds", DEFAULT_PERIOD_S))


def _binder(raw: dict[str, Any], path: str | None) -> BinderConfig:
    section = raw.get("reservation") or {}
    if not isinstance(section, dict):
        raise SystemExit(f"{path}: reservation: expected a mapping with "
                         f"{sorted(RESERVATION_KEYS)}")
    unknown = set(section) - RESERVATION_KEYS
    if unknown:
        raise SystemExit(f"{path}: reservation: unknown key(s) {sorted(unknown)}; "
                         f"known: {sorted(RESERVATION_KEYS)}")
    default = BinderConfig()
    texts = {}
    for key, fallback in (("image", default.reservation_image),
                          ("serviceAccountName", default.reservation_service_account)):
        value = section.get(key, fallback)
        if not isinstance(value, str) or not value.strip():
            raise SystemExit(f"{path}: reservation.{key}: expected a non-empty string, "
                             f"got {value!r}")
        texts[key] = value.strip()
    timeout = section.get("timeoutSeconds", default.reservation_timeout_s)
    # bool is an int in Python; NaN and infinities fail the comparison or the bound
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) \
            or not 0 < timeout < 86_400:
        raise SystemExit(f"{path}: reservation.timeoutSeconds: expected a number of seconds "
                         f"above 0 and below 86400, got {timeout!r}")
    return BinderConfig(reservation_timeout_s=float(timeout),
                        reservation_image=texts["image"],
                        reservation_service_account=texts["serviceAccountName"])
