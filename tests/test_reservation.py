"""The reservation pod's program: which device it reports, and how it fails (no cluster; the
report on a real API server is in tests/integration/test_gpu_reservation.py)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kai_ray import reservation
from kai_ray.reservation import ReservationError, discover

UUID_A = "GPU-0b1c2d3e-aaaa-bbbb-cccc-000000000001"
UUID_B = "GPU-0b1c2d3e-aaaa-bbbb-cccc-000000000002"


def test_the_device_plugins_uuid_without_a_driver() -> None:
    assert discover(UUID_A, None) == UUID_A
    assert discover(f" {UUID_A} ", None) == UUID_A
    assert discover("MIG-4f6c1e2a-0000-1111-2222-333344445555", None).startswith("MIG-")


def test_nvml_wins_when_the_container_sees_one_device() -> None:
    # NVIDIA's plugin may hand out indices; NVML in the container then shows the device's UUID
    assert discover("3", [UUID_B]) == UUID_B
    assert discover(None, [UUID_A]) == UUID_A


def test_nvml_with_several_devices_picks_the_one_named() -> None:
    assert discover(UUID_B, [UUID_A, UUID_B]) == UUID_B
    assert discover("1", [UUID_A, UUID_B]) == UUID_B
    with pytest.raises(ReservationError, match="NVML lists 2 GPUs"):
        discover("all", [UUID_A, UUID_B])
    with pytest.raises(ReservationError, match="cannot tell"):
        discover("GPU-not-there", [UUID_A, UUID_B])


@pytest.mark.parametrize("value", [None, "", "void", "none", "NONE", "all"])
def test_no_device_given_is_an_error_not_a_default(value: str | None) -> None:
    with pytest.raises(ReservationError, match="NVIDIA_VISIBLE_DEVICES"):
        discover(value, None)


def test_an_index_without_a_driver_is_an_error() -> None:
    with pytest.raises(ReservationError, match="an index, not a GPU UUID"):
        discover("0", None)


def test_more_than_one_device_is_an_error() -> None:
    with pytest.raises(ReservationError, match="names 2 devices"):
        discover(f"{UUID_A},{UUID_B}", None)


def test_main_discover_prints_the_device(capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reservation, "nvml_uuids", lambda: None)
    assert reservation.main(["--discover"], env={"NVIDIA_VISIBLE_DEVICES": UUID_A}) == 0
    assert capsys.readouterr().out.strip() == UUID_A


def test_main_writes_the_failure_where_the_kubelet_reads_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reservation, "nvml_uuids", lambda: None)
    log = tmp_path / "termination-log"
    env = {"NVIDIA_VISIBLE_DEVICES": UUID_A, "KAI_RAY_TERMINATION_LOG": str(log)}
    assert reservation.main(["--once"], env=env) == 1  # not in a pod: no API server
    assert "KUBERNETES_SERVICE_HOST" in log.read_text()
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KAI_RAY_SA_DIR": str(tmp_path / "none"),
           "NVIDIA_VISIBLE_DEVICES": UUID_A, "KAI_RAY_TERMINATION_LOG": str(log)}
    assert reservation.main(["--once"], env=env) == 1
    assert "no ServiceAccount credentials" in log.read_text()


def test_nvml_lists_devices_only_where_a_driver_is() -> None:
    """Without a driver NVML must say so (None), not invent devices; with one (the GPU check
    script), it lists real UUIDs."""
    uuids = reservation.nvml_uuids()
    if not Path("/dev/nvidiactl").exists() or importlib.util.find_spec("pynvml") is None:
        assert uuids is None
    else:
        assert uuids and all(u.startswith(("GPU-", "MIG-")) for u in uuids)


def test_a_mig_instance_is_reported_as_given() -> None:
    mig = "MIG-4f6c1e2a-0000-1111-2222-333344445555"
    assert discover(mig, [UUID_A]) == mig  # NVML lists the parent GPU


def test_all_devices_without_a_driver_says_so() -> None:
    with pytest.raises(ReservationError, match="to tell which GPU"):
        discover("all", None)


def test_sigterm_ends_it_while_it_still_retries(tmp_path: Path) -> None:
    """The pod deleted while the API server cannot be reached: the program ends at once (a
    PID 1 that ignored SIGTERM would be killed only after the grace period)."""
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t")
    (sa / "namespace").write_text("kai-resource-reservation")
    import socket

    with socket.socket() as s:  # a port nothing listens on: every attempt is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from kai_ray.testing.pki import write_pki

    pki = write_pki(tmp_path / "pki")
    (sa / "ca.crt").write_bytes(pki.ca_cert.read_bytes())
    env = {**os.environ, "KUBERNETES_SERVICE_HOST": "127.0.0.1",
           "KUBERNETES_SERVICE_PORT": str(port), "KAI_RAY_SA_DIR": str(sa), "POD_NAME": "p",
           "NVIDIA_VISIBLE_DEVICES": UUID_A, "KAI_RAY_TERMINATION_LOG": str(tmp_path / "log")}
    proc = subprocess.Popen([sys.executable, "-m", "kai_ray.reservation"], env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while "retrying" not in (line := proc.stderr.readline() or ""):  # type: ignore[union-attr]
            assert time.monotonic() < deadline and proc.poll() is None, line
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(5) == 0
        assert time.monotonic() - t0 < 2
    finally:
        proc.kill()
