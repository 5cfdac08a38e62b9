"""The fault proxy against local servers (no cluster): each mode, and back to pass."""

from __future__ import annotations

import contextlib
import http.server
import resource
import socket
import socketserver
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kai_ray.testing.faultproxy import FaultProxy, kubeconfig_server, kubeconfig_via


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: EchoServer = self.server  # type: ignore[assignment]
        while True:
            try:
                data = self.request.recv(65536)
            except OSError:
                return
            if not data:
                return
            with server.lock:
                server.received.append((time.monotonic(), data))
            try:
                self.request.sendall(data)
            except OSError:
                return


class EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Echo)
        self.lock = threading.Lock()
        self.received: list[tuple[float, bytes]] = []

    def data(self) -> bytes:
        with self.lock:
            return b"".join(d for _, d in self.received)


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


# a proxy thread that dies would pass for a blackhole: make it fail the test instead
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


@pytest.fixture
def proxy(echo: EchoServer, caplog: pytest.LogCaptureFixture) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", echo.server_address[1]) as p:
        yield p
    failed = [r.getMessage() for r in caplog.records if r.name == "kai_ray.testing.faultproxy"]
    assert not failed, failed


def _connect(proxy: FaultProxy, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise EOFError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def _wait(what: str, check: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_pass_forwards_both_ways_and_passes_eof(proxy: FaultProxy) -> None:
    with _connect(proxy) as s:
        payload = bytes(range(256)) * 4096  # 1 MiB: more than one chunk and socket buffer
        sender = threading.Thread(target=s.sendall, args=(payload,))
        sender.start()
        assert _recv_exactly(s, len(payload)) == payload
        sender.join()
        s.shutdown(socket.SHUT_WR)
        assert s.recv(10) == b""  # the client's FIN reached the server, and its FIN came back
    _wait("the closed connection to be forgotten", lambda: proxy.connections == 0)


def test_http_through_the_proxy(tmp_path: Path) -> None:
    (tmp_path / "hello.txt").write_text("hello")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a: object, **kw: object) -> None:
            super().__init__(*a, directory=str(tmp_path), **kw)  # type: ignore[arg-type]

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with FaultProxy("127.0.0.1", server.server_address[1]) as p:
            for _ in range(3):
                url = f"http://127.0.0.1:{p.port}/hello.txt"
                with urllib.request.urlopen(url, timeout=5) as resp:
                    assert resp.read() == b"hello"
    finally:
        server.shutdown()
        server.server_close()


def test_blackhole_holds_open_and_new_connections_then_delivers(proxy: FaultProxy,
                                                                echo: EchoServer) -> None:
    with _connect(proxy) as old:
        old.sendall(b"ping")
        assert _recv_exactly(old, 4) == b"ping"
        proxy.set_mode("blackhole")
        old.sendall(b"held-old")
        new = _connect(proxy)  # accepted during the partition
        new.sendall(b"held-new")
        time.sleep(0.5)
        assert echo.data() == b"ping", "bytes crossed the partition"
        for s in (old, new):
            s.settimeout(0.3)
            with pytest.raises(socket.timeout):  # nothing comes back, nor a close
                s.recv(100)
        proxy.set_mode("pass")
        for s, want in ((old, b"held-old"), (new, b"held-new")):
            s.settimeout(5)
            assert _recv_exactly(s, len(want)) == want
        new.close()


def test_blackhole_holds_server_bytes_too(proxy: FaultProxy, echo: EchoServer) -> None:
    """Bytes the server sent before the partition, still queued in the proxy or the kernel,
    wait for its end."""
    with _connect(proxy) as s:
        proxy.set_mode("delay", delay_s=0.5)
        s.sendall(b"echoed-then-held")
        _wait("the server to echo", lambda: echo.data() == b"echoed-then-held")
        proxy.set_mode("blackhole")  # the echo is queued in the proxy now
        s.settimeout(1.0)
        with pytest.raises(socket.timeout):
            s.recv(100)
        proxy.set_mode("pass")
        s.settimeout(5)
        assert _recv_exactly(s, 16) == b"echoed-then-held"


def test_reset_resets_open_and_new_connections(proxy: FaultProxy) -> None:
    open_ = [_connect(proxy) for _ in range(3)]
    for s in open_:
        s.sendall(b"x")
        assert s.recv(1) == b"x"
    proxy.set_mode("reset")
    for s in open_:
        with pytest.raises(ConnectionResetError):
            s.recv(1)
            s.sendall(b"y")  # a FIN instead of a RST would read b"" and land here
            s.recv(1)
        s.close()
    # the RST can beat connect()'s return on loopback: either call may raise it
    with pytest.raises(ConnectionResetError), _connect(proxy) as new:
        new.recv(1)
    proxy.set_mode("pass")
    with _connect(proxy) as s:
        s.sendall(b"back")
        assert _recv_exactly(s, 4) == b"back"


def test_delay_holds_server_to_client_only(proxy: FaultProxy, echo: EchoServer) -> None:
    delay = 1.0
    with _connect(proxy) as s:
        proxy.set_mode("delay", delay_s=delay)
        sent_at = time.monotonic()
        for i in range(5):  # order kept across chunks
            s.sendall(f"<{i}>".encode())
            time.sleep(0.05)
        got = _recv_exactly(s, 15)
        took = time.monotonic() - sent_at
        assert got == b"<0><1><2><3><4>"
        assert took >= delay, f"the first chunk came back after {took:.2f}s, not >= {delay}s"
        with echo.lock:
            first_at = echo.received[0][0]
        assert first_at - sent_at < 0.5, "client->server was delayed too"
        proxy.set_mode("pass")
        t = time.monotonic()
        s.sendall(b"fast")
        assert _recv_exactly(s, 4) == b"fast"
        assert time.monotonic() - t < 0.5


def test_leaving_delay_releases_held_chunks(proxy: FaultProxy, echo: EchoServer) -> None:
    with _connect(proxy) as s:
        proxy.set_mode("delay", delay_s=30.0)
        s.sendall(b"held")
        _wait("the server to echo", lambda: echo.data() == b"held")
        time.sleep(0.1)  # the echo is read by the proxy and held
        t = time.monotonic()
        proxy.set_mode("pass")
        assert _recv_exactly(s, 4) == b"held"
        assert time.monotonic() - t < 1.0


def test_upstream_down_resets_the_client() -> None:
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        port = spare.getsockname()[1]  # nothing listens on it
    with FaultProxy("127.0.0.1", port) as p, pytest.raises(ConnectionResetError), \
            _connect(p) as s:
        s.recv(1)


def test_hundreds_of_connections_without_busy_looping(proxy: FaultProxy) -> None:
    socks = [_connect(proxy) for _ in range(300)]
    try:
        for i, s in enumerate(socks):
            s.sendall(f"{i:04d}".encode())
        for i, s in enumerate(socks):
            assert _recv_exactly(s, 4) == f"{i:04d}".encode()
        for mode in ("pass", "blackhole", "delay"):
            proxy.set_mode(mode, delay_s=10.0)
            if mode == "delay":  # chunks held: the proxy waits on a timer, not a loop
                for s in socks[:50]:
                    s.sendall(b"zz")
            time.sleep(0.2)
            before = resource.getrusage(resource.RUSAGE_SELF)
            time.sleep(1.0)
            after = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            assert cpu < 0.2, f"{cpu:.2f}s CPU in 1s idle in {mode} mode"
        assert proxy.connections == 300
    finally:
        for s in socks:
            s.close()


def test_kubeconfig_via_keeps_the_server_name(tmp_path: Path) -> None:
    def config(server: str) -> dict[str, object]:
        return {"apiVersion": "v1", "kind": "Config", "current-context": "c",
                "clusters": [{"name": "other", "cluster": {"server": "https://10.0.0.9:1"}},
                             {"name": "k", "cluster": {"server": server,
                                                       "certificate-authority-data": "Q0E="}}],
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                "users": [{"name": "u", "user": {}}]}

    src = tmp_path / "kubeconfig"
    src.write_text(yaml.safe_dump(config("https://127.0.0.1:6443")))
    assert kubeconfig_server(src) == ("127.0.0.1", 6443)
    out = yaml.safe_load(kubeconfig_via(src, 4000, tmp_path / "a").read_text())
    cluster = out["clusters"][1]["cluster"]
    assert cluster == {"server": "https://127.0.0.1:4000", "certificate-authority-data": "Q0E="}
    assert out["clusters"][0]["cluster"]["server"] == "https://10.0.0.9:1"  # not current

    src.write_text(yaml.safe_dump(config("https://api.example.test:6443")))
    out = yaml.safe_load(kubeconfig_via(src, 4000, tmp_path / "b").read_text())
    cluster = out["clusters"][1]["cluster"]
    assert cluster["server"] == "https://127.0.0.1:4000"
    assert cluster["tls-server-name"] == "api.example.test"


def test_stop_closes_everything(echo: EchoServer) -> None:
    p = FaultProxy("127.0.0.1", echo.server_address[1]).start()
    s = _connect(p)
    s.sendall(b"a")
    assert s.recv(1) == b"a"
    p.stop()
    p.stop()  # twice is fine
    with contextlib.suppress(ConnectionResetError):
        assert s.recv(1) == b""
    s.close()
    with pytest.raises(ConnectionRefusedError):
        _connect(p, timeout=1)
