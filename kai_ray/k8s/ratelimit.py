"""Client-side rate limit of API requests, as client-go's (`--kube-api-qps`, `--kube-api-burst`):
a token bucket that starts full with `burst` tokens and refills at `qps` per second; every
request takes one token and waits when none is left. One bucket serves every request made
through one API client (reads, writes, the opening of each watch)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

DEFAULT_QPS = 50.0  # kube-scheduler's defaults (KubeSchedulerConfiguration.clientConnection)
DEFAULT_BURST = 100


class TokenBucket:
    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if qps <= 0:
            raise ValueError(f"qps must be > 0, got {qps}")
        if burst < 1:
            raise ValueError(f"burst must be >= 1 when qps is set, got {burst}")
        self.qps = float(qps)
        self.burst = int(burst)
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(burst)
        self._last = clock()
        self._lock = threading.Lock()
        self.taken = 0
        self.waited_s = 0.0

    def reserve(self) -> float:
        """Take a token now; returns how long the caller must wait before using it. Tokens may
        go negative: each waiter holds its own slot in the future, so waiters are served in
        order and the long-run rate never exceeds `qps`."""
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1.0
            self.taken += 1
            wait = 0.0 if self._tokens >= 0 else -self._tokens / self.qps
            self.waited_s += wait
            return wait

    def take(self) -> float:
        """Wait for a token; returns the seconds waited."""
        wait = self.reserve()
        if wait > 0:
            self._sleep(wait)
        return wait


class RateLimitedApiClient(client.ApiClient):
    """An ApiClient whose every request first takes a token from `limiter` (None: no limit).
    All generated APIs, the dynamic client and watches go through `call_api`."""

    def __init__(self, configuration: client.Configuration,
                 limiter: TokenBucket | None = None) -> None:
        super().__init__(configuration)
        self.limiter = limiter

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        if self.limiter is not None:
            self.limiter.take()
        return super().call_api(*args, **kwargs)


def bucket(qps: float, burst: int) -> TokenBucket | None:
    """client-go's rule: a negative QPS means no limit. Zero is refused here (client-go would
    silently use 5) so that a missing value is not mistaken for a choice."""
    if qps < 0:
        return None
    if qps == 0:
        raise ValueError("kube-api-qps: 0 is not a rate; give a positive QPS or -1 for no limit")
    if burst < 1:
        raise ValueError(f"kube-api-burst: must be >= 1 when kube-api-qps is set, got {burst}")
    return TokenBucket(qps, burst)
