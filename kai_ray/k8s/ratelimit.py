"""Client-side rate limit of API requests, as client-go's (`--kube-api-qps`, `--kube-api-burst`):
a token bucket that starts full with `burst` tokens and refills at `qps` per second; every
request takes one token and waits when none is left. One bucket serves every request made
through one API client and its siblings (reads, writes, the opening of each watch)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client
from urllib3.util.retry import Retry

from kai_ray.k8s.fencing import Fence, fenced_timeout

DEFAULT_QPS = 50.0  # kube-scheduler's defaults (KubeSchedulerConfiguration.clientConnection)
DEFAULT_BURST = 100


class TokenBucket:
    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        qps, burst = validate(qps, burst)
        if qps < 0:
            raise ValueError("kube-api-qps: a negative QPS means no limit, which is no bucket "
                             "(use bucket())")
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


# (connect, read) seconds of a request that names none: without one a half-open connection
# (a dropped NAT entry, a partitioned API server) blocks its caller for good
DEFAULT_TIMEOUT = (5.0, 30.0)


class RateLimitedApiClient(client.ApiClient):
    """An ApiClient whose every request first takes a token from `limiter` (None: no limit)
    and has a timeout: `timeout` (connect, read) seconds unless the call names its own (a
    watch names a read timeout longer than its server-side timeout). All generated APIs, the
    dynamic client and watches go through `call_api`."""

    def __init__(self, configuration: client.Configuration,
                 limiter: TokenBucket | None = None,
                 timeout: tuple[float, float] = DEFAULT_TIMEOUT,
                 retries: bool | int | None = None) -> None:
        """`retries`: None for urllib3's default (a failed connection, or a timed-out read of
        a GET or PUT, is tried 3 more times, each with the whole timeout), False for none."""
        super().__init__(configuration)
        self.limiter = limiter
        self.timeout = timeout
        if retries is not None:  # this client's pools only: the Configuration is shared
            self.rest_client.pool_manager.connection_pool_kw["retries"] = Retry.from_int(retries)
        # the scheduling loop's client is fenced on its leadership (kai_ray.k8s.fencing): no
        # request is sent with less than MIN_LEASE_LEFT_S left, and none outlasts what is left
        self.fence: Fence | None = None
        # when the API server last answered a request of this client (monotonic): a long
        # cycle that still gets answers is working, one that gets none is wedged
        self.last_answer = time.monotonic()

    def sibling(self, retries: bool | int | None = None, own_bucket: bool = False,
                pool_size: int | None = None) -> RateLimitedApiClient:
        """A client of the same configuration, limiter (one rate limit for both) and timeout,
        with its own connections and its own `last_answer`: the scheduling loop's, so that
        /healthz hears of answers to the loop's requests, not to lease renewals or watches.
        `retries` as for the constructor; `own_bucket`: a token bucket of its own, of the same
        QPS and burst, instead of this client's; `pool_size`: connections kept, when its
        callers run more threads than this client's (each extra one would be opened and
        dropped, a TLS handshake each)."""
        limiter = self.limiter
        if own_bucket and limiter is not None:
            limiter = TokenBucket(limiter.qps, limiter.burst)
        twin = RateLimitedApiClient(self.configuration, limiter, self.timeout,
                                    retries=retries)
        if pool_size is not None:  # this client's pools only: the Configuration is shared
            twin.rest_client.pool_manager.connection_pool_kw["maxsize"] = pool_size
        twin.default_headers = dict(self.default_headers)
        twin.cookie = self.cookie
        return twin

    def call_api(self, method: str, url: str, header_params: Any = None, body: Any = None,
                 post_params: Any = None, _request_timeout: Any = None) -> Any:
        if self.limiter is not None:
            self.limiter.take()
        timeout = _request_timeout or self.timeout
        if self.fence is not None:
            # checked here, after the wait for a token, the last moment before sending: a
            # write checked earlier could otherwise go out after the lease ran out
            limited = fenced_timeout(self.fence, _pair(timeout))
            timeout = limited if limited is not None else timeout
        response = super().call_api(method, url, header_params, body, post_params, timeout)
        if "watch=true" not in url:  # a watch opening says nothing of the loop's writes
            self.last_answer = time.monotonic()
        return response


def _pair(timeout: Any) -> tuple[float, float]:
    """A request timeout as (connect, read): one number is both."""
    if isinstance(timeout, int | float):
        return float(timeout), float(timeout)
    return float(timeout[0]), float(timeout[1])


def validate(qps: object, burst: object, qps_name: str = "kube-api-qps",
             burst_name: str = "kube-api-burst") -> tuple[float, int]:
    """The one check of a rate limit, wherever it comes from (flags, the config file, code);
    `qps_name`/`burst_name` say where, so the error names the flag or key to fix. client-go's
    rule: a negative QPS means no limit. Zero is refused (client-go would silently use 5) so
    that a missing value is not mistaken for a choice; the burst must be an integer >= 1 when
    the QPS limits. Returns (qps, burst) as float and int."""
    if isinstance(qps, bool) or not isinstance(qps, int | float) or qps == 0 or qps != qps:
        raise ValueError(f"{qps_name}: expected a positive number (or -1 for no limit), "
                         f"got {qps!r}")
    if isinstance(burst, bool) or not isinstance(burst, int) or (qps > 0 and burst < 1):
        raise ValueError(f"{burst_name}: expected an integer >= 1 when {qps_name} limits, "
                         f"got {burst!r}")
    return float(qps), burst


def bucket(qps: float, burst: int) -> TokenBucket | None:
    """The bucket of a checked rate limit (see `validate`); None for no limit."""
    qps, burst = validate(qps, burst)
    return None if qps < 0 else TokenBucket(qps, burst)
