"""Undo what a real node (kai_ray.testing.realnode) left on this machine when its plane was
killed before it could stop it:

    python3 -m kai_ray.testing.realnode_cleanup cleanup /tmp/kai-ray-plane-XXXX
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
from pathlib import Path

from kai_ray.testing import procs
from kai_ray.testing.plane import ControlPlane
from kai_ray.testing.realnode import RealNode, remove_bridge


def cleanup(workdir: Path) -> list[str]:
    """Undo what the real node of a killed plane (SIGKILL: no stop() ran) left on this machine,
    from the state it recorded in `workdir`; returns what is still left."""
    node_dir = str(Path(workdir).resolve() / "node")
    # attached components die with their parent; shims and containers outlive it
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and any(node_dir in a for a in procs.cmdline(int(entry.name))):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
    plane = ControlPlane(Path(workdir), detached=True, real_node=True)
    left = RealNode(plane).stop()
    remove_bridge()
    return left


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m kai_ray.testing.realnode_cleanup",
                                     description="clean up after a real node whose plane was "
                                                 "killed before it could stop it")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("cleanup", help="undo the node's changes to this machine")
    p.add_argument("workdir", type=Path, help="the plane's workdir (it holds node/)")
    args = parser.parse_args(argv)
    if not (args.workdir / "node" / "host-before.json").is_file():
        print(f"no real node's state under {args.workdir}/node: nothing to clean up")
        return 1
    left = cleanup(args.workdir)
    print("left over: " + ", ".join(left) if left else "cleaned up")
    return 1 if left else 0


if __name__ == "__main__":
    raise SystemExit(main())
