"""Logging of the long-running processes (`kai-ray run`, `kai-ray webhook`): one format, and the
level from `--log-level` (the chart's `logLevel` value)."""

from __future__ import annotations

import gc
import logging
import os
import time

LEVELS = ("debug", "info", "warning", "error")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(level: str = "info") -> None:
    """Root logging at `level`; the HTTP and Kubernetes client libraries stay at WARNING even at
    debug, where they would log every request and drown the scheduler's own lines."""
    logging.basicConfig(level=getattr(logging, level.upper()), format=FORMAT)
    if level == "debug":
        for noisy in ("urllib3", "kubernetes.client.rest"):
            logging.getLogger(noisy).setLevel(logging.WARNING)


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc), for the start-up lines of the log,
    which count the interpreter and imports too; None where /proc is not there."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            # the command name (field 2) may hold spaces: fields are counted after its ")"
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    age = uptime - started_ticks / os.sysconf("SC_CLK_TCK")
    # below zero where /proc/uptime is the container's and the start the host's (lxcfs)
    return age if age >= 0 else None


def age_note() -> str:
    """' (N.NNs after the process started)', or '' where that is not known."""
    age = process_age_s()
    return "" if age is None else f" ({age:.2f}s after the process started)"


class GcPauses:
    """Logs each garbage collection that stops the process for `threshold_s` or more: while it
    runs every thread waits (the scheduling loop, the watches), so a gang created then waits too,
    and the log should say so rather than leave a gap. Installed by `kai-ray run`."""

    def __init__(self, threshold_s: float = 0.05) -> None:
        self.threshold_s = threshold_s
        self._started = 0.0
        self.longest_s = 0.0

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        self.longest_s = max(self.longest_s, took)
        if took >= self.threshold_s:
            logging.getLogger("kai_ray").info(
                "garbage collection of generation %d stopped the process for %.2fs "
                "(%d objects collected)", info.get("generation", -1), took,
                info.get("collected", 0))
