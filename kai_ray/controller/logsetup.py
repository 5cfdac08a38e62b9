"""Logging of the long-running processes (`kai-ray run`, `kai-ray webhook`): one format, and the
level from `--log-level` (the chart's `logLevel` value)."""

from __future__ import annotations

import logging

LEVELS = ("debug", "info", "warning", "error")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(level: str = "info") -> None:
    """Root logging at `level`; the HTTP and Kubernetes client libraries stay at WARNING even at
    debug, where they would log every request and drown the scheduler's own lines."""
    logging.basicConfig(level=getattr(logging, level.upper()), format=FORMAT)
    if level == "debug":
        for noisy in ("urllib3", "kubernetes.client.rest"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
