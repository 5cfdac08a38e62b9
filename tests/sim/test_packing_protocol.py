"""FGD protocol on a slice of the real openb trace (the gzipped copy in benchmarks/data/openb)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from kai_ray.sim.packing import protocol, trace


@pytest.fixture(scope="module")
def small() -> tuple[trace.Cluster, trace.PodList, object]:
    d = trace.data_dir()
    full = trace.load_cluster(d)
    cluster = full.subset(np.arange(0, len(full.names), 10))  # 122 nodes of every kind
    pods = trace.load_pods(d, "default")
    return cluster, pods, trace.typical_shapes(pods, cluster.models)


def test_trace_files_load_as_documented() -> None:
    d = trace.data_dir()
    cluster = trace.load_cluster(d)
    assert len(cluster.names) == 1213 and int(cluster.gpus.sum()) == 6212
    assert cluster.names == sorted(cluster.names)
    pods = trace.load_pods(d, "default")
    assert len(pods) == 8152
    assert int(pods.total_milli.sum()) == 6_086_800
    multi = trace.load_pods(d, "multigpu50")  # 5-column file, no gpu_spec
    assert set(multi.spec) == {""} and int((multi.num_gpu == 8).sum()) > 0
    spec = trace.load_pods(d, "gpuspec33")
    masks = [trace.spec_mask(s, cluster.models) for s in spec.spec if s]
    assert masks and all(m is not None and m.any() for m in masks)


def test_typical_shapes_cover_the_popularity_threshold(small: tuple) -> None:
    _, pods, shapes = small
    chosen = set(zip(shapes.cpu_milli.tolist(), shapes.gpu_milli.tolist(),
                     shapes.num_gpu.tolist(), strict=True))
    covered = sum((int(c), int(m), int(n)) in chosen
                  for c, m, n in zip(pods.cpu, pods.gpu_milli, pods.num_gpu, strict=True))
    assert covered >= 0.95 * len(pods)
    assert shapes.weight.sum() == pytest.approx(1.0)
    assert (np.diff(shapes.weight) <= 1e-12).all()  # most popular first
    assert (shapes.gpu_milli == 0).any()  # CPU-only pods are typical shapes too (FGD)


def test_workload_is_shuffled_trace_then_resampled_to_130_percent(small: tuple) -> None:
    cluster, pods, _ = small
    cap = cluster.gpu_capacity_milli
    order = protocol.build_workload(pods, cap, seed=42)
    demand = int(pods.total_milli[order].sum())
    assert 1.3 * cap - 8000 <= demand <= 1.3 * cap
    # the subset is smaller than the trace, so the shuffle is pruned down to 130 %
    assert len(set(order.tolist())) == len(order)
    assert (protocol.build_workload(pods, cap, seed=42) == order).all()
    assert protocol.build_workload(pods, cap, seed=43).tolist() != order.tolist()
    full = trace.load_cluster(trace.data_dir())
    grown = protocol.build_workload(pods, full.gpu_capacity_milli, seed=42)
    assert sorted(grown[: len(pods)].tolist()) == list(range(len(pods)))  # originals first
    assert len(grown) > len(pods)


@pytest.mark.parametrize("policy", protocol.SIM_POLICIES)
def test_arrival_only_replay_is_consistent(small: tuple, policy: str) -> None:
    cluster, pods, shapes = small
    r = protocol.run(cluster, pods, policy, 42, shapes)
    assert (np.diff(r.arrived) >= 0).all() and (np.diff(r.allocated) >= 0).all()
    assert (r.allocated <= r.arrived).all() and r.allocated[-1] <= r.capacity_milli
    assert r.arrived[-1] >= 1.29 * r.capacity_milli - 8000
    assert r.failed > 0 and r.placed + r.failed == len(r.arrived)
    curve = r.curve()
    # unallocated = 100 - allocated % of capacity: at half load everything still fits
    assert curve[50] == pytest.approx(50.0, abs=0.5)
    assert 0.0 < curve[130] < 40.0
    assert 0.0 <= r.curve("frag_ratio")[80] <= 100.0
    assert (r.frag >= -1e-6).all()


def test_fragmentation_aware_policies_beat_random_on_the_slice(small: tuple) -> None:
    cluster, pods, shapes = small
    at100 = {p: protocol.run(cluster, pods, p, 42, shapes).curve()[100]
             for p in ("random", "best_fit", "fgd", "lookahead")}
    assert at100["best_fit"] < at100["random"]
    assert at100["fgd"] < at100["random"] and at100["lookahead"] < at100["random"]


def test_bench_cli_json_and_table(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    from kai_ray.sim.packing_cli import cmd_bench_packing

    args = argparse.Namespace(trace="default", seeds=1, policy=["best_fit"], data_dir=None,
                              plot=None, output="json", workers=1, save=None)
    assert cmd_bench_packing(args) == 0
    out = json.loads(capsys.readouterr().out)
    cell = out["best_fit"]["default"]
    assert len(cell["seeds"]) == 1 and cell["median"] == cell["seeds"][0]
    # the protocol reproduces the paper's Best-fit (7.09 %) within a point
    assert abs(cell["median"] - 7.09) < 1.0
    args.output, args.policy = "table", ["random"]
    pytest.importorskip("matplotlib")
    args.plot = str(tmp_path / "curves.png")
    assert cmd_bench_packing(args) == 0
    text = capsys.readouterr().out
    assert "random" in text and "13.75" in text  # published Random median shown alongside
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_unknown_policy_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    from kai_ray.sim.packing_cli import cmd_bench_packing

    args = argparse.Namespace(trace="default", seeds=1, policy=["nope"], data_dir=None,
                              plot=None, output="json", workers=1, save=None)
    assert cmd_bench_packing(args) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err


def test_saved_runs_merge_into_one_table(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    from kai_ray.sim.packing_cli import cmd_bench_packing, merge_main

    saved = []
    for policy in ("best_fit", "random"):
        path = tmp_path / f"{policy}.json"
        args = argparse.Namespace(trace="default", seeds=1, policy=[policy], data_dir=None,
                                  plot=None, output="json", workers=1, save=str(path))
        assert cmd_bench_packing(args) == 0
        saved.append(str(path))
    capsys.readouterr()
    merged = tmp_path / "all.json"
    assert merge_main([*saved, "--save", str(merged)]) == 0
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln.startswith("default")]
    assert [r[1] for r in rows] == ["random", "best_fit"]
    assert rows[1][4] == "7.09" and float(rows[0][2]) > float(rows[1][2])
    assert len(json.loads(merged.read_text())) == 2
    (tmp_path / "bad.json").write_text('{"not": "runs"}')
    assert merge_main([str(tmp_path / "bad.json")]) == 2
    assert "not a list of runs" in capsys.readouterr().err
