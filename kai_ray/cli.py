"""The `kai-ray` command.

Only argument parsing lives here; every command's work is in the package that owns it and is
imported lazily, so `kai-ray --help` stays fast and a missing optional dependency only breaks the
command that needs it.
"""

from __future__ import annotations

import argparse
import importlib
import ipaddress
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

# command -> "module:function"; the function takes the parsed namespace, returns an exit code
_HANDLERS: dict[str, str] = {
    "demo": "kai_ray.sim.commands:cmd_demo",
    "simulate": "kai_ray.sim.commands:cmd_simulate",
    "conformance": "kai_ray.sim.commands:cmd_conformance",
    "bench-packing": "kai_ray.sim.packing_cli:cmd_bench_packing",
    "dev-cluster": "kai_ray.testing.devcluster:cmd_dev_cluster",
    "run": "kai_ray.controller.main:cmd_run",
    "queues": "kai_ray.tools.queues:cmd_queues",
    "explain": "kai_ray.tools.explain:cmd_explain",
    "snapshot": "kai_ray.tools.snapshot:cmd_snapshot",
    "webhook": "kai_ray.controller.webhook_server:cmd_webhook",
    "apply-crds": "kai_ray.k8s.crd_apply:cmd_apply_crds",
}


class _Parser(argparse.ArgumentParser):
    """Usage errors on one line naming the flag (`kai-ray run: --metrics-port: ...`), exit
    status 2; argparse's own print the whole usage text first."""

    def error(self, message: str) -> NoReturn:
        # "argument -o/--output: ..." -> "--output: ..."
        message = re.sub(r"^argument ([^:]+): ",
                         lambda m: m.group(1).split("/")[-1] + ": ", message)
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


# ----------------------------------------------------------------- values of flags, checked
# when parsed, so that a wrong one stops before any work with one line naming the flag


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0..65535, got {text!r}")
    return value


def _count(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low or (high is not None and value > high):
            bounds = f"{low}..{high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"expected an integer {bounds}, got {text!r}")
        return value

    return parse


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _file(text: str) -> str:
    """A file that can be read now (not later, after a cluster was contacted)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a file, got ''")
    if not os.path.exists(text):
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text}: is a directory, expected a file")
    if not os.access(text, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text}: not readable")
    return text


def _kubeconfig(text: str) -> str:
    """A readable kubeconfig that is YAML (the client's own errors say the rest)."""
    import yaml

    _file(text)
    try:
        with open(text, "rb") as f:
            doc = yaml.safe_load(f)
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise argparse.ArgumentTypeError(f"{text}: not valid YAML: "
                                         f"{' '.join(str(e).split())}") from None
    if not isinstance(doc, dict):
        raise argparse.ArgumentTypeError(f"{text}: expected a kubeconfig (a YAML mapping)")
    return text


def _not_empty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a name, got ''")
    return text


def _directory(text: str) -> str:
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text}: no such directory")
    return text


def _output(text: str) -> str:
    """`-` (stdout) or a file whose directory exists."""
    if text == "-":
        return text
    folder = os.path.dirname(text) or "."
    if not text or os.path.isdir(text) or not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"expected - or a file in an existing directory, "
                                         f"got {text!r}")
    return text


_DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _name(text: str) -> str:
    """A Kubernetes object name (DNS subdomain: lower case, digits, '-' and '.')."""
    if len(text) > 253 or not _DNS_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected a Kubernetes name (lower case letters, "
                                         f"digits, '-', '.'), got {text!r}")
    return text


def _address(text: str) -> str:
    """An address to listen on: an IP address or a host name."""
    try:
        ipaddress.ip_address(text)
        return text
    except ValueError:
        pass
    if len(text) > 253 or not _DNS_NAME.fullmatch(text.lower()):
        raise argparse.ArgumentTypeError(f"expected an IP address or a host name, got {text!r}")
    return text


def _add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=["table", "json"], default="table",
                   help="human table (default) or JSON for scripts")


def _add_kubeconfig(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", type=_kubeconfig,
                   help="kubeconfig path (default: $KUBECONFIG, ~/.kube/config)")


def _add_scheduler_config(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=_file,
                   help="the scheduler's YAML configuration (placement, actions), as given to "
                        "`kai-ray run --config`; default: built-in")


def _add_core(p: argparse.ArgumentParser) -> None:
    p.add_argument("--core", choices=["auto", "python", "native"], default="auto",
                   help="scheduling core: the Rust one when built (auto, the default), the "
                        "Python reference, or insist on the Rust one")


def _add_log_level(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info",
                   help="the least severe log lines shown (default info: starts, decisions, "
                        "faults; debug adds every cycle's timing)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kai-ray",
        description="KAI-Scheduler-compatible GPU batch scheduler for Ray on Kubernetes.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("demo", help="run the sample scenarios through the real core (no cluster)")
    _add_core(p)
    p.set_defaults(handler="demo")

    p = sub.add_parser("simulate", help="run a scenario or cluster snapshot and print the outcome")
    p.add_argument("file", type=_file)
    p.add_argument("--timing", action="store_true",
                   help="end with the wall time of schedule() alone: 'schedule: N.NNN s'")
    _add_output(p)
    _add_core(p)
    p.set_defaults(handler="simulate")

    p = sub.add_parser("conformance", help="check scenario expectations (exit 1 on any failure)")
    p.add_argument("files", nargs="+", metavar="FILE", type=_file)
    p.add_argument("-v", "--verbose", action="store_true", help="show details of failures")
    _add_core(p)
    p.set_defaults(handler="conformance")

    p = sub.add_parser("bench", help="benchmarks")
    bench = p.add_subparsers(dest="bench", metavar="BENCH")
    bench.required = True
    pk = bench.add_parser("packing", help="fractional-GPU packing on the Alibaba openb trace")
    pk.add_argument("--trace", default="default", help="trace name (default, gpushare40, ...)")
    pk.add_argument("--seeds", type=_count(1), default=10)
    pk.add_argument("--policy", action="append", help="policy name (repeatable; default: all)")
    pk.add_argument("--data-dir", type=_directory,
                    help="directory holding the openb CSV files")
    pk.add_argument("--plot", type=_output, help="PNG path for the curves")
    pk.add_argument("--workers", type=_count(1, 2), default=2, help="parallel runs (at most 2)")
    pk.add_argument("--save", type=_output,
                    help="also write every run's curves to this JSON file")
    _add_output(pk)
    pk.set_defaults(handler="bench-packing")

    p = sub.add_parser("dev-cluster", help="local control plane with KWOK GPU nodes (no Docker)")
    dc = p.add_subparsers(dest="action", metavar="ACTION")
    dc.required = True
    up = dc.add_parser("up", help="start the control plane")
    up.add_argument("--nodes", type=_count(0), default=2)
    up.add_argument("--gpus-per-node", type=_count(0), default=8)
    up.add_argument("--kuberay", action="store_true", help="also start the KubeRay operator")
    up.add_argument("--install", action="store_true",
                    help="with --real-node: build the kai-ray images (cached), load them onto the "
                         "real node and `helm install` this checkout's chart; kai-ray then runs "
                         "in the cluster as pods, under the chart's ServiceAccounts")
    up.add_argument("--real-node", action="store_true",
                    help="also run a real kubelet node on this machine (root; docs/real-node.md)")
    up.add_argument("--real-node-gpus", type=_count(0), default=2, metavar="N",
                    help="fake nvidia.com/gpu devices the real node advertises (default 2)")
    dc.add_parser("down", help="stop everything the dev cluster started")
    dc.add_parser("env", help="print shell exports (KUBECONFIG, PATH)")
    dc.add_parser("status", help="show what is running")
    p.set_defaults(handler="dev-cluster")

    p = sub.add_parser("run", help="all controllers in one process, out of cluster")
    _add_kubeconfig(p)
    p.add_argument("--config", type=_file,
                   help="YAML scheduler configuration (docs/configuration.md)")
    p.add_argument("--leader-election", choices=["on", "off"], default="on",
                   help="only the holder of the Lease schedules (default on)")
    p.add_argument("--lease-namespace", type=_name, default="kube-system")
    p.add_argument("--lease-name", type=_name, default="kai-ray-scheduler")
    p.add_argument("--metrics-port", type=_port, default=0,
                   help="serve Prometheus /metrics on this port (0: off)")
    p.add_argument("--metrics-addr", type=_address, default="127.0.0.1")
    p.add_argument("--health-port", type=_port, default=0,
                   help="serve /healthz and /readyz on this port (0: off)")
    p.add_argument("--health-addr", type=_address, default="127.0.0.1")
    p.add_argument("--webhook", action="store_true",
                   help="also run the admission webhook (kopf, self-signed TLS)")
    p.add_argument("--webhook-port", type=_port, default=0, help="webhook port (0: any free)")
    p.add_argument("--validate-queue", action="store_true",
                   help="the webhook rejects pods whose queue is missing or not a leaf")
    p.add_argument("--kube-api-qps", type=_finite, default=None,
                   help="API requests per second of the client, as kube-scheduler's flag "
                        "(overrides the config's clientConnection.qps; default 50; -1: no limit)")
    p.add_argument("--kube-api-burst", type=_count(0), default=None,
                   help="burst of the client's rate limit (default 100)")
    _add_log_level(p)
    _add_core(p)
    p.set_defaults(handler="run")

    p = sub.add_parser("queues", help="queue tree: quota, limit, weight, allocated, fair share")
    _add_kubeconfig(p)
    _add_output(p)
    _add_scheduler_config(p)
    _add_core(p)
    p.set_defaults(handler="queues")

    p = sub.add_parser("explain", help="why a pod or PodGroup is pending")
    p.add_argument("name", type=_not_empty, help="POD, pod/NAME or podgroup/NAME")
    p.add_argument("-n", "--namespace", type=_name, default="default")
    _add_kubeconfig(p)
    _add_output(p)
    _add_scheduler_config(p)
    _add_core(p)
    p.set_defaults(handler="explain")

    p = sub.add_parser("snapshot", help="dump the live cluster to a scenario file")
    _add_kubeconfig(p)
    p.add_argument("-f", "--file", type=_output, default="-",
                   help="output path (default: stdout)")
    _add_scheduler_config(p)
    p.set_defaults(handler="snapshot")

    p = sub.add_parser("webhook", help="the admission webhook alone (the chart's Deployment)")
    _add_kubeconfig(p)
    p.add_argument("--addr", type=_address, default="127.0.0.1", help="listening address")
    p.add_argument("--port", type=_port, default=9443)
    # not checked when parsed: tests build the webhook's settings from paths that do not
    # exist (tests/controller/test_webhook_server.py)
    p.add_argument("--cert-file", help="serving certificate (PEM); default: self-signed")
    p.add_argument("--key-file", help="its private key (PEM)")
    p.add_argument("--scheduler-name", type=_name, default="kai-scheduler")
    p.add_argument("--gpu-sharing", choices=["on", "off"], default="on",
                   help="off: reject gpu-fraction / gpu-memory pods")
    p.add_argument("--validate-queue", action="store_true",
                   help="reject pods whose queue is missing or not a leaf")
    p.add_argument("--manage-configurations", action="store_true",
                   help="write the webhook configurations itself (default: the chart owns them)")
    p.add_argument("--service", help="NAMESPACE/NAME/PORT for the configurations' clientConfig")
    _add_log_level(p)
    p.set_defaults(handler="webhook")

    p = sub.add_parser("apply-crds", help="server-side apply kai-ray's CRDs (upgrade path)")
    _add_kubeconfig(p)
    p.set_defaults(handler="apply-crds")
    return parser


def _resolve(target: str) -> Callable[[argparse.Namespace], int]:
    module_name, func_name = target.split(":")
    module = importlib.import_module(module_name)
    func: Callable[[argparse.Namespace], int] = getattr(module, func_name)
    return func


def _choose_core(core: str) -> int:
    """Make `core` the process's scheduling core; 0, or 2 when it cannot be had."""
    from kai_ray.core import schedule

    try:
        schedule.set_default_core(core)  # type: ignore[arg-type]
        if core == "native" and schedule.native_core(refresh=True) is None:
            print("kai-ray: --core native: the native core is not built (python3 -m "
                  "kai_ray.testing.native_core builds it and prints where)", file=sys.stderr)
            return 2
    except (ValueError, ImportError) as exc:
        print(f"kai-ray: --core {core}: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "core", "auto") != "auto" and (code := _choose_core(args.core)):
        return code
    handler = _resolve(_HANDLERS[args.handler])
    prog = f"kai-ray {args.command}"
    try:
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except SystemExit as exc:
        # a handler's "cannot go on" message (a bad --config key, a flag that contradicts the
        # file): one line, exit status 2 as argparse's own
        if not isinstance(exc.code, str):
            raise
        message = exc.code if exc.code.startswith("kai-ray") else f"{prog}: {exc.code}"
        print(" ".join(message.split()), file=sys.stderr)
        return 2
    except Exception as exc:
        bad = _kubeconfig_error(exc)
        if bad is None:
            raise
        print(f"{prog}: --kubeconfig: {' '.join(bad.split())}", file=sys.stderr)
        return 2


def _kubeconfig_error(exc: Exception) -> str | None:
    """The message of a kubeconfig the kubernetes client cannot use (no context, no cluster,
    not YAML); None for any other error. The client is imported only by the commands that
    use it: if it is not loaded, this is not its error."""
    module = sys.modules.get("kubernetes.config.config_exception")
    if module is not None and isinstance(exc, module.ConfigException):
        return str(exc)
    return None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
