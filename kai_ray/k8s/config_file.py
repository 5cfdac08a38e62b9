"""The scheduler's YAML configuration file (the chart's ConfigMap, `kai-ray run --config`).

Keys: cyclePeriodSeconds, placement {gpu, cpu: binpack|spread}, gpuPacking, stalenessGracePeriod-
Seconds, actions, maxConsolidationPreemptees, clientConnection {qps, burst} (kube-scheduler's
KubeSchedulerConfiguration keys for the API client's rate limit). Unknown keys and bad values stop
with a message naming the file and the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kai_ray.core.model import NodePlacement, SchedulerConfig
from kai_ray.core.packing import POLICIES
from kai_ray.k8s.ratelimit import DEFAULT_BURST, DEFAULT_QPS

KEYS = {"cyclePeriodSeconds", "placement", "stalenessGracePeriodSeconds", "actions",
        "maxConsolidationPreemptees", "gpuPacking", "clientConnection"}
DEFAULT_PERIOD_S = 1.0


@dataclass(frozen=True)
class ClientConnection:
    """Token bucket of the API client: `qps` requests per second, bursts of `burst`; a negative
    `qps` means no limit (as in client-go)."""

    qps: float = DEFAULT_QPS
    burst: int = DEFAULT_BURST


def _load(path: str) -> dict[str, Any]:
    raw: Any = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(raw, dict):
        raise SystemExit(f"{path}: expected a mapping")
    unknown = set(raw) - KEYS
    if unknown:
        raise SystemExit(f"{path}: unknown key(s) {sorted(unknown)}; known: {sorted(KEYS)}")
    return raw


def client_connection(path: str | None) -> ClientConnection:
    """clientConnection {qps, burst}; kube-scheduler's defaults (50, 100) when absent."""
    raw = _load(path) if path else {}
    conn = raw.get("clientConnection") or {}
    if not isinstance(conn, dict):
        raise SystemExit(f"{path}: clientConnection: expected a mapping with qps and burst")
    unknown = set(conn) - {"qps", "burst"}
    if unknown:
        raise SystemExit(f"{path}: clientConnection: unknown key(s) {sorted(unknown)}; "
                         "known: ['burst', 'qps']")
    qps, burst = conn.get("qps", DEFAULT_QPS), conn.get("burst", DEFAULT_BURST)
    if isinstance(qps, bool) or not isinstance(qps, int | float) or qps == 0:
        raise SystemExit(f"{path}: clientConnection.qps: expected a positive number "
                         f"(or -1 for no limit), got {qps!r}")
    if isinstance(burst, bool) or not isinstance(burst, int) or (qps > 0 and burst < 1):
        raise SystemExit(f"{path}: clientConnection.burst: expected an integer >= 1, "
                         f"got {burst!r}")
    return ClientConnection(float(qps), burst)


def read(path: str | None) -> tuple[SchedulerConfig, float]:
    """(core configuration, cycle period in seconds); defaults when `path` is empty."""
    if not path:
        return SchedulerConfig(), DEFAULT_PERIOD_S
    raw = _load(path)
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
