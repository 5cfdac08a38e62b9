"""The scheduler's YAML configuration file (the chart's ConfigMap, `kai-ray run --config`).

Keys: cyclePeriodSeconds, placement {gpu, cpu: binpack|spread}, gpuPacking, stalenessGracePeriod-
Seconds, actions, maxConsolidationPreemptees. Unknown keys and bad values stop with a message
naming the file and the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kai_ray.core.model import NodePlacement, SchedulerConfig
from kai_ray.core.packing import POLICIES

KEYS = {"cyclePeriodSeconds", "placement", "stalenessGracePeriodSeconds", "actions",
        "maxConsolidationPreemptees", "gpuPacking"}
DEFAULT_PERIOD_S = 1.0


def read(path: str | None) -> tuple[SchedulerConfig, float]:
    """(core configuration, cycle period in seconds); defaults when `path` is empty."""
    if not path:
        return SchedulerConfig(), DEFAULT_PERIOD_S
    raw: Any = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(raw, dict):
        raise SystemExit(f"{path}: expected a mapping")
    unknown = set(raw) - KEYS
    if unknown:
        raise SystemExit(f"{path}: unknown key(s) {sorted(unknown)}; known: {sorted(KEYS)}")
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
