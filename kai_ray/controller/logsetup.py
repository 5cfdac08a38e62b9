"""Logging of the long-running processes (`kai-ray run`, `kai-ray webhook`): one format, and the
level from `--log-level` (the chart's `logLevel` value)."""

from __future__ import annotations

import logging
import os

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
