"""Leader fencing and bind transactions under chaos (issue 20), a short run of the harness in
kai_ray/testing/chaos.py: two `kai-ray run` replicas with leader election on, gangs binding
under contention (more GPUs asked for than exist), the leader SIGKILLed, SIGTERMed and frozen
(SIGSTOP past its lease, then SIGCONT) just after its binds begin, then a rolling restart (a new
replica up, SIGTERM to the old leader). Checked from the pods throughout: no node's GPUs or
shared device over-committed, no gang partly bound past the bind deadline, and a leader binds
again after each action. The long run is `python3 -m kai_ray.testing.chaos` (see its --help).

Runs on a control plane of its own: the session's shared scheduler must not bind these pods."""

from __future__ import annotations

import pytest

from kai_ray.testing.chaos import ACTIONS, Chaos, ChaosConfig
from kai_ray.testing.plane import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_leader_chaos_keeps_the_invariants(plane: ControlPlane, tmp_path) -> None:
    cfg = ChaosConfig(gangs=20, nodes=8, gpus_per_node=8,  # 80 whole GPUs asked, 64 exist
                      fraction_pods=4, churn=4, actions=ACTIONS, cycle=True,
                      mid_bind_share=1.0, seed=20)
    chaos = Chaos(plane.kubeconfig, tmp_path, cfg)
    try:
        summary = chaos.run(rounds=len(ACTIONS), rolling=1)
    finally:
        chaos.close()
    rounds = summary["round_results"]
    detail = "\n".join(f"{r['mode']} {r['round']} {r['action']} at {r['moment']}: takeover "
                       f"{r['takeover_s']}, violations {r['violations']}, notes {r['notes']}"
                       for r in rounds)
    assert summary["kills"] == {"SIGKILL": 1, "SIGTERM": 2, "SIGSTOP": 1}, detail
    assert not summary["violations"], (
        "invariants broken:\n" + "\n".join(summary["violations"]) + f"\n(logs in {tmp_path})")
    # after every action some replica led and bound again
    assert not summary["takeover_failures"], "\n".join(summary["takeover_failures"])
    assert all(r["takeover_s"] is not None for r in rounds), detail
    assert summary["final"]["partial"] == 0, summary["final"]
