"""Child processes of the local control plane: start in their own process group, stop for sure.

Each component runs in a new session (its own process group), so stopping it signals the whole
group and nothing it forked survives. Attached components also get PR_SET_PDEATHSIG, so the
kernel kills them if the Python process dies without running its cleanup (SIGKILL, OOM).
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def spawn(argv: Sequence[str], log: Path, *, detached: bool,
          env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start argv with stdout+stderr appended to `log`, in a new process group.

    detached=False ties the child's life to this process (it is killed if we die);
    detached=True lets it outlive us (the dev cluster).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, env=env, close_fds=True,
            preexec_fn=None if detached else _die_with_parent,
        )


def group_alive(pgid: int) -> bool:
    """Whether any process (zombies included) is left in the process group."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(pgid: int, *, proc: subprocess.Popen[bytes] | None = None,
               grace: float = 5.0) -> None:
    """SIGTERM the group, SIGKILL whatever is left after `grace` seconds, reap our child."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is None:
            time.sleep(0.05)
            continue
        if not group_alive(pgid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    deadline = time.monotonic() + 5
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def cmdline(pid: int) -> list[str]:
    """argv of a running process ([] if it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def free_ports(n: int) -> list[int]:
    """n distinct loopback ports that are free right now (held open together while picking)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def probe_readyz(conn: http.client.HTTPConnection) -> str | None:
    """One GET /readyz: None when ready, else what went wrong (the connection is closed)."""
    try:
        conn.request("GET", "/readyz")
        resp = conn.getresponse()
        body = resp.read().decode(errors="replace")
        return None if resp.status == 200 else f"HTTP {resp.status}: {body[-300:]}"
    except OSError as e:
        return str(e)
    finally:
        conn.close()


def tail(path: Path, lines: int = 25) -> str:
    """The last lines of a log file, for error messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])
