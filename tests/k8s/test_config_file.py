"""The config file's model: the committed JSON schema is the model's, the names it lists are
the core's, and every section reaches its reader (bad values: tests/test_bad_input.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_args

import pytest

from kai_ray.controller.health import HealthConfig
from kai_ray.core.model import SchedulerConfig
from kai_ray.core.packing import POLICIES
from kai_ray.k8s import config_file
from kai_ray.k8s.ratelimit import DEFAULT_TIMEOUT

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "charts" / "kai-ray" / "config.schema.json"


def test_the_committed_schema_is_the_model_s() -> None:
    """Regenerate with `python3 -m kai_ray.k8s.config_file --schema > <file>`."""
    assert json.loads(SCHEMA.read_text()) == config_file.json_schema(), \
        f"{SCHEMA.relative_to(ROOT)} is stale: python3 -m kai_ray.k8s.config_file --schema"


def test_the_names_it_accepts_are_the_core_s() -> None:
    from kai_ray.sim import scenario  # the scenario format's config names the same actions

    assert get_args(config_file.Action) == SchedulerConfig().actions
    assert get_args(scenario.Action) == SchedulerConfig().actions
    assert set(get_args(config_file.GpuPacking)) == set(POLICIES)


def test_no_file_and_an_empty_file_are_every_default(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing set\n")
    for path in (None, str(empty)):
        file = config_file.load(path)
        assert file.scheduler() == (SchedulerConfig(), config_file.DEFAULT_PERIOD_S)
        assert file.client_connection() == config_file.ClientConnection(50, 100)
        timeouts = file.api_timeouts()
        assert (timeouts.connect_s, timeouts.request_s) == DEFAULT_TIMEOUT
        assert timeouts.watch_s == 60
        health = file.health()
        assert (health.max_cycle_age_s, health.max_informer_silence_s) == \
            (HealthConfig().max_cycle_age_s, HealthConfig().max_informer_silence_s)


def test_every_section_reaches_its_reader(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("cyclePeriodSeconds: 2.5\nplacement: {gpu: spread}\ngpuPacking: fgd\n"
                   "stalenessGracePeriodSeconds: 0\nmaxConsolidationPreemptees: 0\n"
                   "actions: [reclaim, allocate]\n"
                   "clientConnection: {qps: 10, burst: 20, timeoutSeconds: 12,\n"
                   "  connectTimeoutSeconds: 1.5, watchTimeoutSeconds: 45}\n"
                   "health: {maxCycleAgeSeconds: 20, maxInformerSilenceSeconds: 50}\n"
                   "reservation: {image: ' r:2 ', serviceAccountName: sa, timeoutSeconds: 9,\n"
                   "  namespace: gpu-holders}\n")
    file = config_file.load(str(cfg))
    core, period = file.scheduler()
    assert period == 2.5
    assert (core.placement.gpu, core.placement.cpu, core.gpu_packing) == ("spread", "binpack",
                                                                          "fgd")
    assert (core.staleness_grace_period_s, core.max_consolidation_preemptees) == (0.0, 0)
    assert core.actions == ("reclaim", "allocate")
    assert file.client_connection() == config_file.ClientConnection(10, 20)
    assert file.api_timeouts() == config_file.ApiTimeouts(connect_s=1.5, request_s=12,
                                                          watch_s=45)
    assert file.health() == config_file.HealthSettings(20, 50)
    binder = file.binder()
    assert (binder.reservation_image, binder.reservation_service_account,
            binder.reservation_timeout_s, binder.reservation_namespace) == (
        "r:2", "sa", 9.0, "gpu-holders")
    assert config_file.load(None).binder().reservation_namespace == "kai-resource-reservation"


def test_a_section_with_nothing_under_it_is_its_defaults(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("placement:\nclientConnection:\nhealth:\nreservation:\n")
    config_file.load(str(cfg)).check()


def test_one_bad_section_does_not_stop_a_reader_of_another(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("health: {maxCycleAgeSeconds: -1}\n")
    file = config_file.load(str(cfg))
    file.scheduler()
    file.binder()
    with pytest.raises(SystemExit, match=r"health\.maxCycleAgeSeconds: expected a number > 0"):
        file.health()


@pytest.mark.parametrize("bad", ["Upper", "-lead", "a_b", "x" * 64, "''"])
def test_the_reservation_namespace_is_a_namespace_name(tmp_path: Path, bad: str) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"reservation: {{namespace: {bad}}}\n")
    with pytest.raises(SystemExit, match=r"reservation\.namespace: expected"):
        config_file.load(str(cfg)).binder()


def test_errors_are_one_line_naming_file_key_and_value(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("clientConnection: {watchTimeoutSeconds: .inf}\n")
    with pytest.raises(SystemExit) as e:
        config_file.load(str(cfg)).api_timeouts()
    assert str(e.value) == (f"{cfg}: clientConnection.watchTimeoutSeconds: expected a number "
                            ">= 1 and <= 3600, got inf")


def test_the_module_prints_the_schema_and_checks_a_file(tmp_path: Path, capsys) -> None:
    assert config_file.main(["--schema"]) == 0
    assert json.loads(capsys.readouterr().out) == config_file.json_schema()
    cfg = tmp_path / "config.yaml"
    cfg.write_text("cyclePeriodSeconds: 3\n")
    assert config_file.main([str(cfg)]) == 0
    cfg.write_text("cyclePeriodSeconds: 0\n")
    with pytest.raises(SystemExit, match="cyclePeriodSeconds"):
        config_file.main([str(cfg)])
