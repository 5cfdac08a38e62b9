"""`kai-ray run` started as a child process, for tests that need the real thing (including
killing it with SIGKILL at a random moment)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kai_ray.testing import procs


class KaiRayProcess:
    def __init__(self, kubeconfig: Path, workdir: Path, extra_args: list[str] | None = None
                 ) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.workdir = Path(workdir)
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / f"kai-ray-run-{self.starts}.log"

    def start(self) -> None:
        """Start it in its own process group, tied to our life (it dies if the test dies)."""
        self.starts += 1
        self.proc = procs.spawn(
            [sys.executable, "-m", "kai_ray.cli", "run", "--kubeconfig", str(self.kubeconfig),
             *self.extra_args], self.log_path, detached=False,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def kill(self) -> None:
        """SIGKILL: no chance to clean up, as in a crash."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return ""

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"kai-ray run exited:\n{self.log_tail()}")
            if "scheduler running" in self.log_tail(200):
                return
            time.sleep(0.2)
        raise TimeoutError(f"kai-ray run not ready in {timeout:.0f}s:\n{self.log_tail()}")
