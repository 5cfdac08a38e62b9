"""A real kubelet node beside the KWOK nodes: real containers, faked GPU hardware only.

    plane = ControlPlane(real_node=True).start()   # API server on the node bridge's address
    node = RealNode(plane, gpus=2).start()          # containerd, kubelet, ... as processes
    ...
    plane.stop()                                    # stops the node first, then the plane

What runs, each as a process with the plane's lifetime rules (procs.spawn; detached for the
dev cluster), all configured under <plane workdir>/node/:

    containerd         Debian's, runc, its own root/state/socket/config (cgroupfs)
    kubelet            node name = this machine's hostname, TLS both ways with the plane's CA
    gpu-device-plugin  a kubelet device plugin advertising N fake `nvidia.com/gpu` devices
    kube-proxy         iptables mode: Service IPs work from pods and from the host
    coredns            serves cluster.local (kubernetes plugin) on the bridge address

Pods get addresses on a bridge (`kairay0`, 10.77.0.0/24, host-local IPAM) that the plane
creates before its API server starts, because the API server listens on the bridge's address:
pods reach it through the `kubernetes` Service. Pods cannot reach beyond this machine (a
FORWARD rule drops what leaves the pod subnet).

The kubelet changes host state (sysctls, iptables chains, cgroups, mounts, directories); start()
records the host's state first and stop() puts it back: it removes the pods, unmounts, deletes
the kubepods cgroups, the KUBE-* chains that were not there before, the veths, and restores
every sysctl that changed.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Protocol

import yaml
from kubernetes import client

from kai_ray.testing import binaries, procs
from kai_ray.testing.nodes import DEFAULT_GPU_MEMORY_MIB, DEFAULT_GPU_PRODUCT
from kai_ray.testing.pki import Pki, issue_cert, write_kubeconfig

BRIDGE = "kairay0"
# Private, and clear of what else runs here: podman 10.88/16, KWOK pods 10.244/16 and nodes
# 10.250/16, Services 10.96/16 (start() checks the routing table too).
POD_SUBNET = "10.77.0.0/24"
GATEWAY = "10.77.0.1"  # the bridge's address: node IP, API server, CoreDNS
CLUSTER_DOMAIN = "cluster.local"
# Ray's worker ports span 10002-19999, which covers the kubelet's default 10250/10248
KUBELET_PORT = 20250
KUBELET_HEALTHZ_PORT = 20248
DEFAULT_GPUS = 2
# hard-coded in the kubelet: device plugins register here whatever its --root-dir
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
# directories the kubelet or containerd create outside our workdir; removed if they were absent
HOST_DIRS = ("/var/lib/kubelet", "/var/log/containers", "/var/log/pods", "/run/containerd")
CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins
FORWARD_RULE = ["FORWARD", "-s", POD_SUBNET, "!", "-d", POD_SUBNET, "-m", "comment",
                "--comment", "kai-ray real node: pods stay on this machine", "-j", "DROP"]
# the API server, kubelet and CoreDNS listen on the gateway address: only this machine and its
# pods may reach them, not a neighbour that routes the subnet here
GUARD_RULE = ["INPUT", "-d", GATEWAY, "!", "-i", BRIDGE, "-m", "addrtype", "!", "--src-type",
              "LOCAL", "-m", "comment", "--comment", "kai-ray real node: local only",
              "-j", "DROP"]
# what the kubelet, kube-proxy and the CNI plugins change; start() records them all
SYSCTL_TREES = ("vm", "kernel", "net/ipv4", "net/ipv6", "net/bridge", "net/netfilter")
# values that change by themselves
SYSCTL_VOLATILE = ("kernel/random/", "kernel/ns_last_pid", "kernel/pty/nr",
                   "net/netfilter/nf_conntrack_count")
COMPONENTS = ("gpu-device-plugin", "kube-proxy", "coredns", "kubelet", "containerd")


class RealNodeError(RuntimeError):
    """The node could not start (the message says why, with the end of a log)."""


# ------------------------------------------------------------------------------ host network
def ensure_bridge() -> None:
    """The pods' bridge with the gateway address, up. Refuses an existing bridge (one real node
    per machine: a dev cluster's, or one a crash left) and a subnet clash."""
    if _link_exists(BRIDGE):
        raise RealNodeError(f"bridge {BRIDGE} exists: a real node runs on this machine already "
                            "(`kai-ray dev-cluster down`?) or a crashed one left it "
                            f"(`ip link del {BRIDGE}`)")
    subnet = ipaddress.ip_network(POD_SUBNET)
    routes = subprocess.run(["ip", "-4", "-o", "route", "show", "table", "all"],
                            capture_output=True, text=True, check=True).stdout
    for line in routes.splitlines():
        words = line.split()
        # "10.0.0.0/8 dev ...", "local 10.0.0.1 dev ...", "unreachable 10.1.0.0/16", ...
        dest = words[1] if words[0] in ("local", "broadcast", "unreachable", "blackhole",
                                        "prohibit", "throw", "unicast") else words[0]
        with contextlib.suppress(ValueError):
            if dest != "default" and ipaddress.ip_network(dest, strict=False).overlaps(subnet):
                raise RealNodeError(f"the real node's pod subnet {POD_SUBNET} clashes with "
                                    f"a route on this machine: {line.strip()}")
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{GATEWAY}/{subnet.prefixlen}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    subprocess.run(["iptables", "-w", "-I", *GUARD_RULE], capture_output=True, check=True)


def remove_bridge() -> None:
    """Delete the pods' veths (if any survived their pods), the bridge and its guard rule."""
    while subprocess.run(["iptables", "-w", "-D", *GUARD_RULE], capture_output=True,
                         check=False).returncode == 0:
        pass
    if not _link_exists(BRIDGE):
        return
    out = subprocess.run(["ip", "-o", "link", "show", "master", BRIDGE], capture_output=True,
                         text=True, check=False).stdout
    for line in out.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)


def _link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RealNodeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


# ------------------------------------------------------------------------------ host state
def sysctl_snapshot() -> dict[str, str]:
    """Every readable sysctl under SYSCTL_TREES but the volatile ones, by path
    ('net/ipv4/ip_forward': '1\\n')."""
    values = {}
    root = Path("/proc/sys")
    for tree in SYSCTL_TREES:
        for path in (root / tree).rglob("*"):
            key = str(path.relative_to(root))
            if key.startswith(SYSCTL_VOLATILE) or not path.is_file():
                continue
            with contextlib.suppress(OSError):
                values[key] = path.read_text()
    return values


def restore_sysctls(before: dict[str, str]) -> list[str]:
    """Write back every recorded sysctl whose value changed; returns the keys it restored.

    ip_forward first: writing it resets every interface's forwarding flag.
    """
    now = sysctl_snapshot()
    changed = sorted((k for k in before if k in now and now[k] != before[k]),
                     key=lambda k: k != "net/ipv4/ip_forward")
    restored = []
    for key in changed:
        if (Path("/proc/sys") / key).read_text() == before[key]:
            continue  # an earlier write (ip_forward) already put it back
        with contextlib.suppress(OSError):
            (Path("/proc/sys") / key).write_text(before[key])
            restored.append(key)
    return restored


def iptables_tools() -> list[str]:
    """The iptables front ends on this machine (nft and legacy, IPv4 and IPv6)."""
    names = ("iptables", "ip6tables", "iptables-legacy", "ip6tables-legacy")
    return [n for n in names if shutil.which(n)]


def iptables_chains(tool: str) -> dict[str, list[str]]:
    """{table: chains} as `tool -t table -S` lists them."""
    chains: dict[str, list[str]] = {}
    for table in ("filter", "nat", "mangle", "raw"):
        out = subprocess.run([tool, "-w", "-t", table, "-S"], capture_output=True, text=True,
                             check=False)
        chains[table] = [line.split()[1] for line in out.stdout.splitlines()
                         if line.startswith(("-N ", "-P "))]
    return chains


def remove_kube_chains(before: dict[str, dict[str, list[str]]]) -> None:
    """Delete the KUBE-* chains (and the rules jumping to them) that were not there before."""
    for tool in iptables_tools():
        for table in ("filter", "nat", "mangle", "raw"):
            had = set(before.get(tool, {}).get(table, []))
            rules = subprocess.run([tool, "-w", "-t", table, "-S"], capture_output=True,
                                   text=True, check=False).stdout.splitlines()
            ours = {r.split()[1] for r in rules
                    if r.startswith("-N KUBE-") and r.split()[1] not in had}
            if not ours:
                continue
            for rule in rules:
                parts = shlex.split(rule)  # comments are quoted: "kubernetes service portals"
                if parts[0] == "-A" and parts[1] not in ours and (
                        "-j" in parts and parts[parts.index("-j") + 1] in ours):
                    subprocess.run([tool, "-w", "-t", table, "-D", *parts[1:]],
                                   capture_output=True, check=False)
            for chain in ours:
                subprocess.run([tool, "-w", "-t", table, "-F", chain], capture_output=True,
                               check=False)
            for chain in ours:
                subprocess.run([tool, "-w", "-t", table, "-X", chain], capture_output=True,
                               check=False)


def host_snapshot() -> dict[str, Any]:
    """What the node may change on this machine, to put back (stop) and to compare (tests)."""
    return {
        "sysctls": sysctl_snapshot(),
        "iptables": {tool: iptables_chains(tool) for tool in iptables_tools()},
        "links": sorted(os.listdir("/sys/class/net")),
        "absent_dirs": [d for d in HOST_DIRS if not os.path.lexists(d)],
    }


def mounts_under(*prefixes: str) -> list[str]:
    """Mount points at or below any prefix, deepest first."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")  # '\040' is a space
        if any(point == p or point.startswith(p.rstrip("/") + "/") for p in prefixes):
            found.append(point)
    return sorted(set(found), key=lambda p: (-p.count("/"), p))


def unmount_all(*prefixes: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    for point in mounts_under(*prefixes):
        libc.umount2(point.encode(), 2)  # MNT_DETACH: busy mounts go as soon as they can


def kubepods_cgroups() -> list[Path]:
    """The kubelet's pod cgroups: one per cgroup v1 hierarchy (and the hybrid layout's v2
    one), or the single one of a pure cgroup v2 machine."""
    root = Path("/sys/fs/cgroup")
    return [p for p in [root / "kubepods", *root.glob("*/kubepods")] if p.is_dir()]


def remove_cgroups(tops: list[Path]) -> None:
    """Kill every process left in the cgroups below `tops`, then remove them, deepest first."""
    for top in tops:
        dirs = sorted((d for d in [top, *top.rglob("*")] if d.is_dir()),
                      key=lambda d: -len(d.parts))
        for d in dirs:
            with contextlib.suppress(OSError):
                for pid in (d / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
        for d in dirs:
            for _ in range(50):  # a killed process leaves its cgroup a moment later
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)


def _processes_with_arg(arg: str) -> list[int]:
    """Pids whose command line holds `arg` exactly (containerd's shims name its socket)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and arg in procs.cmdline(int(entry.name)):
            pids.append(int(entry.name))
    return pids


# ------------------------------------------------------------------------------ the node
class Plane(Protocol):
    """What the node uses of its control plane (kai_ray.testing.plane.ControlPlane, which
    imports this module: the node does not import it back)."""

    workdir: Path
    real_node: bool
    components: dict[str, Any]
    ports: dict[str, int]
    timings: dict[str, float]

    @property
    def api_url(self) -> str: ...
    @property
    def pki(self) -> Pki: ...
    @property
    def kubeconfig(self) -> Path: ...
    @property
    def logs_dir(self) -> Path: ...
    def add_component(self, name: str, argv: list[str]) -> Any: ...
    def api_client(self) -> client.ApiClient: ...


class RealNode:
    """The real node of `plane` (which must be a ControlPlane(real_node=True), started)."""

    def __init__(self, plane: Plane, gpus: int = DEFAULT_GPUS) -> None:
        self.plane = plane
        self.gpus = gpus
        self.name = socket.gethostname().lower()
        self.dir = plane.workdir / "node"
        self.timings = plane.timings

    # paths
    @property
    def containerd_socket(self) -> Path:
        return self.dir / "containerd" / "containerd.sock"

    @property
    def kubelet_root(self) -> Path:
        return self.dir / "kubelet"

    @property
    def _host_state_file(self) -> Path:
        return self.dir / "host-before.json"

    def crictl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        crictl = binaries.require_node("crictl")["crictl"]
        endpoint = f"unix://{self.containerd_socket}"
        return subprocess.run([str(crictl), "--runtime-endpoint", endpoint, "--image-endpoint",
                               endpoint, "--timeout", "20s", *args], capture_output=True,
                              text=True, timeout=timeout, check=False)

    def import_image(self, archive: Any) -> None:
        """Import an image archive (kai_ray.testing.images.ImageArchive or a tar path)."""
        from kai_ray.testing.images import import_into_containerd

        import_into_containerd(archive, ctr_binary=shutil.which("ctr") or "ctr",
                               address=self.containerd_socket)

    def tag_image(self, ref: str, new_ref: str) -> None:
        """Give an imported image another name (the one a manifest or config asks for)."""
        ctr = shutil.which("ctr") or "ctr"
        out = subprocess.run([ctr, "--address", str(self.containerd_socket), "-n", "k8s.io",
                              "images", "tag", "--force", ref, new_ref],
                             capture_output=True, text=True, timeout=60, check=False)
        if out.returncode != 0:
            raise RealNodeError(f"ctr images tag {ref} {new_ref}: {out.stderr.strip()}")

    # -- start --------------------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> RealNode:
        if not getattr(self.plane, "real_node", False):
            raise RealNodeError("the plane must be started with ControlPlane(real_node=True)")
        t0 = time.monotonic()
        deadline = t0 + timeout
        bins = binaries.require_node()
        self._preflight()
        try:
            self._record_host_state()
            self._write_configs(bins)
            # before any pod has an address: nothing a pod sends leaves this machine
            subprocess.run(["iptables", "-w", "-I", "FORWARD", "1", *FORWARD_RULE[1:]],
                           capture_output=True, check=True)
            self._start_containerd()
            self._import_pause()
            self.timings["node_runtime_ready"] = time.monotonic() - t0
            self._start_coredns(bins["coredns"])
            t_kubelet = time.monotonic()
            self._start_kubelet(bins["kubelet"])
            self._spawn("gpu-device-plugin", [
                str(bins["gpu-device-plugin"]), f"--gpus={self.gpus}",
                f"--node-name={self.name}", f"--plugin-dir={DEVICE_PLUGIN_DIR}"])
            self._spawn("kube-proxy", [str(bins["kube-proxy"]),
                                       f"--config={self.dir / 'kube-proxy.yaml'}"])
            self._wait_node_ready(deadline)
            self.timings["node_ready"] = time.monotonic() - t_kubelet
            self._wait_gpus(deadline)
            self.timings["node_gpus"] = time.monotonic() - t_kubelet
            self._wait_http(f"http://127.0.0.1:{self.plane.ports['kube-proxy-healthz']}/healthz",
                            "kube-proxy", deadline)
            self._wait_http(f"http://127.0.0.1:{self.plane.ports['coredns-ready']}/ready",
                            "coredns", deadline)
            self.timings["node_started"] = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise
        return self

    def _preflight(self) -> None:
        if os.geteuid() != 0:
            raise RealNodeError("the real node needs root (containerd, mounts, iptables)")
        missing = [t for t in ("containerd", "runc", "ctr", "iptables", "conntrack")
                   if shutil.which(t) is None]
        if not Path(CNI_BIN_DIR, "bridge").is_file():
            missing.append(f"{CNI_BIN_DIR}/bridge")
        if missing:
            raise RealNodeError(f"missing on this machine: {', '.join(missing)}; run "
                                "tools/cluster/install-node-deps.sh")
        if kubepods_cgroups():
            raise RealNodeError("a kubepods cgroup exists already: another kubelet runs here "
                                f"(or a node was not stopped: {kubepods_cgroups()[0]})")
        if not _link_exists(BRIDGE):
            raise RealNodeError(f"no bridge {BRIDGE}: start the plane with real_node=True")

    def _record_host_state(self) -> None:
        """What stop() puts back; kept in the workdir so another process can stop the node."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if self._host_state_file.exists():
            return  # a restart after a failed stop: the first record is the true "before"
        self._host_state_file.write_text(json.dumps(host_snapshot()))

    def _spawn(self, name: str, argv: list[str]) -> None:
        self.plane.add_component(name, argv)

    def _check_alive(self) -> None:
        for name in COMPONENTS:
            comp = self.plane.components.get(name)
            if comp is not None and not comp.alive():
                raise RealNodeError(f"{name} exited during start-up; end of {comp.log}:\n"
                                    f"{procs.tail(comp.log)}")

    # configuration files
    def _write_configs(self, bins: dict[str, Path]) -> None:
        d = self.dir
        for sub in ("containerd/root", "containerd/state", "cni/net.d", "cni/ipam", "pod-logs",
                    "pki"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        ports = procs.free_ports(3)
        self.plane.ports.update({"kube-proxy-healthz": ports[0], "kube-proxy-metrics": ports[1],
                                 "coredns-ready": ports[2]})
        pki = self.plane.pki
        # the kubelet's identity towards the API server (the Node authorizer reads it) and its
        # serving cert (the API server checks it with --kubelet-certificate-authority)
        node_cert = issue_cert(pki, d / "pki", "kubelet-client", f"system:node:{self.name}",
                               org="system:nodes")
        serving = issue_cert(pki, d / "pki", "kubelet-serving", self.name, client=False,
                             dns=[self.name, "localhost"], ips=[GATEWAY, "127.0.0.1"])
        # system:kube-proxy is bound to the built-in system:node-proxier role
        proxy_cert = issue_cert(pki, d / "pki", "kube-proxy", "system:kube-proxy")
        write_kubeconfig(d / "kubelet.kubeconfig", self.plane.api_url, pki, cert=node_cert)
        write_kubeconfig(d / "kube-proxy.kubeconfig", self.plane.api_url, pki, cert=proxy_cert)

        (d / "containerd" / "config.toml").write_text(self._containerd_config())
        (d / "cni" / "net.d" / "10-kai-ray.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0",
            "name": "kai-ray",
            "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False,
                 "hairpinMode": True,
                 "ipam": {"type": "host-local", "subnet": POD_SUBNET, "gateway": GATEWAY,
                          "dataDir": str(d / "cni" / "ipam"),
                          "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "loopback"},
            ],
        }, indent=1))
        kubelet_config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": GATEWAY,
            "port": KUBELET_PORT,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": KUBELET_HEALTHZ_PORT,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(pki.ca_cert)}},
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(serving[0]),
            "tlsPrivateKeyFile": str(serving[1]),
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "cgroupDriver": "cgroupfs",
            # this machine: swap may be on, cgroup v1, and no CAP_SYS_RESOURCE for a negative
            # oom_score_adj
            "failSwapOn": False,
            "failCgroupV1": False,
            "oomScoreAdj": 0,
            "clusterDomain": CLUSTER_DOMAIN,
            "clusterDNS": [GATEWAY],
            "podLogsDir": str(d / "pod-logs"),
            # a shared test machine: no evictions nor image GC for a full-ish disk
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
        }
        (d / "kubelet.yaml").write_text(yaml.safe_dump(kubelet_config, sort_keys=False))
        proxy_config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(d / "kube-proxy.kubeconfig")},
            "mode": "iptables",
            "hostnameOverride": self.name,
            "clusterCIDR": POD_SUBNET,
            "nodePortAddresses": [f"{GATEWAY}/32"],
            "healthzBindAddress": f"127.0.0.1:{ports[0]}",
            "metricsBindAddress": f"127.0.0.1:{ports[1]}",
            # the conntrack sysctls cannot be raised here: 0 leaves them alone
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                          "tcpCloseWaitTimeout": "0s"},
            "oomScoreAdj": 0,
        }
        (d / "kube-proxy.yaml").write_text(yaml.safe_dump(proxy_config, sort_keys=False))
        # no `forward` plugin: names outside the cluster are not looked up off this machine
        (d / "Corefile").write_text(f"""\
.:53 {{
    bind {GATEWAY}
    errors
    ready 127.0.0.1:{ports[2]}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {self.plane.kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
}}
""")

    def _containerd_config(self) -> str:
        d = self.dir / "containerd"
        return f"""\
version = 2
root = "{d / 'root'}"
state = "{d / 'state'}"
# plugins that would write outside root/state, or that this node does not use
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{self.containerd_socket}"

[ttrpc]
  address = "{d / 'containerd.ttrpc.sock'}"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  # a negative oom_score_adj is refused here (no CAP_SYS_RESOURCE): runc would fail
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{self.dir / 'cni' / 'net.d'}"
    max_conf_num = 1
"""

    # processes
    def _start_containerd(self) -> None:
        self._spawn("containerd", ["containerd", "--config",
                                   str(self.dir / "containerd" / "config.toml")])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self._check_alive()
            if self.containerd_socket.exists() and self.crictl("info").returncode == 0:
                return
            time.sleep(0.1)
        raise RealNodeError(f"containerd not ready after 30 s; end of its log:\n"
                            f"{procs.tail(self.plane.logs_dir / 'containerd.log')}")

    def _import_pause(self) -> None:
        from kai_ray.testing import images

        t0 = time.monotonic()
        self.import_image(images.ensure("pause"))
        self.timings["node_pause_image"] = time.monotonic() - t0

    def _start_coredns(self, binary: Path) -> None:
        self._spawn("coredns", [str(binary), "-conf", str(self.dir / "Corefile")])

    def _start_kubelet(self, binary: Path) -> None:
        # the labels NVIDIA's GPU feature discovery puts on a GPU node, which KAI reads (the
        # GPUs' memory): the KWOK nodes' values, as the hardware is as fake as theirs
        labels = {"kai-ray.io/real-node": "true",
                  "nvidia.com/gpu.present": "true" if self.gpus else "false",
                  "nvidia.com/gpu.count": str(self.gpus),
                  "nvidia.com/gpu.product": DEFAULT_GPU_PRODUCT,
                  "nvidia.com/gpu.memory": str(DEFAULT_GPU_MEMORY_MIB)}
        self._spawn("kubelet", [
            str(binary),
            f"--config={self.dir / 'kubelet.yaml'}",
            f"--kubeconfig={self.dir / 'kubelet.kubeconfig'}",
            f"--root-dir={self.kubelet_root}",
            f"--node-ip={GATEWAY}",
            "--node-labels=" + ",".join(f"{k}={v}" for k, v in labels.items()),
            "--v=1",
        ])

    def restart_kubelet(self, timeout: float = 60.0) -> None:
        """Stop and start the kubelet (its pods keep running); returns once the node is Ready
        with its GPUs again, which needs the device plugin to register anew."""
        self._stop_component("kubelet")
        self._start_kubelet(binaries.require_node("kubelet")["kubelet"])
        deadline = time.monotonic() + timeout
        self._wait_node_ready(deadline)
        self._wait_gpus(deadline)

    # waiting
    def _core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.plane.api_client())

    def _wait(self, what: str, deadline: float, check: Any) -> None:
        last = None
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                if check():
                    return
            except Exception as e:  # not there yet
                last = e
            time.sleep(0.1)
        raise RealNodeError(f"{what} not reached ({last or 'timed out'}); logs in "
                            f"{self.plane.logs_dir}; end of the kubelet's log:\n"
                            f"{procs.tail(self.plane.logs_dir / 'kubelet.log')}")

    def _wait_node_ready(self, deadline: float) -> None:
        from kai_ray.testing.nodes import node_ready

        self._wait(f"node {self.name} Ready", deadline,
                   lambda: node_ready(self._core().read_node(self.name)))

    def _wait_gpus(self, deadline: float) -> None:
        def advertised() -> bool:
            alloc = self._core().read_node(self.name).status.allocatable or {}
            return bool(alloc.get("nvidia.com/gpu") == str(self.gpus))

        self._wait(f"{self.gpus} nvidia.com/gpu on {self.name}", deadline, advertised)

    def _wait_http(self, url: str, what: str, deadline: float) -> None:
        def ok() -> bool:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)

        self._wait(f"{what} healthy ({url})", deadline, ok)

    # -- stop ---------------------------------------------------------------------------------
    def stop(self) -> list[str]:
        """Stop the node and undo what it changed on the host; idempotent.

        Host clean-up happens only for a node that recorded the host's state (start() got past
        its checks): never for another node on this machine. Returns what it found left over
        and could not remove (empty when clean).
        """
        comps = self.plane.components
        clients = ("gpu-device-plugin", "kube-proxy", "coredns", "kubelet")
        # all told at once, then waited for: each may take seconds to go
        for name in clients:
            if name in comps and (comps[name].proc is not None or comps[name].alive()):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(comps[name].pid, signal.SIGTERM)
        for name in clients:
            self._stop_component(name)
        if "containerd" in comps and comps["containerd"].alive():
            # the runtime removes the pods properly: CNI DEL (veth, IP), shm and rootfs mounts
            self.crictl("rmp", "--all", "--force", timeout=120)
        self._stop_component("containerd")
        if not self._host_state_file.exists():
            return []
        state = json.loads(self._host_state_file.read_text())
        # shims of pods the runtime could not remove, then whatever still runs in pod cgroups
        for pid in _processes_with_arg(str(self.containerd_socket)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        remove_cgroups(kubepods_cgroups())
        unmount_all(str(self.dir), *state["absent_dirs"])
        while subprocess.run(["iptables", "-w", "-D", *FORWARD_RULE], capture_output=True,
                             check=False).returncode == 0:
            pass
        remove_kube_chains(state["iptables"])
        for d in state["absent_dirs"]:
            shutil.rmtree(d, ignore_errors=True)
        restore_sysctls(state["sysctls"])
        left = self.leftovers(state)
        self._host_state_file.unlink()
        return left

    def _stop_component(self, name: str) -> None:
        comp = self.plane.components.pop(name, None)
        if comp is not None and (comp.proc is not None or comp.alive()):
            procs.stop_group(comp.pid, proc=comp.proc)

    def leftovers(self, state: dict[str, Any] | None = None) -> list[str]:
        """What the node left on the host: processes, mounts, cgroups, chains, directories."""
        left = [f"process {pid}" for pid in _processes_with_arg(str(self.containerd_socket))]
        left += [f"mount {m}" for m in mounts_under(
            str(self.dir), *(state["absent_dirs"] if state else ()))]
        left += [f"cgroup {c}" for c in kubepods_cgroups()]
        if state is not None:
            for tool in iptables_tools():
                for table, chains in iptables_chains(tool).items():
                    had = set(state["iptables"].get(tool, {}).get(table, []))
                    left += [f"{tool} -t {table} chain {c}" for c in chains
                             if c.startswith("KUBE-") and c not in had]
            left += [f"directory {d}" for d in state["absent_dirs"] if os.path.lexists(d)]
        return left
