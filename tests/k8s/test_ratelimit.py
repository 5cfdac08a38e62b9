"""The client's rate limit (kube-scheduler's --kube-api-qps/--kube-api-burst): the token bucket
on a fake clock, the limit on real HTTP requests to a local server, and the flags and the config
file reaching the clients `kai-ray run` builds. Also the event writers: asynchronous, every
event written, none twice."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from kubernetes import client

from kai_ray.cli import build_parser
from kai_ray.controller.main import api_clients, client_connection
from kai_ray.k8s import config_file
from kai_ray.k8s.events import EventRecorder
from kai_ray.k8s.ratelimit import RateLimitedApiClient, TokenBucket, bucket
from tests.k8s.local_http import JsonHandler, serving


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_burst_is_free_then_one_token_per_interval() -> None:
    clock = FakeClock()
    tb = TokenBucket(qps=10, burst=3, clock=clock, sleep=clock.sleep)
    assert [tb.take() for _ in range(3)] == [0, 0, 0]
    waits = [tb.take() for _ in range(4)]
    assert waits == pytest.approx([0.1] * 4)
    assert clock.now == pytest.approx(100.4)  # 7 requests: 3 at once, then 10 per second


def test_idle_time_refills_up_to_the_burst_only() -> None:
    clock = FakeClock()
    tb = TokenBucket(qps=10, burst=2, clock=clock, sleep=clock.sleep)
    tb.take(), tb.take()
    clock.now += 60  # a minute idle is worth 2 tokens, not 600
    assert [tb.take() for _ in range(3)] == pytest.approx([0, 0, 0.1])


def test_waiters_hold_their_own_slots() -> None:
    """Reservations queue up: the n-th request past the burst waits n intervals."""
    clock = FakeClock()
    tb = TokenBucket(qps=4, burst=1, clock=clock, sleep=clock.sleep)
    assert [tb.reserve() for _ in range(4)] == pytest.approx([0, 0.25, 0.5, 0.75])


def test_bucket_rules() -> None:
    assert bucket(-1, 0) is None  # client-go: a negative QPS means no limit
    assert bucket(50, 100).qps == 50  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="kube-api-qps"):
        bucket(0, 10)
    with pytest.raises(ValueError, match="kube-api-burst"):
        bucket(5, 0)


class _Counting(JsonHandler):
    hits: ClassVar[list[tuple[str, str, dict]]] = []
    gate: ClassVar[threading.Event] = threading.Event()  # answers wait until it is set

    def answer(self, body: dict) -> tuple[int, bytes]:
        type(self).gate.wait(30)
        type(self).hits.append((self.command, self.path, body))
        return (201 if self.command == "POST" else 200,
                b'{"kind": "Status", "status": "Success"}')


@pytest.fixture
def server() -> Iterator[str]:
    _Counting.hits = []
    _Counting.gate.set()
    with serving(_Counting) as url:
        yield url


def _client(host: str, limiter: TokenBucket | None) -> RateLimitedApiClient:
    cfg = client.Configuration()
    cfg.host = host
    return RateLimitedApiClient(cfg, limiter)


def test_the_limit_holds_on_real_requests(server: str) -> None:
    core = client.CoreV1Api(_client(server, TokenBucket(qps=20, burst=2)))
    t = time.monotonic()
    for _ in range(12):
        core.read_namespace("x", _preload_content=False)
    limited = time.monotonic() - t
    assert len(_Counting.hits) == 12
    assert limited >= 0.45  # 2 free, then 10 at 20 per second

    core = client.CoreV1Api(_client(server, None))
    t = time.monotonic()
    for _ in range(12):
        core.read_namespace("x", _preload_content=False)
    assert time.monotonic() - t < limited


def test_a_sibling_shares_the_limit_but_hears_only_its_own_answers(server: str) -> None:
    """The loop's client (a sibling of the one the lease, the grouper and the watches use):
    /healthz must not take their answers for the loop's."""
    parent = _client(server, TokenBucket(qps=1000, burst=100))
    loop = parent.sibling()
    assert loop is not parent and loop.rest_client is not parent.rest_client
    assert (loop.configuration, loop.limiter, loop.timeout) == \
        (parent.configuration, parent.limiter, parent.timeout)
    quiet = loop.last_answer
    client.CoreV1Api(parent).read_namespace("x", _preload_content=False)
    assert loop.last_answer == quiet < parent.last_answer
    heard = parent.last_answer
    client.CoreV1Api(loop).read_namespace("x", _preload_content=False)
    assert loop.last_answer > quiet and parent.last_answer == heard
    assert parent.limiter is not None and parent.limiter.taken == 2  # one bucket for both
    assert [p for _, p, _ in _Counting.hits] == ["/api/v1/namespaces/x"] * 2


def test_a_sibling_keeps_a_connection_per_thread_of_its_callers(server: str) -> None:
    """The binder's client keeps as many connections as it has workers; the parent keeps its
    own number (urllib3 would otherwise open and drop the extra ones, a handshake each)."""
    parent = _client(server, None)
    binds = parent.sibling(pool_size=136)
    assert binds.rest_client.pool_manager.connection_from_url(server).pool.maxsize == 136
    assert parent.rest_client.pool_manager.connection_from_url(server).pool.maxsize != 136
    client.CoreV1Api(binds).read_namespace("x", _preload_content=False)  # it still works


def _kubeconfig(tmp_path: Path, server: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    return str(path)


def test_run_flags_reach_both_buckets(tmp_path: Path, server: str) -> None:
    args = build_parser().parse_args(["run", "--kubeconfig", _kubeconfig(tmp_path, server),
                                      "--kube-api-qps", "7", "--kube-api-burst", "3"])
    api, events_api = api_clients(args)
    for c in (api, events_api):
        assert isinstance(c, RateLimitedApiClient) and c.limiter is not None
        assert (c.limiter.qps, c.limiter.burst) == (7, 3)
    assert api.limiter is not events_api.limiter  # kube-scheduler: its own for events
    client.CoreV1Api(api).read_namespace("x", _preload_content=False)
    assert api.limiter.taken == 1 and events_api.limiter.taken == 0


def test_defaults_config_file_and_flag_precedence(tmp_path: Path) -> None:
    parse = build_parser().parse_args
    assert client_connection(parse(["run"])) == config_file.ClientConnection(50, 100)
    cfg = tmp_path / "config.yaml"
    cfg.write_text("clientConnection: {qps: 300, burst: 600}\n")
    assert client_connection(parse(["run", "--config", str(cfg)])) == \
        config_file.ClientConnection(300, 600)
    assert client_connection(parse(["run", "--config", str(cfg), "--kube-api-qps", "-1"])) \
        == config_file.ClientConnection(-1, 600)
    args = parse(["run", "--kubeconfig", _kubeconfig(tmp_path, "http://127.0.0.1:1"),
                  "--kube-api-qps", "-1"])
    assert api_clients(args)[0].limiter is None  # type: ignore[attr-defined]


@pytest.mark.parametrize("text,key", [("clientConnection: {qps: 0}", "clientConnection.qps"),
                                      ("clientConnection: {qps: fast}", "clientConnection.qps"),
                                      ("clientConnection: {burst: 0}", "clientConnection.burst"),
                                      ("clientConnection: {qsp: 5}", "qsp")])
def test_bad_client_connection_names_the_key(tmp_path: Path, text: str, key: str) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(text + "\n")
    with pytest.raises(SystemExit, match=key):
        config_file.client_connection(str(cfg))
    config_file.read(str(cfg))  # the scheduler's own keys are still readable


def test_zero_qps_flag_is_refused(tmp_path: Path) -> None:
    args = build_parser().parse_args(["run", "--kubeconfig",
                                      _kubeconfig(tmp_path, "http://127.0.0.1:1"),
                                      "--kube-api-qps", "0"])
    with pytest.raises(SystemExit, match="kube-api-qps"):
        api_clients(args)


def test_events_are_written_off_the_caller_path_every_one_once(server: str) -> None:
    rec = EventRecorder(_client(server, None), writers=3)
    _Counting.gate.clear()  # the API server answers nothing yet
    try:
        start = time.monotonic()
        for i in range(40):
            pod = {"metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"u{i}"}}
            rec.emit(pod, "Scheduled", f"Successfully assigned ns/p{i} to n1")
            rec.emit(pod, "Scheduled", f"Successfully assigned ns/p{i} to n1")  # deduplicated
        assert time.monotonic() - start < 5  # emit did not wait for the blocked writes
        assert rec.written == 0 and not rec.flush(0.2)
    finally:
        _Counting.gate.set()
    assert rec.flush(10)
    posts = [(p, b) for m, p, b in _Counting.hits if m == "POST"]
    assert len(posts) == 40 and rec.written == 40
    assert {p for p, _ in posts} == {"/api/v1/namespaces/ns/events"}
    names = sorted(b["involvedObject"]["name"] for _, b in posts)
    assert names == sorted(f"p{i}" for i in range(40))
    assert all(b["reason"] == "Scheduled" and b["source"]["component"] == "kai-scheduler"
               for _, b in posts)


def test_run_reads_the_config_file_once_and_uses_it(tmp_path: Path, monkeypatch) -> None:
    """`kai-ray run` parses --config once: the loop's keys and clientConnection both come from
    that read (up to the cache start, which fails here: there is no cluster)."""
    import yaml

    from kai_ray.controller import main

    parses = []
    real = yaml.safe_load

    def counting(text: object) -> object:
        parses.append(text)
        return real(text)

    seen: list[RateLimitedApiClient] = []

    class NoCluster:
        def __init__(self, api: RateLimitedApiClient, **timeouts: object) -> None:
            seen.append(api)

        def start(self) -> None:
            raise RuntimeError("no cluster here")

    monkeypatch.setattr(yaml, "safe_load", counting)
    monkeypatch.setattr(main, "ClusterCache", NoCluster)
    cfg = tmp_path / "config.yaml"
    cfg.write_text("cyclePeriodSeconds: 3\nclientConnection: {qps: 300, burst: 600}\n")
    args = build_parser().parse_args(["run", "--kubeconfig",
                                      _kubeconfig(tmp_path, "http://127.0.0.1:1"),
                                      "--config", str(cfg), "--kube-api-burst", "9"])
    assert main.cmd_run(args) == 2
    assert parses.count(cfg.read_text()) == 1  # (the kubeconfig is YAML too)
    (api,) = seen
    assert api.limiter is not None and (api.limiter.qps, api.limiter.burst) == (300, 9)


@pytest.mark.parametrize("config,flags,names", [
    ("", ["--kube-api-burst", "0"], "--kube-api-burst"),
    ("", ["--kube-api-qps", "0"], "--kube-api-qps"),
    # the file alone is fine (no limit needs no burst); the flag makes its burst wrong
    ("clientConnection: {qps: -1, burst: 0}", ["--kube-api-qps", "5"],
     "clientConnection.burst in {cfg}"),
    ("clientConnection: {qps: true}", [], "clientConnection.qps"),
    ("clientConnection: {burst: 2.5}", [], "clientConnection.burst"),
])
def test_bad_rate_limit_names_the_flag_or_key(tmp_path: Path, config: str, flags: list[str],
                                              names: str) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(config + "\n")
    args = build_parser().parse_args(["run", "--config", str(cfg), *flags])
    with pytest.raises(SystemExit) as e:
        client_connection(args)
    assert names.format(cfg=cfg) + ": expected" in str(e.value)


def test_the_limiter_checks_with_the_same_rule() -> None:
    with pytest.raises(ValueError, match="kube-api-qps: expected a positive number"):
        TokenBucket(qps=0, burst=1)
    with pytest.raises(ValueError, match="kube-api-burst: expected an integer >= 1"):
        bucket(5, 0)
    assert bucket(-1, 0) is None


@pytest.mark.parametrize("text,key", [
    ("reservation: {timeoutSeconds: 0}", "reservation.timeoutSeconds"),
    ("reservation: {timeoutSeconds: .nan}", "reservation.timeoutSeconds"),
    ("reservation: {timeoutSeconds: soon}", "reservation.timeoutSeconds"),
    ("reservation: {timeoutSeconds: true}", "reservation.timeoutSeconds"),
    ("reservation: {image: ''}", "reservation.image"),
    ("reservation: {image: 5}", "reservation.image"),
    ("reservation: {serviceAccountName: [a]}", "reservation.serviceAccountName"),
    ("reservation: {imag: x}", "imag"),
    ("reservation: pause", "reservation")])
def test_bad_reservation_settings_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(text + "\n")
    with pytest.raises(SystemExit, match=key):
        config_file.load(str(cfg)).binder()


def test_reservation_settings_reach_the_binder(tmp_path: Path) -> None:
    from kai_ray.controller.main import load_config
    from kai_ray.k8s.binder import BinderConfig

    assert load_config(None).binder == BinderConfig()
    cfg = tmp_path / "config.yaml"
    cfg.write_text("reservation: {image: 'kai:1', timeoutSeconds: 7, serviceAccountName: r}\n")
    binder = load_config(str(cfg)).binder
    assert (binder.reservation_image, binder.reservation_timeout_s,
            binder.reservation_service_account) == ("kai:1", 7.0, "r")


def test_a_fenced_client_checks_the_lease_after_waiting_for_a_token(server: str) -> None:
    """The loop's client checks its fence as each request is sent, after any wait for a
    token: a request checked earlier must not go out once the lease ran out meanwhile."""
    from kai_ray.k8s.fencing import Fenced

    bucket = TokenBucket(qps=10, burst=1)
    loop = _client(server, bucket).sibling(retries=False)
    left = [5.0]

    def fence() -> float:
        return left[0]

    loop.fence = fence
    core = client.CoreV1Api(loop)
    core.read_namespace("x", _preload_content=False)  # with time left: sent
    sent = len(_Counting.hits)
    left[0] = 0.5  # the lease ran out while the next request waited for its token
    with pytest.raises(Fenced):
        core.read_namespace("x", _preload_content=False)
    assert len(_Counting.hits) == sent, "a request went out without leadership"
    assert bucket.taken == 2  # it did wait for its token first
