"""A TCP proxy that puts network faults between a client and a server, for tests.

The fault suite runs `kai-ray run` against the local kube-apiserver through this proxy and
switches its mode from the test process while kai-ray works:

- ``pass``: bytes flow both ways.
- ``blackhole``: a network partition. Connections stay open, new ones are accepted (but not
  yet connected upstream), and nothing moves either way; bytes wait in the kernel's socket
  buffers or the proxy's queues and flow on when the mode leaves ``blackhole``, as TCP
  retransmission delivers them once a partition heals.
- ``reset``: every open connection is closed with RST (SO_LINGER 0) on both sides, and every
  new one is reset right after it is accepted.
- ``delay``: each chunk from the server reaches the client ``delay_s`` seconds after the proxy
  read it, in order; the client's bytes reach the server at once. Leaving ``delay`` releases
  the chunks still held.

The proxy is plain TCP: TLS passes through it untouched, so ``kubeconfig_via`` only has to
point a kubeconfig at the proxy's port and keep the server name the certificate was issued for.

One thread runs a selector loop over every socket (no thread per connection, no polling): the
sockets each connection wants to read or write are registered, and only those; a side stops
being read while its peer's queue is over ``HIGH_WATER``, so a slow reader holds back its
writer as TCP does.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import itertools
import logging
import selectors
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import yaml

log = logging.getLogger(__name__)
MODES = ("pass", "blackhole", "reset", "delay")
CHUNK = 64 * 1024
HIGH_WATER = 1 << 20
_RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, not FIN
_WAKE = object()
_LISTENER = object()


class _Conn:
    """One proxied connection. Queues hold what was read from one side and not yet written
    to the other; an empty chunk stands for the EOF read there, passed on as a FIN."""

    __slots__ = ("client", "client_eof", "client_fin", "connected", "events", "id", "server",
                 "server_eof", "server_fin", "timer_at", "to_client", "to_client_bytes",
                 "to_server", "to_server_bytes")

    def __init__(self, client: socket.socket, conn_id: int) -> None:
        self.id = conn_id
        self.client = client
        self.server: socket.socket | None = None
        self.connected = False  # the upstream connect has completed
        self.to_server: deque[bytes] = deque()
        self.to_client: deque[tuple[float, bytes]] = deque()  # (deliver at, chunk)
        self.to_server_bytes = 0
        self.to_client_bytes = 0
        self.client_eof = self.server_eof = False  # EOF read from that side
        self.client_fin = self.server_fin = False  # FIN sent to that side
        self.events: dict[socket.socket, int] = {}  # what each socket is registered for
        self.timer_at: float | None = None  # the delivery time a timer is armed for


class FaultProxy:
    """``FaultProxy(host, port).start()`` listens on 127.0.0.1:``.port`` and forwards to
    ``host:port``; ``set_mode`` switches faults at run time (see the module docstring)."""

    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1",
                 listen_port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.listen_addr = (listen_host, listen_port)
        self.port = 0
        self.mode = "pass"
        self.delay_s = 5.0
        self.accepted = 0
        self._sel = selectors.DefaultSelector()
        self._conns: dict[int, _Conn] = {}
        self._ids = itertools.count()
        self._timers: list[tuple[float, int]] = []  # (when, conn id): delayed chunks due
        self._lock = threading.Lock()
        self._requests: list[tuple[str, float, threading.Event]] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._listener: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._family = socket.AF_INET
        self._target_addr: Any = None

    # ------------------------------------------------------------------ public
    def start(self) -> FaultProxy:
        # resolve once: a blocking name lookup per connection would stall the loop
        info = socket.getaddrinfo(*self.target, type=socket.SOCK_STREAM)[0]
        self._family, self._target_addr = info[0], info[4]
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(self.listen_addr)
        listener.listen(1024)
        listener.setblocking(False)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(listener, selectors.EVENT_READ, _LISTENER)
        self._sel.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._thread = threading.Thread(target=self._run, name=f"faultproxy-{self.port}",
                                        daemon=True)
        self._thread.start()
        return self

    def set_mode(self, mode: str, delay_s: float = 5.0) -> None:
        """Switch to `mode`; returns once the proxy has applied it (a ``reset`` has reset
        every open connection by then)."""
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
        if delay_s < 0:
            raise ValueError("delay_s must be >= 0")
        if self._thread is None or not self._thread.is_alive():
            self.mode, self.delay_s = mode, delay_s
            return
        applied = threading.Event()
        with self._lock:
            self._requests.append((mode, delay_s, applied))
        self._wake()
        if not applied.wait(10):
            raise TimeoutError(f"the fault proxy did not apply mode {mode!r} within 10 s")

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._conns)

    def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        if self._thread is not None:
            self._wake()
            self._thread.join(10)
            self._thread = None
        for conn in list(self._conns.values()):
            self._close(conn, reset=False)
        for sock in (self._listener, self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()
        self._sel.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ------------------------------------------------------------------ loop
    def _wake(self) -> None:
        if self._wake_w is not None:
            with contextlib.suppress(BlockingIOError):  # a wake-up is already pending
                self._wake_w.send(b"x")

    def _run(self) -> None:
        while not self._stopping:
            timeout = None
            if self._timers:
                timeout = max(0.0, self._timers[0][0] - time.monotonic())
            touched: dict[int, _Conn] = {}
            for key, _ in self._sel.select(timeout):
                if key.data is _LISTENER:
                    self._accept(touched)
                elif key.data is _WAKE:
                    self._apply_requests(key.fileobj)  # type: ignore[arg-type]
                else:
                    conn, is_client = key.data
                    if conn.id in self._conns:
                        self._guarded(conn, self._service, conn, is_client)
                        touched[conn.id] = conn
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                _, conn_id = heapq.heappop(self._timers)
                conn = self._conns.get(conn_id)
                if conn is not None:
                    conn.timer_at = None
                    touched[conn_id] = conn
            for conn in touched.values():
                self._guarded(conn, self._flush, conn)
                self._guarded(conn, self._update, conn)

    def _guarded(self, conn: _Conn, step: Callable[..., None], *args: Any) -> None:
        """Run one step of `conn`; a bug in it resets that connection, not the proxy's thread
        (a dead thread would look like a blackhole to the test)."""
        if conn.id not in self._conns:
            return
        try:
            step(*args)
        except Exception:
            log.exception("fault proxy: connection %d failed; resetting it", conn.id)
            self._close(conn, reset=True)

    def _apply_requests(self, wake: socket.socket) -> None:
        try:
            while wake.recv(4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            requests, self._requests = self._requests, []
        for mode, delay_s, applied in requests:
            self.mode, self.delay_s = mode, delay_s
            if mode == "reset":
                for conn in list(self._conns.values()):
                    self._close(conn, reset=True)
            elif mode != "blackhole":
                for conn in list(self._conns.values()):
                    if conn.server is None:
                        self._guarded(conn, self._connect, conn)
            for conn in list(self._conns.values()):
                self._guarded(conn, self._flush, conn)
                self._guarded(conn, self._update, conn)
            applied.set()

    def _accept(self, touched: dict[int, _Conn]) -> None:
        assert self._listener is not None
        for _ in range(256):  # bounded, so a connection storm cannot starve open streams
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors and the like: try again on the next event
                return
            self.accepted += 1
            if self.mode == "reset":
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock, next(self._ids))
            self._conns[conn.id] = conn
            if self.mode != "blackhole":  # in a partition nothing reaches the server yet
                self._guarded(conn, self._connect, conn)
            if conn.id in self._conns:
                touched[conn.id] = conn

    def _connect(self, conn: _Conn) -> None:
        server = socket.socket(self._family, socket.SOCK_STREAM)
        server.setblocking(False)
        server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.server = server
        err = server.connect_ex(self._target_addr)
        if err == 0:
            conn.connected = True
        elif err not in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
            self._close(conn, reset=True)  # upstream refused: the client sees a reset
            return
        self._update(conn)

    def _service(self, conn: _Conn, is_client: bool) -> None:
        """One socket of `conn` is ready: finish the connect, or read what it has."""
        if not is_client and not conn.connected:
            assert conn.server is not None
            if conn.server.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self._close(conn, reset=True)
            else:
                conn.connected = True
            return
        sock = conn.client if is_client else conn.server
        assert sock is not None
        if self.mode == "blackhole":
            return  # registered before the switch: leave the bytes where they are
        if (is_client and conn.client_eof) or (not is_client and conn.server_eof):
            return  # writable only; _flush does the writing
        try:
            data = sock.recv(CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn, reset=True)  # a reset on one side resets the other
            return
        if is_client:
            conn.client_eof = not data
            conn.to_server.append(data)
            conn.to_server_bytes += len(data)
        else:
            conn.server_eof = not data
            due = time.monotonic() + (self.delay_s if self.mode == "delay" else 0.0)
            conn.to_client.append((due, data))
            conn.to_client_bytes += len(data)

    def _flush(self, conn: _Conn) -> None:
        """Write what is queued and may go now; close the connection once both sides are done."""
        if self.mode == "blackhole":
            return
        try:
            if conn.connected and conn.server is not None:
                while conn.to_server:
                    chunk = conn.to_server[0]
                    if not chunk:
                        conn.server.shutdown(socket.SHUT_WR)
                        conn.server_fin = True
                        conn.to_server.popleft()
                        continue
                    sent = conn.server.send(chunk)
                    conn.to_server_bytes -= sent
                    if sent < len(chunk):
                        conn.to_server[0] = chunk[sent:]
                        break
                    conn.to_server.popleft()
            now = time.monotonic()
            while conn.to_client and self._due(conn.to_client[0][0]) <= now:
                due, chunk = conn.to_client[0]
                if not chunk:
                    conn.client.shutdown(socket.SHUT_WR)
                    conn.client_fin = True
                    conn.to_client.popleft()
                    continue
                sent = conn.client.send(chunk)
                conn.to_client_bytes -= sent
                if sent < len(chunk):
                    conn.to_client[0] = (due, chunk[sent:])
                    break
                conn.to_client.popleft()
        except (BlockingIOError, InterruptedError):
            pass  # the socket's buffer is full: _update waits for it to drain
        except OSError:
            self._close(conn, reset=True)
            return
        if conn.client_fin and conn.server_fin:
            self._close(conn, reset=False)

    def _due(self, at: float) -> float:
        return at if self.mode == "delay" else 0.0  # outside delay mode held chunks go at once

    def _update(self, conn: _Conn) -> None:
        """Register each socket for what it waits on now, and nothing else (no busy loop)."""
        if conn.id not in self._conns:
            return  # closed meanwhile
        read, write = selectors.EVENT_READ, selectors.EVENT_WRITE
        client_ev = server_ev = 0
        if conn.server is not None and not conn.connected:
            server_ev = write  # the connect's completion
        elif conn.server is not None and self.mode != "blackhole":
            if not conn.client_eof and conn.to_server_bytes < HIGH_WATER:
                client_ev |= read
            if not conn.server_eof and conn.to_client_bytes < HIGH_WATER:
                server_ev |= read
            if conn.to_server:
                server_ev |= write
            if conn.to_client:
                due = self._due(conn.to_client[0][0])
                if due <= time.monotonic():
                    client_ev |= write
                elif conn.timer_at != due:
                    conn.timer_at = due
                    heapq.heappush(self._timers, (due, conn.id))
        self._register(conn, conn.client, client_ev)
        if conn.server is not None:
            self._register(conn, conn.server, server_ev)

    def _register(self, conn: _Conn, sock: socket.socket, events: int) -> None:
        have = conn.events.get(sock, 0)
        if events == have:
            return
        data = (conn, sock is conn.client)
        if not have:
            self._sel.register(sock, events, data)
        elif not events:
            self._sel.unregister(sock)
        else:
            self._sel.modify(sock, events, data)
        conn.events[sock] = events

    def _close(self, conn: _Conn, reset: bool) -> None:
        self._conns.pop(conn.id, None)
        for sock in (conn.client, conn.server):
            if sock is None:
                continue
            if conn.events.get(sock):
                with contextlib.suppress(KeyError, ValueError):
                    self._sel.unregister(sock)
            if reset:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
            sock.close()
        conn.events.clear()


def kubeconfig_server(kubeconfig: Path | str) -> tuple[str, int]:
    """(host, port) of the API server that `kubeconfig`'s current context names."""
    cluster = _current_cluster(yaml.safe_load(Path(kubeconfig).read_text()))
    url = urlsplit(cluster["server"])
    return url.hostname or "127.0.0.1", url.port or (443 if url.scheme == "https" else 80)


def kubeconfig_via(kubeconfig: Path | str, proxy_port: int, out_path: Path | str) -> Path:
    """Write a copy of `kubeconfig` whose current cluster is reached at 127.0.0.1:`proxy_port`.

    TLS still verifies the real server: the local plane's certificate has 127.0.0.1 among its
    SANs, so for it only the port changes; a server named otherwise keeps its name as
    ``tls-server-name`` (the Python kubernetes client reads it into the SNI and hostname check
    it uses, as client-go does)."""
    config = yaml.safe_load(Path(kubeconfig).read_text())
    cluster = _current_cluster(config)
    url = urlsplit(cluster["server"])
    host = url.hostname or "127.0.0.1"
    if host != "127.0.0.1" and "tls-server-name" not in cluster:
        cluster["tls-server-name"] = host
    cluster["server"] = url._replace(netloc=f"127.0.0.1:{proxy_port}").geturl()
    out = Path(out_path)
    out.write_text(yaml.safe_dump(config, sort_keys=False))
    out.chmod(0o600)
    return out


def _current_cluster(config: dict[str, Any]) -> dict[str, Any]:
    contexts = {c["name"]: c["context"] for c in config.get("contexts") or []}
    clusters = {c["name"]: c["cluster"] for c in config.get("clusters") or []}
    current = config.get("current-context")
    name = contexts[current]["cluster"] if current in contexts else next(iter(clusters))
    cluster: dict[str, Any] = clusters[name]
    return cluster
