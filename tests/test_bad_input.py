"""Malformed input, table-driven, through the real entry points, outside any cluster.

Each row feeds one bad value where a user writes it (a scenario file, the config file, a
flag of `kai-ray`, a label, an annotation or a Queue spec through the converters, the Ray
helper's environment) and requires a clear refusal: the entry point's own error (never
another exception, a traceback, or a hang) that names the field, and never a normal return
(a bad value read as a default is "silently wrong").

Rows per category (`test_row_counts` checks the total): scenario 42, config 34, cli 30,
queue 18, labels-annotations 21, ray-env 18, pod-request 18; 181 in all. Now: 0 tracebacks,
0 hangs, 0 silently wrong, every error names its field.

The same table over the code before this change: 136 of 181 refused badly. Outside the
pod-request rows: 67 silently wrong (a value taken, or read as a default), 30 tracebacks,
1 hang (`bench packing --workers 5` ran the whole benchmark), 12 errors that were unclear
(exit status 1, argparse's usage text, several lines, no field named), 7 rows of keys that
did not exist yet and 1 of a new argument (node_from's problems). The 18 pod-request rows
(kai_ray.k8s.convert.pod_request, the GPU-sharing annotations) were 13 silently wrong and 5
tracebacks; they run last.
"""

from __future__ import annotations

import collections
import math
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from kai_ray.k8s import config_file, convert
from kai_ray.ray.gpu_env import GpuEnvError, parse_pod_env
from kai_ray.sim import scenario as scenario_mod

ROOT = Path(__file__).resolve().parents[1]
HANG_S = 60  # an entry point that has not answered by then is a hang


class Accepted(AssertionError):
    """The entry point returned normally: the bad value was taken."""


@dataclass(frozen=True)
class Row:
    category: str
    case: str
    feed: Callable[[Path], str]  # runs the entry point on the bad input; its error message
    field: str  # what the message must name

    @property
    def id(self) -> str:
        return f"{self.category}: {self.case}"


ROWS: list[Row] = []


def row(category: str, case: str, field: str) -> Callable[[Callable[[Path], str]], None]:
    def add(feed: Callable[[Path], str]) -> None:
        ROWS.append(Row(category, case, feed, field))
    return add


# --------------------------------------------------------------------------- scenario files


def _scenario(**changes: Any) -> dict[str, Any]:
    """A small valid scenario; `changes` replace or add its keys."""
    doc: dict[str, Any] = {
        "id": "S-1", "run": "allocate",
        "nodes": [{"name": "n0", "gpus": 2}],
        "queues": [{"name": "q", "gpu": {"quota": 1, "limit": -1, "weight": 1}}],
        "jobs": [{"name": "j", "queue": "q", "per_task": {"gpu": 1},
                  "tasks": [{"state": "Pending"}]}],
        "expect": {"j": {"status": "Binding"}},
    }
    doc.update(changes)
    return doc


def _job(**changes: Any) -> dict[str, Any]:
    job: dict[str, Any] = {"name": "j", "queue": "q", "per_task": {"gpu": 1},
                           "tasks": [{"state": "Pending"}]}
    job.update(changes)
    return job


def _load_scenario(tmp: Path, doc: Any = None, raw: bytes | None = None) -> str:
    path = tmp / "scenario.yaml"
    path.write_bytes(raw if raw is not None else yaml.safe_dump(doc).encode())
    try:
        scenario_mod.load(path)
    except scenario_mod.ScenarioError as e:
        return str(e)
    raise Accepted(f"{path} loaded")


def scenario_row(case: str, field: str, doc: Any = None, raw: bytes | None = None) -> None:
    row("scenario", case, field)(lambda tmp: _load_scenario(tmp, doc, raw))


def _in_file(*scenarios: dict[str, Any]) -> dict[str, Any]:
    return {"scenarios": list(scenarios)}


def _quota(**quota: Any) -> dict[str, Any]:
    return _in_file(_scenario(queues=[{"name": "q", "gpu": {"quota": 1, "limit": -1,
                                                             "weight": 1, **quota}}]))


def _request(**request: Any) -> dict[str, Any]:
    return _in_file(_scenario(jobs=[_job(per_task=request)]))


scenario_row("a file that is not UTF-8", "scenario.yaml",
             raw=b"scenarios:\n- id: \xff\xfe\n  run: allocate\n")
scenario_row("not YAML", "not valid YAML", raw=b"scenarios: [\n")
scenario_row("a list at the top", "'scenarios'", raw=b"- id: x\n")
scenario_row("scenarios is null", "scenarios", raw=b"scenarios:\n")
scenario_row("scenarios is a string", "scenarios", raw=b"scenarios: allocate\n")
scenario_row("a non-string top-level key", "unsupported top-level field",
             raw=b"scenarios: []\n1: x\n")
scenario_row("duplicate scenario id", "scenarios.1.id", _in_file(_scenario(), _scenario()))
scenario_row("duplicate queue name", "queues.1.name", _in_file(_scenario(queues=[
    {"name": "q", "gpu": {"quota": 1}}, {"name": "q", "gpu": {"quota": 2}}])))
scenario_row("duplicate job name", "jobs.1.name", _in_file(_scenario(jobs=[_job(), _job()])))
scenario_row("duplicate node name", "nodes.1.name",
             _in_file(_scenario(nodes=[{"name": "n0", "gpus": 2}, {"name": "n0", "gpus": 8}])))
scenario_row("duplicate pod name", "jobs.0.tasks.1.name", _in_file(_scenario(jobs=[
    _job(tasks=[{"name": "p"}, {"name": "p"}])])))
scenario_row("duplicate subgroup", "jobs.0.subgroups.1.name", _in_file(_scenario(jobs=[
    _job(subgroups=[{"name": "a", "min_member": 1}, {"name": "a", "min_member": 1}])])))
scenario_row("gpu quota below -1", "queues.0.gpu.quota", _quota(quota=-2))
scenario_row("gpu limit -0.5", "queues.0.gpu.limit", _quota(limit=-0.5))
scenario_row("negative weight", "queues.0.gpu.weight", _quota(weight=-3))
scenario_row("NaN quota", "queues.0.gpu.quota", _quota(quota=math.nan))
scenario_row("infinite limit", "queues.0.gpu.limit", _quota(limit=math.inf))
scenario_row("quota as a string", "queues.0.gpu.quota", _quota(quota="5"))
scenario_row("queue priority true", "queues.0.priority",
             _in_file(_scenario(queues=[{"name": "q", "priority": True}])))
scenario_row("negative node GPUs", "nodes.0.gpus", _in_file(_scenario(nodes=[
    {"name": "n0", "gpus": -1}])))
scenario_row("fractional node GPUs", "nodes.0.gpus", _in_file(_scenario(nodes=[
    {"name": "n0", "gpus": 1.5}])))
scenario_row("node GPU memory 0", "nodes.0.gpu_memory_mib", _in_file(_scenario(nodes=[
    {"name": "n0", "gpus": 1, "gpu_memory_mib": 0}])))
scenario_row("gpu_fraction 1.5", "jobs.0.per_task.gpu_fraction", _request(gpu_fraction=1.5))
scenario_row("gpu_fraction NaN", "jobs.0.per_task.gpu_fraction", _request(gpu_fraction=math.nan))
scenario_row("gpu_fraction 0", "jobs.0.per_task.gpu_fraction", _request(gpu_fraction=0))
scenario_row("gpu_fraction -0.5", "jobs.0.per_task.gpu_fraction", _request(gpu_fraction=-0.5))
scenario_row("gpu_fraction with whole GPUs", "jobs.0.per_task",
             _request(gpu_fraction=0.5, gpu=1))
scenario_row("gpu_memory_mib -5", "jobs.0.per_task.gpu_memory_mib", _request(gpu_memory_mib=-5))
scenario_row("gpu_fraction_num_devices 0", "jobs.0.per_task.gpu_fraction_num_devices",
             _request(gpu_fraction=0.5, gpu_fraction_num_devices=0))
scenario_row("num devices without a fraction", "jobs.0.tasks.0", _in_file(_scenario(jobs=[
    _job(tasks=[{"gpu_fraction_num_devices": 2}])])))
scenario_row("min_member 0", "jobs.0.min_member", _in_file(_scenario(jobs=[_job(min_member=0)])))
scenario_row("an unknown action", "config.actions.1", _in_file(_scenario(
    config={"actions": ["allocate", "frobnicate"]})))
scenario_row("actions as one string", "config.actions", _in_file(_scenario(
    config={"actions": "allocate"})))
scenario_row("unknown gpu_packing", "config.gpu_packing", _in_file(_scenario(
    config={"gpu_packing": "best"})))
scenario_row("nodeplacement gpu: pack", "config.plugins_only.0", _in_file(_scenario(
    config={"plugins_only": [{"name": "nodeplacement", "args": {"gpu": "pack"}}]})))
scenario_row("a billion rounds", "rounds", _in_file(_scenario(run="full_cycle", rounds=10**9)))
scenario_row("an unknown run", "run", _in_file(_scenario(run="sprint")))
scenario_row("Running without a node", "jobs.0.tasks.0.node", _in_file(_scenario(jobs=[
    _job(tasks=[{"state": "Running"}])])))
scenario_row("an unknown node", "jobs.0.tasks.0.node", _in_file(_scenario(jobs=[
    _job(tasks=[{"state": "Running", "node": "nowhere"}])])))
scenario_row("accepted_gpu_portion not a number", "expect.j.accepted_gpu_portion",
             _in_file(_scenario(expect={"j": {"accepted_gpu_portion": "half"}})))
scenario_row("fairshare_only without total_gpus", "total_gpus", _in_file(_scenario(
    run="fairshare_only", nodes=[], jobs=[], expect={},
    queues=[{"name": "q", "deserved": 1, "weight": 1, "request": 1}])))
scenario_row("stale_since_s NaN", "jobs.0.stale_since_s", _in_file(_scenario(jobs=[
    _job(stale_since_s=math.nan)])))


# ----------------------------------------------------------------------------- config file


def _load_config(tmp: Path, text: str | bytes) -> str:
    path = tmp / "config.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    try:
        config_file.load(str(path)).check()
    except SystemExit as e:
        assert isinstance(e.code, str), f"SystemExit({e.code!r}) says nothing"
        assert e.code.startswith(f"{path}: "), f"the message names no file: {e.code}"
        return e.code
    raise Accepted(f"{text!r} loaded")


def config_row(case: str, field: str, text: str | bytes) -> None:
    row("config", case, field)(lambda tmp: _load_config(tmp, text))


config_row("cyclePeriodSeconds 0 (a busy loop)", "cyclePeriodSeconds", "cyclePeriodSeconds: 0")
config_row("cyclePeriodSeconds -1", "cyclePeriodSeconds", "cyclePeriodSeconds: -1")
config_row("cyclePeriodSeconds NaN", "cyclePeriodSeconds", "cyclePeriodSeconds: .nan")
config_row("cyclePeriodSeconds a day", "cyclePeriodSeconds", "cyclePeriodSeconds: 86400")
config_row("cyclePeriodSeconds as a string", "cyclePeriodSeconds", "cyclePeriodSeconds: '3'")
config_row("cyclePeriodSeconds empty", "cyclePeriodSeconds", "cyclePeriodSeconds:")
config_row("actions: allocate (a string)", "actions", "actions: allocate")
config_row("an unknown action", "actions.1", "actions: [allocate, frobnicate]")
config_row("no actions", "actions", "actions: []")
config_row("an action twice", "actions", "actions: [allocate, allocate]")
config_row("placement.gpu: pack", "placement.gpu", "placement: {gpu: pack}")
config_row("a typo in placement", "placement.gpuu", "placement: {gpuu: spread}")
config_row("placement a string", "placement", "placement: spread")
config_row("unknown gpuPacking", "gpuPacking", "gpuPacking: best")
config_row("maxConsolidationPreemptees -1", "maxConsolidationPreemptees",
           "maxConsolidationPreemptees: -1")
config_row("maxConsolidationPreemptees 2.5", "maxConsolidationPreemptees",
           "maxConsolidationPreemptees: 2.5")
config_row("stalenessGracePeriodSeconds -5", "stalenessGracePeriodSeconds",
           "stalenessGracePeriodSeconds: -5")
config_row("stalenessGracePeriodSeconds infinite", "stalenessGracePeriodSeconds",
           "stalenessGracePeriodSeconds: .inf")
config_row("qps 0", "clientConnection.qps", "clientConnection: {qps: 0}")
config_row("burst 0 with a limit", "clientConnection.burst", "clientConnection: {burst: 0}")
config_row("timeoutSeconds 0", "clientConnection.timeoutSeconds",
           "clientConnection: {timeoutSeconds: 0}")
config_row("connectTimeoutSeconds NaN", "clientConnection.connectTimeoutSeconds",
           "clientConnection: {connectTimeoutSeconds: .nan}")
config_row("watchTimeoutSeconds -1", "clientConnection.watchTimeoutSeconds",
           "clientConnection: {watchTimeoutSeconds: -1}")
config_row("maxCycleAgeSeconds 0", "health.maxCycleAgeSeconds",
           "health: {maxCycleAgeSeconds: 0}")
config_row("maxCycleAgeSeconds not above the period", "health.maxCycleAgeSeconds",
           "cyclePeriodSeconds: 5\nhealth: {maxCycleAgeSeconds: 5}")
config_row("informer silence below the watch timeout", "health.maxInformerSilenceSeconds",
           "health: {maxInformerSilenceSeconds: 30}")
config_row("a typo in health", "health.maxCycleAge", "health: {maxCycleAge: 30}")
config_row("reservation timeout 0", "reservation.timeoutSeconds",
           "reservation: {timeoutSeconds: 0}")
config_row("reservation image empty", "reservation.image", "reservation: {image: ''}")
config_row("reservation a string", "reservation", "reservation: pause")
config_row("an unknown top-level key", "cyclePeriod", "cyclePeriod: 1")
config_row("a list, not a mapping", "expected a mapping", "- cyclePeriodSeconds: 1")
config_row("not UTF-8", "not UTF-8", b"cyclePeriodSeconds: 1 # \xff\n")
config_row("not YAML", "not valid YAML", "cyclePeriodSeconds: [1\n")


# ------------------------------------------------------------------------------------ CLI


def _cli(tmp: Path, args: list[str]) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env["KUBECONFIG"] = str(tmp / "no-such-kubeconfig")
    try:
        out = subprocess.run([sys.executable, "-m", "kai_ray.cli", *args], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=HANG_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"kai-ray {' '.join(args)}: no answer in {HANG_S}s (a hang)")
    assert "Traceback" not in out.stderr, out.stderr
    if out.returncode == 0:
        raise Accepted(f"kai-ray {' '.join(args)} exited 0")
    assert out.returncode == 2, f"exit status {out.returncode}: {out.stderr}"
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line: {out.stderr}"
    assert lines[0].startswith("kai-ray"), lines[0]
    return lines[0]


def _files(tmp: Path) -> dict[str, str]:
    """Bad files some flags point at."""
    made = {"bad-config": "cyclePeriodSeconds: 0\n", "string-actions": "actions: allocate\n",
            "not-yaml": "x: [\n", "no-context": "apiVersion: v1\nkind: Config\n"}
    for name, text in made.items():
        (tmp / name).write_text(text)
    (tmp / "latin1").write_bytes(b"scenarios:\n- id: caf\xe9\n")
    return {name: str(tmp / name) for name in [*made, "latin1"]}


def cli_row(case: str, field: str, *args: str) -> None:
    def feed(tmp: Path) -> str:
        files = _files(tmp)
        return _cli(tmp, [a.format(tmp=tmp, **files) for a in args])
    row("cli", case, field)(feed)


cli_row("--metrics-port 70000", "--metrics-port", "run", "--metrics-port", "70000")
cli_row("--metrics-port -1", "--metrics-port", "run", "--metrics-port", "-1")
cli_row("--metrics-port abc", "--metrics-port", "run", "--metrics-port", "abc")
cli_row("--health-port 99999", "--health-port", "run", "--health-port", "99999")
cli_row("--webhook-port -5", "--webhook-port", "run", "--webhook-port", "-5")
cli_row("--kubeconfig to a missing file", "--kubeconfig", "run", "--kubeconfig",
        "{tmp}/missing")
cli_row("--kubeconfig not YAML", "--kubeconfig", "run", "--kubeconfig", "{not-yaml}")
cli_row("--kubeconfig without a context", "--kubeconfig", "queues", "--kubeconfig",
        "{no-context}")
cli_row("--config to a missing file", "--config", "run", "--config", "{tmp}/missing.yaml")
cli_row("--config with cyclePeriodSeconds 0", "cyclePeriodSeconds", "run", "--config",
        "{bad-config}")
cli_row("--config with actions: allocate", "actions", "run", "--config", "{string-actions}")
cli_row("--kube-api-qps nan", "--kube-api-qps", "run", "--kube-api-qps", "nan")
cli_row("--kube-api-qps 0", "--kube-api-qps", "run", "--kube-api-qps", "0")
cli_row("--kube-api-burst -1", "--kube-api-burst", "run", "--kube-api-burst", "-1")
cli_row("--lease-name not a name", "--lease-name", "run", "--lease-name", "Bad_Name")
cli_row("--metrics-addr not an address", "--metrics-addr", "run", "--metrics-addr", "a b")
cli_row("simulate a missing file", "file", "simulate", "{tmp}/missing.yaml")
cli_row("simulate a file that is not UTF-8", "latin1: not UTF-8", "simulate", "{latin1}")
cli_row("conformance a directory", "FILE", "conformance", "{tmp}")
cli_row("bench packing --seeds 0", "--seeds", "bench", "packing", "--seeds", "0")
cli_row("bench packing --workers 5", "--workers", "bench", "packing", "--workers", "5")
cli_row("bench packing --trace bogus", "--trace", "bench", "packing", "--trace", "bogus")
cli_row("bench packing --policy bogus", "--policy", "bench", "packing", "--policy", "bogus")
cli_row("bench packing --data-dir missing", "--data-dir", "bench", "packing", "--data-dir",
        "{tmp}/missing")
cli_row("dev-cluster up --nodes -1", "--nodes", "dev-cluster", "up", "--nodes", "-1")
cli_row("snapshot -f in a missing directory", "--file", "snapshot", "-f", "{tmp}/no/x.yaml")
cli_row("explain an empty name", "name", "explain", "")
cli_row("webhook --port 70000", "--port", "webhook", "--port", "70000")
cli_row("webhook --addr not an address", "--addr", "webhook", "--addr", "0.0.0.0:9443")
cli_row("--core bogus", "--core", "demo", "--core", "bogus")


# ---------------------------------------------------------------------------- Queue specs


def _queue(tmp: Path, spec: dict[str, Any]) -> str:
    got = convert.queue_from({"metadata": {"name": "team", "uid": "u1"}, "spec": spec})
    if not isinstance(got, convert.Problem):
        raise Accepted(f"Queue spec {spec!r} read as {got}")
    return str(got)


def queue_row(case: str, field: str, spec: dict[str, Any]) -> None:
    row("queue", case, field)(lambda tmp: _queue(tmp, spec))


def _gpu(**values: Any) -> dict[str, Any]:
    return {"resources": {"gpu": {"quota": 1, "limit": -1, "overQuotaWeight": 1, **values}}}


queue_row("quota a string", "spec.resources.gpu.quota", _gpu(quota="lots"))
queue_row("quota NaN", "spec.resources.gpu.quota", _gpu(quota=math.nan))
queue_row("quota infinite", "spec.resources.gpu.quota", _gpu(quota=math.inf))
queue_row("quota -2", "spec.resources.gpu.quota", _gpu(quota=-2))
queue_row("limit -0.5", "spec.resources.gpu.limit", _gpu(limit=-0.5))
queue_row("limit -5", "spec.resources.gpu.limit", _gpu(limit=-5))
queue_row("overQuotaWeight -1", "spec.resources.gpu.overQuotaWeight", _gpu(overQuotaWeight=-1))
queue_row("overQuotaWeight NaN", "spec.resources.gpu.overQuotaWeight",
          _gpu(overQuotaWeight=math.nan))
queue_row("overQuotaWeight true", "spec.resources.gpu.overQuotaWeight",
          _gpu(overQuotaWeight=True))
queue_row("priority true", "spec.priority", {"priority": True})
queue_row("priority a string", "spec.priority", {"priority": "high"})
queue_row("priority 1.5", "spec.priority", {"priority": 1.5})
queue_row("preemptMinRuntime soon", "spec.preemptMinRuntime", {"preemptMinRuntime": "soon"})
queue_row("reclaimMinRuntime negative", "spec.reclaimMinRuntime", {"reclaimMinRuntime": "-5m"})
queue_row("reclaimMinRuntime a bare number", "spec.reclaimMinRuntime",
          {"reclaimMinRuntime": 30})
queue_row("resources a list", "spec.resources", {"resources": [1, 2]})
queue_row("gpu a string", "spec.resources.gpu", {"resources": {"gpu": "x"}})
queue_row("parentQueue a number", "spec.parentQueue", {"parentQueue": 5})


# -------------------------------------------------------- labels and annotations (converters)


def _pod(annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
         limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u",
                         "annotations": annotations or {}, "labels": labels or {}},
            "spec": {"schedulerName": "kai-scheduler", "containers": [
                {"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                            "limits": limits or {}}}]},
            "status": {"phase": "Pending"}}


def _invalid(call: Callable[[], object]) -> str:
    try:
        got = call()
    except convert.InvalidField as e:
        return e.field + ": " + e.message
    raise Accepted(f"read as {got!r}")


def label_row(case: str, field: str, call: Callable[[], object]) -> None:
    row("labels-annotations", case, field)(lambda tmp: _invalid(call))


def _node(labels: dict[str, str] | None = None, **alloc: str) -> dict[str, Any]:
    return {"metadata": {"name": "n", "uid": "u", "labels": labels or {}},
            "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "4",
                                       **alloc},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def _podgroup(spec: dict[str, Any], annotations: dict[str, str] | None = None
              ) -> dict[str, Any]:
    return {"metadata": {"name": "pg", "namespace": "ns", "annotations": annotations or {}},
            "spec": {"queue": "q", **spec}}


def _job_from(spec: dict[str, Any], annotations: dict[str, str] | None = None) -> object:
    return convert.job_from(_podgroup(spec, annotations), [_pod()], {}, None)


PRIORITY = "metadata.labels[kai.scheduler/task-priority]"
MEMORY_LABEL = "metadata.labels[nvidia.com/gpu.memory]"
for value in ("high", "1.5", ""):
    label_row(f"task-priority {value!r}", PRIORITY, lambda v=value: convert.pod_from(
        _pod(labels={"kai.scheduler/task-priority": v})))
for value in ("abc", "-5", "0", "1.5", "80 GiB"):
    label_row(f"gpu.memory label {value!r}", MEMORY_LABEL,
              lambda v=value: convert.node_from(_node({"nvidia.com/gpu.memory": v})))
label_row("allocatable GPUs -1", "status.allocatable[nvidia.com/gpu]",
          lambda: convert.node_from(_node(**{"nvidia.com/gpu": "-1"})))
label_row("allocatable cpu lots", "status.allocatable[cpu]",
          lambda: convert.node_from(_node(cpu="lots")))
for value in (0, -1, 2.5, "3", True):
    label_row(f"minMember {value!r}", "spec.minMember",
              lambda v=value: _job_from({"minMember": v}))
label_row("subGroup minMember 0", "spec.subGroups[0].minMember",
          lambda: _job_from({"subGroups": [{"name": "a", "minMember": 0}]}))
label_row("subGroup without a name", "spec.subGroups[0].name",
          lambda: _job_from({"subGroups": [{"minMember": 1}]}))
label_row("subGroup named twice", "spec.subGroups[1].name",
          lambda: _job_from({"subGroups": [{"name": "a"}, {"name": "a"}]}))
label_row("preemptibility sometimes", "spec.preemptibility",
          lambda: _job_from({"preemptibility": "sometimes"}))
label_row("stale timestamp not a time", "stale-podgroup-timestamp",
          lambda: _job_from({}, {"kai.scheduler/stale-podgroup-timestamp": "yesterday"}))


def _kept_node_reports_label(tmp: Path) -> str:
    """With a problems list the node stays (whole GPUs still schedule) and the label is
    reported; its memory is unknown, never the made-up 100 MiB."""
    problems: list[convert.Problem] = []
    node = convert.node_from(_node({"nvidia.com/gpu.memory": "-5"}), problems)
    assert node.gpus == 4 and not node.gpu_memory_synced
    if not problems:
        raise Accepted("a bad gpu.memory label reported nothing")
    return str(problems[0])


row("labels-annotations", "gpu.memory label '-5', node kept", MEMORY_LABEL)(
    _kept_node_reports_label)


# ------------------------------------------------------------------ the Ray helper's env


def _env(tmp: Path, env: dict[str, str]) -> str:
    try:
        got = parse_pod_env(env)
    except GpuEnvError as e:
        return str(e)
    raise Accepted(f"{env} read as {got}")


def env_row(variable: str, value: str) -> None:
    row("ray-env", f"{variable}={value}", variable)(lambda tmp: _env(tmp, {variable: value}))


for value in ("abc", "1.5", "nan", "inf", "-1", "0"):
    env_row("GPU_PORTION", value)
for value in ("1.5", "-1"):
    env_row("RUNAI_NUM_OF_GPUS", value)
for value in ("-5", "1.5", "abc", "0"):
    env_row("KAI_RAY_GPU_MEMORY_LIMIT_MIB", value)
env_row("KAI_RAY_GPU_MEMORY_MIB", "0")
env_row("KAI_RAY_GPU_MEMORY_MIB", "lots")
env_row("KAI_RAY_GPU_HEADROOM_MIB", "-1")
env_row("KAI_RAY_GPU_CAP", "maybe")
env_row("KAI_RAY_MPS_LIMIT", "x")
env_row("KAI_RAY_NVML", "on")


# ------------------------------------------------- pod requests: GPU-sharing annotations (last)


def request_row(case: str, field: str, annotations: dict[str, str],
                limits: dict[str, str] | None = None) -> None:
    pod = _pod(annotations, limits=limits)
    row("pod-request", case, field)(lambda tmp: _invalid(lambda: convert.pod_request(pod)))


for value in ("abc", "1.5", "nan", "inf", "-0.5", "0", "1", ""):
    request_row(f"gpu-fraction {value!r}", "gpu-fraction", {"gpu-fraction": value})
for value in ("-5", "0", "abc", "1.5"):
    request_row(f"gpu-memory {value!r}", "gpu-memory", {"gpu-memory": value})
for value in ("0", "-1", "abc"):
    request_row(f"gpu-fraction-num-devices {value!r}", "gpu-fraction-num-devices",
                {"gpu-fraction": "0.5", "gpu-fraction-num-devices": value})
request_row("gpu-fraction and gpu-memory", "gpu-memory",
            {"gpu-fraction": "0.5", "gpu-memory": "1000"})
request_row("gpu-fraction with a whole-GPU limit", "gpu-fraction", {"gpu-fraction": "0.5"},
            limits={"nvidia.com/gpu": "1"})
row("pod-request", "a request that is not a quantity",
    "spec.containers[0].resources.requests[cpu]")(lambda tmp: _invalid(
        lambda: convert.pod_request({**_pod(), "spec": {"containers": [
            {"name": "c", "resources": {"requests": {"cpu": "lots"}}}]}})))


# ---------------------------------------------------------------------------------- the test

_ORDER = ["scenario", "config", "cli", "queue", "labels-annotations", "ray-env", "pod-request"]
ROWS.sort(key=lambda r: _ORDER.index(r.category))  # pod-request last, as the docstring says
OUTCOMES: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)


def _within(seconds: float, feed: Callable[[], str]) -> str:
    """`feed()`, failing the test if it has not returned after `seconds` (a hang)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = feed()
        except BaseException as e:  # the caller judges every outcome
            box["error"] = e

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        pytest.fail(f"no answer in {seconds}s (a hang)")
    if "error" in box:
        raise box["error"]
    return str(box["value"])


@pytest.mark.parametrize("case", ROWS, ids=[r.id for r in ROWS])
def test_bad_input_is_refused_naming_the_field(case: Row, tmp_path: Path) -> None:
    try:
        message = _within(HANG_S, lambda: case.feed(tmp_path))
    except Accepted as e:
        OUTCOMES[case.category]["silently wrong"] += 1
        pytest.fail(f"silently wrong: {e}")
    except (AssertionError, pytest.fail.Exception):
        OUTCOMES[case.category]["failed"] += 1
        raise
    except Exception as e:
        OUTCOMES[case.category]["traceback"] += 1
        pytest.fail(f"traceback: {type(e).__name__}: {e}")
    assert "\n" not in message.strip(), f"more than one line: {message}"
    if case.field not in message:
        OUTCOMES[case.category]["field not named"] += 1
    assert case.field in message, f"{message!r} does not name {case.field!r}"
    OUTCOMES[case.category]["refused, naming the field"] += 1


def test_row_counts() -> None:
    counts = collections.Counter(r.category for r in ROWS)
    print("\nbad-input rows:", dict(counts), "total", sum(counts.values()))
    print("outcomes of the rows run in this session:",
          {c: dict(o) for c, o in OUTCOMES.items()})
    assert sum(counts.values()) >= 100
    assert set(counts) == set(_ORDER)
    assert len({r.id for r in ROWS}) == len(ROWS), "two rows with one name"


# ------------------------------------------------------------ good input is still accepted

SCENARIO_FILES = sorted({*ROOT.glob("kai_ray/sim/data/*.yaml"),
                         *ROOT.glob("tests/scenarios/*.yaml"),
                         *ROOT.glob("benchmarks/data/**/*.yaml")})


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=[str(p.relative_to(ROOT))
                                                      for p in SCENARIO_FILES])
def test_every_scenario_file_in_the_repo_loads(path: Path) -> None:
    assert scenario_mod.load(path)


def test_the_chart_s_config_and_an_empty_file_load(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    config_file.load(str(empty)).check()
    full = tmp_path / "full.yaml"
    full.write_text("cyclePeriodSeconds: 2\nplacement: {gpu: spread, cpu: binpack}\n"
                    "gpuPacking: lookahead\nstalenessGracePeriodSeconds: 0\n"
                    "maxConsolidationPreemptees: 0\nactions: [allocate, reclaim]\n"
                    "clientConnection: {qps: -1, burst: 0, timeoutSeconds: 10,\n"
                    "  connectTimeoutSeconds: 2, watchTimeoutSeconds: 30}\n"
                    "health: {maxCycleAgeSeconds: 30, maxInformerSilenceSeconds: 90}\n"
                    "reservation: {image: 'r:1', serviceAccountName: r, timeoutSeconds: 60}\n")
    config_file.load(str(full)).check()
