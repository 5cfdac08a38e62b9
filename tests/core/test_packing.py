"""Pure placement policies: feasibility, device choice, scores, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from kai_ray.core import packing as pk


def state(gpu_rows: list[list[int]], cpu: list[int] | None = None,
          mem: list[int] | None = None, model: list[int] | None = None) -> pk.NodeState:
    g = max(len(r) for r in gpu_rows)
    gf = np.array([r + [-1] * (g - len(r)) for r in gpu_rows], dtype=np.int64)
    n = len(gpu_rows)
    return pk.NodeState(
        np.array(cpu or [64_000] * n, dtype=np.int64),
        np.array(mem or [256_000] * n, dtype=np.int64),
        gf,
        np.array(model or [0 if r else -1 for r in gpu_rows], dtype=np.int64),
    )


def shapes(rows: list[tuple[int, int, int, float]], n_models: int = 2) -> pk.ShapeSet:
    """rows: (cpu, num_gpu, gpu_milli, weight)."""
    return pk.ShapeSet(
        cpu_milli=np.array([r[0] for r in rows], dtype=np.int64),
        num_gpu=np.array([r[1] for r in rows], dtype=np.int64),
        gpu_milli=np.array([r[2] for r in rows], dtype=np.int64),
        allowed=np.ones((len(rows), n_models), dtype=np.bool_),
        weight=np.array([r[3] for r in rows], dtype=np.float64),
    )


SHAPES = shapes([(4000, 1, 500, 0.4), (8000, 1, 1000, 0.4), (2000, 0, 0, 0.2)])


def test_fits_checks_cpu_memory_devices_and_model() -> None:
    s = state([[1000, 1000], [300, 600], [1000], []], cpu=[8000, 8000, 1000, 8000],
              model=[0, 0, 1, -1])
    assert pk.fits(s, pk.PodRequest(2000, 100, 1, 500)).tolist() == [True, True, False, False]
    assert pk.fits(s, pk.PodRequest(2000, 100, 2, 1000)).tolist() == [True, False, False, False]
    assert pk.fits(s, pk.PodRequest(2000, 100)).tolist() == [True, True, False, True]
    only1 = np.array([False, True])
    assert pk.fits(s, pk.PodRequest(2000, 100, 1, 100, only1)).tolist() == [False] * 4
    s.cpu_free[2] = 8000
    assert pk.fits(s, pk.PodRequest(2000, 100, 1, 100, only1)).tolist() == [False, False, True,
                                                                               False]
    s.mem_free[0] = 10
    assert not pk.fits(s, pk.PodRequest(500, 100, 1, 100))[0]


@pytest.mark.parametrize("policy", pk.POLICIES)
def test_placements_never_overcommit(policy: str) -> None:
    rng = np.random.default_rng(3)
    s = state([[1000] * 8] * 6 + [[1000] * 2] * 6, cpu=[96_000] * 6 + [32_000] * 6,
              mem=[400_000] * 12)
    placed = 0
    for _ in range(400):
        ng = int(rng.choice([0, 1, 1, 1, 2, 8]))
        milli = int(rng.choice([100, 250, 500, 810, 1000])) if ng == 1 else 1000
        req = pk.PodRequest(int(rng.integers(500, 12_000)), int(rng.integers(100, 30_000)),
                            ng, milli if ng else 0)
        got = pk.place(policy, s, req, SHAPES)
        if got is None:
            assert not pk.fits(s, req).any()
            continue
        node, devs = got
        assert pk.fits(s, req)[node]
        assert len(devs) == req.num_gpu and len(set(devs.tolist())) == req.num_gpu
        pk.apply(s, node, devs, req)
        placed += 1
        assert (s.cpu_free >= 0).all() and (s.mem_free >= 0).all()
        real = s.gpu_free[s.gpu_free != -1]
        assert (real >= 0).all() and (real <= 1000).all()
    assert placed > 50


def test_whole_gpu_requests_take_lowest_free_devices() -> None:
    s = state([[400, 1000, 0, 1000, 1000]])
    for policy in pk.POLICIES:
        devs = pk.choose_devices(policy, s, 0, pk.PodRequest(1, 1, 2, 1000), SHAPES)
        assert devs.tolist() == [1, 3]


@pytest.mark.parametrize("policy", ["best_fit", "packing", "kai"])
def test_shared_request_goes_to_fullest_device_that_fits(policy: str) -> None:
    s = state([[1000, 700, 450, 200, 450]])
    assert pk.choose_devices(policy, s, 0, pk.PodRequest(1, 1, 1, 400)).tolist() == [2]
    assert pk.choose_devices(policy, s, 0, pk.PodRequest(1, 1, 1, 800)).tolist() == [0]
    with pytest.raises(ValueError, match="no device"):
        pk.choose_devices(policy, state([[300]]), 0, pk.PodRequest(1, 1, 1, 400))


def test_packing_scores_follow_the_reference_cases() -> None:
    s = state([[200, 1000, 1000, 500], [1000] * 4, [1000] * 8], cpu=[96_000] * 3)
    two = pk.PodRequest(100, 1, 2, 1000)
    assert pk.score("packing", s, two).tolist() == [48.0, 29.0, 25.0]
    shared = pk.PodRequest(100, 1, 1, 200)
    # tightest device that fits holds 200 free: 100 - (200*100/1000)/10 = 98
    assert pk.score("packing", s, shared)[0] == 98.0
    assert pk.score("packing", s, pk.PodRequest(100, 1))[0] == 0.0


def test_best_fit_prefers_least_left_and_breaks_ties_by_index() -> None:
    s = state([[1000, 1000], [1000, 500], [1000, 500]], cpu=[32_000, 32_000, 32_000])
    req = pk.PodRequest(1000, 1, 1, 500)
    got = pk.place("best_fit", s, req)
    assert got is not None and got[0] == 1 and got[1].tolist() == [1]


def test_kai_prefers_a_shared_device_then_fewest_free_gpus() -> None:
    s = state([[1000, 1000, 1000], [1000, 0, 0], [1000, 1000, 600]])
    got = pk.place("kai", s, pk.PodRequest(100, 1, 1, 500))
    assert got is not None and got[0] == 2 and got[1].tolist() == [2]
    got = pk.place("kai", s, pk.PodRequest(100, 1, 1, 1000))
    assert got is not None and got[0] == 1


def test_frag_amount_matches_hand_computation() -> None:
    # node 0: devices 1000 and 300 free; 500-shape fits (300 is fragment), 1000-shape fits
    # (300 is fragment), CPU shape: all idle counts (FGD) -> 0.4*300 + 0.4*300 + 0.2*1300
    s = state([[1000, 300], [200, 0]], cpu=[64_000, 1000])
    f = pk.frag_amount(s, SHAPES)
    assert f[0] == pytest.approx(0.4 * 300 + 0.4 * 300 + 0.2 * 1300)
    # node 1: too little CPU for both GPU shapes -> all 200 idle milli are fragment
    assert f[1] == pytest.approx(200)


def test_frag_delta_equals_brute_force() -> None:
    rng = np.random.default_rng(11)
    rows = [[int(v) for v in rng.choice([0, 150, 300, 520, 1000], size=4)] for _ in range(30)]
    s = state(rows, cpu=[int(c) for c in rng.integers(0, 20_000, size=30)])
    for req in (pk.PodRequest(3000, 1, 1, 300), pk.PodRequest(3000, 1, 1, 1000),
                pk.PodRequest(1000, 1), pk.PodRequest(2000, 1, 2, 1000)):
        delta = pk.frag_delta(s, req, SHAPES)
        base = pk.frag_amount(s, SHAPES)
        ok = pk.fits(s, req)
        assert np.isinf(delta[~ok]).all()
        for node in np.flatnonzero(ok).tolist():
            best = np.inf
            devices = ([[d] for d in np.flatnonzero(s.gpu_free[node] >= req.gpu_milli)]
                       if req.shared else [pk.choose_devices("fgd", s, node, req, SHAPES)])
            for devs in devices:
                s2 = s.copy()
                pk.apply(s2, int(node), np.array(devs), req)
                best = min(best, pk.frag_amount(s2, SHAPES)[node] - base[node])
            assert delta[node] == pytest.approx(best, abs=1e-6)


def test_fill_delta_equals_brute_force() -> None:
    rng = np.random.default_rng(5)
    rows = [[int(v) for v in rng.choice([0, 150, 300, 520, 1000], size=4)] for _ in range(30)]
    s = state(rows, cpu=[int(c) for c in rng.integers(0, 30_000, size=30)],
              mem=[int(m) for m in rng.integers(0, 60_000, size=30)])
    sh = pk.ShapeSet(SHAPES.cpu_milli, SHAPES.num_gpu, SHAPES.gpu_milli, SHAPES.allowed,
                     SHAPES.weight, memory_mib=np.array([8000, 16000, 4000], dtype=np.int64))
    for req in (pk.PodRequest(3000, 100, 1, 300), pk.PodRequest(3000, 100, 1, 1000),
                pk.PodRequest(1000, 100), pk.PodRequest(2000, 100, 2, 1000)):
        delta = pk.fill_delta(s, req, sh)
        base = pk.fill_waste(s, sh)
        ok = pk.fits(s, req)
        assert np.isinf(delta[~ok]).all()
        for node in np.flatnonzero(ok).tolist():
            best = np.inf
            devices = ([[d] for d in np.flatnonzero(s.gpu_free[node] >= req.gpu_milli)]
                       if req.shared else [pk.choose_devices("lookahead", s, node, req, sh)])
            for devs in devices:
                s2 = s.copy()
                pk.apply(s2, int(node), np.array(devs), req)
                best = min(best, pk.fill_waste(s2, sh)[node] - base[node])
            assert delta[node] == pytest.approx(best, abs=1e-6)


def test_fill_waste_counts_remainders_and_cpu_limits() -> None:
    # one 500-shape (weight 1): a 700 device can take one (200 wasted), CPU for two pods only
    sh = shapes([(4000, 1, 500, 1.0)])
    s = state([[700, 1000, 1000]], cpu=[8000])
    # slots: 1 + 2 + 2 = 5, CPU allows 2 -> usable 1000 of 2700 idle
    assert pk.fill_waste(s, sh)[0] == pytest.approx(1700)
    s.cpu_free[0] = 100_000
    assert pk.fill_waste(s, sh)[0] == pytest.approx(200)


def test_fgd_prefers_the_placement_that_fragments_least() -> None:
    # a 500 pod on a device with 500 free leaves nothing behind; on the empty node it would
    # leave a 500 sliver that a 1000-shape can no longer use
    s = state([[1000, 1000], [500, 0]], cpu=[64_000, 64_000])
    for policy in ("fgd", "lookahead"):
        got = pk.place(policy, s, pk.PodRequest(1000, 1, 1, 500), SHAPES)
        assert got is not None and got[0] == 1 and got[1].tolist() == [0]


@pytest.mark.parametrize("policy", pk.POLICIES)
def test_policies_are_deterministic_and_pure(policy: str) -> None:
    s = state([[1000] * 4, [1000, 500, 0, 300], [1000] * 4])
    before = s.copy()
    req = pk.PodRequest(2000, 100, 1, 300)
    a = pk.place(policy, s, req, SHAPES)
    b = pk.place(policy, s, req, SHAPES)
    assert a is not None and b is not None
    assert a[0] == b[0] and a[1].tolist() == b[1].tolist()
    for name in ("cpu_free", "mem_free", "gpu_free", "model"):
        assert (getattr(s, name) == getattr(before, name)).all()


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="gpu_milli"):
        pk.PodRequest(100, 1, 1, 0)
    with pytest.raises(ValueError, match="gpu_milli"):
        pk.PodRequest(100, 1, 2, 500)
    with pytest.raises(ValueError, match="num_gpu"):
        pk.PodRequest(100, 1, -1, 0)
    with pytest.raises(ValueError, match="unknown placement policy"):
        pk.score("nope", state([[1000]]), pk.PodRequest(1, 1))
    with pytest.raises(ValueError, match="typical shapes"):
        pk.score("fgd", state([[1000]]), pk.PodRequest(1, 1, 1, 500))
    with pytest.raises(ValueError, match="gpu_free"):
        pk.NodeState(np.zeros(2, np.int64), np.zeros(2, np.int64), np.zeros((3, 1), np.int64),
                     np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="weight"):
        shapes([(1, 1, 500, 0.5)])


def test_typical_shapes_take_the_most_popular_until_the_threshold() -> None:
    # 6 pods of A, 3 of B, 1 of C (C differs from A only by its model constraint)
    cpu = np.array([4000] * 6 + [8000] * 3 + [4000], dtype=np.int64)
    ng = np.array([1] * 6 + [0] * 3 + [1], dtype=np.int64)
    milli = np.array([500] * 6 + [0] * 3 + [500], dtype=np.int64)
    allowed = np.ones((10, 2), dtype=np.bool_)
    allowed[9, 1] = False
    sh = pk.typical_shapes(cpu, ng, milli, allowed, threshold=0.9)
    assert sh.cpu_milli.tolist() == [4000, 8000] and sh.gpu_milli.tolist() == [500, 0]
    assert sh.weight.tolist() == pytest.approx([6 / 9, 3 / 9])
    everything = pk.typical_shapes(cpu, ng, milli, allowed, threshold=1.0)
    assert everything.weight.shape == (3,) and everything.allowed[2].tolist() == [True, False]
    with pytest.raises(ValueError, match="at least one pod"):
        pk.typical_shapes(cpu[:0], ng[:0], milli[:0], allowed[:0])


def _brute_leftover(milli: list[int], weight: list[float]) -> list[float]:
    out = [float(f) for f in range(1001)]
    for f in range(1001):
        fit = [(m, w) for m, w in zip(milli, weight, strict=True) if m <= f and w > 0]
        if fit:
            out[f] = sum(w * out[f - m] for m, w in fit) / sum(w for _, w in fit)
    return out


def test_model_pinned_shapes_match_the_per_shape_definitions() -> None:
    # shapes that differ only by their allowed models are merged internally; FGD's fragment and
    # the look-ahead waste must still equal the per-shape, per-node definitions
    rng = np.random.default_rng(11)
    rows = [[int(v) for v in rng.choice([0, 200, 450, 700, 1000], size=4)] for _ in range(25)]
    s = state(rows, cpu=[int(c) for c in rng.integers(0, 40_000, size=25)],
              model=[int(m) for m in rng.integers(-1, 3, size=25)])
    cpu = np.array([4000, 4000, 4000, 9000, 2000, 6000], dtype=np.int64)
    num = np.array([1, 1, 1, 2, 0, 1], dtype=np.int64)
    milli = np.array([450, 450, 450, 1000, 0, 250], dtype=np.int64)
    allowed = np.array([[1, 1, 1], [0, 1, 0], [1, 0, 1], [0, 0, 1], [1, 1, 1], [1, 1, 0]],
                       dtype=np.bool_)
    w = np.array([0.3, 0.15, 0.1, 0.15, 0.2, 0.1])
    sh = pk.ShapeSet(cpu, num, milli, allowed, w)
    frag, waste = pk.frag_amount(s, sh), pk.fill_waste(s, sh)
    for node in range(25):
        free = [f for f in s.gpu_free[node] if f >= 0]
        total, model = float(sum(free)), int(s.model[node])
        ok = [model >= 0 and bool(allowed[k, model]) and milli[k] > 0 for k in range(6)]
        single = [k for k in range(6) if ok[k] and num[k] == 1]
        lo = _brute_leftover([int(milli[k]) for k in single], [float(w[k]) for k in single])
        f_exp = w_exp = 0.0
        for k in range(6):
            fitting = sum(f >= milli[k] for f in free)
            if ok[k] and s.cpu_free[node] >= cpu[k] and fitting >= num[k]:
                f_exp += w[k] * sum(f for f in free if f < milli[k])
            else:
                f_exp += w[k] * total
            pods = int(s.cpu_free[node] // cpu[k]) if ok[k] else 0
            if ok[k] and num[k] > 1:
                pods = min(pods, sum(f >= 1000 for f in free) // int(num[k]))
                usable = min(pods * 1000 * int(num[k]), total)
            elif ok[k]:
                usable = min(pods * int(milli[k]), total - sum(lo[f] for f in free))
            else:
                usable = 0
            w_exp += w[k] * (total - usable)
        assert frag[node] == pytest.approx(f_exp, abs=1e-6)
        assert waste[node] == pytest.approx(w_exp, abs=1e-6)


def test_arrival_weight_spreads_popularity_over_allowed_models_by_supply() -> None:
    # U (unpinned, 0.8) and P (pinned to model 1, 0.2); model 0 has 96 GPUs, model 1 has 4
    sh = pk.ShapeSet(np.array([1000, 2000], dtype=np.int64), np.array([1, 1], dtype=np.int64),
                     np.array([700, 600], dtype=np.int64),
                     np.array([[True, True], [False, True]]), np.array([0.8, 0.2]))
    aw = pk.arrival_weight(sh, np.array([96.0, 4.0]))
    u, p = (int(np.flatnonzero(sh.base.cpu == c)[0]) for c in (1000, 2000))
    # model 0 only ever sees U; its row keeps the popularity total (0.8)
    assert aw[0, u] == pytest.approx(0.8) and aw[0, p] == 0
    # model 1: U arrives 4 % of the time (0.032), P always (0.2); rescaled to total 1.0
    assert aw[1, u] == pytest.approx(0.032 / 0.232) and aw[1, p] == pytest.approx(0.2 / 0.232)
    assert aw[2].tolist() == [0, 0]  # no-model row
    assert sh.arrival_weight(np.array([96.0, 4.0])) is sh.arrival_weight(np.array([96.0, 4.0]))
    with pytest.raises(ValueError, match="supply"):
        pk.arrival_weight(sh, np.array([1.0]))


def test_lookahead_keeps_slivers_usable_for_the_shapes_pinned_to_a_scarce_model() -> None:
    # 24 busy nodes of model 0 (96 GPUs) and two 1-GPU nodes of model 1 (plus 2 busy ones).
    # A 400 pod on node A (700 free) leaves 300: useless to U (700) and to P (600, pinned to
    # model 1); on node B (1000 free) it leaves 600: useless to U only. By global popularity
    # U dominates and FGD picks A; but model-1 nodes mostly receive P pods, so we pick B.
    rows = [[0, 0, 0, 0]] * 24 + [[700], [1000], [0], [0]]
    s = state(rows, model=[0] * 24 + [1] * 4)
    sh = pk.ShapeSet(np.array([1000, 2000], dtype=np.int64), np.array([1, 1], dtype=np.int64),
                     np.array([700, 600], dtype=np.int64),
                     np.array([[True, True], [False, True]]), np.array([0.8, 0.2]))
    assert pk.model_supply(s, sh).tolist() == [96.0, 4.0]
    req = pk.PodRequest(500, 1, 1, 400)
    fgd, ours = pk.place("fgd", s, req, sh), pk.place("lookahead", s, req, sh)
    assert fgd is not None and fgd[0] == 24
    assert ours is not None and ours[0] == 25
