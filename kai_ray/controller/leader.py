"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's rules.

    elector = LeaderElector(api_client, LeaseConfig(namespace="kai-ray", name="kai-ray-scheduler"))
    elector.start(on_started_leading=loop.start, on_stopped_leading=loop.stop)
    ...
    elector.is_leader()      # check before each scheduling cycle
    elector.stop()           # releases the lease: a standby takes over at its next retry

Rules (as client-go's ``leaderelection``):

- a candidate takes the Lease when it does not exist, has an empty holder (released), or its
  record has not changed for ``leaseDurationSeconds`` *as observed on the candidate's own clock*
  (so clock skew between hosts does not matter); every write is a replace with the read
  resourceVersion, so of two simultaneous candidates only one wins;
- the leader renews every ``retry_period``; when it could not renew for ``renew_deadline`` it
  stops leading (before anybody else can take over: ``renew_deadline < lease_duration``); when it
  sees another holder it stops at once;
- after a crash (no release) a standby takes over between ``lease_duration - retry_period`` and
  ``lease_duration + 2 * retry_period`` after the last renewal; after ``stop()`` (release)
  within one ``retry_period``.

Every lease call ends within ``renew_deadline / 2`` and, while leading, by the renew deadline
(no urllib3 retries: ``retry_period`` is the elector's retry), so a stuck renewal cannot outlive
the deadline; a renewal counts from when its attempt began, so a late answer cannot stretch
leadership past a standby's takeover.

Callbacks run in the elector's thread and must return quickly (start work in your own thread):
a callback that blocks delays renewals. If ``on_started_leading`` raises, the lease is released
for another candidate (and this one campaigns again after ``retry_period``). ``is_leader()``
also turns False by itself once ``renew_deadline`` has passed since the last renewal, even if
the thread is stuck.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import random
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kai_ray.k8s.ratelimit import DEFAULT_TIMEOUT, RateLimitedApiClient, TokenBucket

log = logging.getLogger(__name__)
# the lease client's rate limit: an elector makes at most two calls per retry_period
LEASE_QPS, LEASE_BURST = 5.0, 10

Callback = Callable[[], None]
_JITTER = 1.2  # client-go's JitterFactor for retries while not leading


@dataclass(frozen=True)
class LeaseConfig:
    name: str = "kai-ray-scheduler"
    namespace: str = "kube-system"
    lease_duration: float = 15.0  # seconds; written as leaseDurationSeconds (rounded up)
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    identity: str | None = None  # default: hostname-pid-random

    def __post_init__(self) -> None:
        if not self.lease_duration > self.renew_deadline:
            raise ValueError(f"LeaseConfig: lease_duration ({self.lease_duration}) must be "
                             f"greater than renew_deadline ({self.renew_deadline})")
        if not self.renew_deadline > _JITTER * self.retry_period:
            raise ValueError(f"LeaseConfig: renew_deadline ({self.renew_deadline}) must be "
                             f"greater than {_JITTER} x retry_period ({self.retry_period})")
        if self.retry_period <= 0:
            raise ValueError(f"LeaseConfig: retry_period ({self.retry_period}) must be > 0")


def default_identity() -> str:
    """``<hostname>-<pid>-<random>``: unique even for two processes with one pid namespace."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def _micro_time(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """One candidate for the Lease ``config.namespace/config.name``."""

    def __init__(self, api_client: client.ApiClient, config: LeaseConfig | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or LeaseConfig()
        self.identity = self.config.identity or default_identity()
        # the lease's own client: the caller's configuration with a token bucket of its own
        # (as kube-scheduler's election client: a renewal must not queue behind thousands of
        # status writes), without urllib3's retries (each would repeat a timed-out call with
        # the whole timeout); a call's timeout is `_call_timeout`, not the client's 30 s read,
        # which would outlive renew_deadline
        self._api = client.CoordinationV1Api(RateLimitedApiClient(
            api_client.configuration, TokenBucket(LEASE_QPS, LEASE_BURST), retries=False))
        connect, read = getattr(api_client, "timeout", DEFAULT_TIMEOUT)
        self._max_call = min(connect + read, self.config.renew_deadline / 2)
        self._clock = clock
        self._stop = threading.Event()
        self._release_on_stop = True
        self._leading = False
        self._last_renew = float("-inf")
        # the last Lease record seen and when it changed (our clock), as client-go's observedTime
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = float("-inf")
        self._thread: threading.Thread | None = None
        self.transitions = 0  # times this elector started leading

    # -- public -------------------------------------------------------------------------------
    def is_leader(self) -> bool:
        return self._leading and self._clock() - self._last_renew < self.config.renew_deadline

    def lease_left(self) -> float:
        """Seconds this replica still surely leads (until its renew deadline: no standby can
        take over before then); 0 when it does not lead. Writes are fenced on it: each is made
        only with time left, and its request timeout ends within that time."""
        if not self._leading:
            return 0.0
        return max(0.0, self._last_renew + self.config.renew_deadline - self._clock())

    def start(self, on_started_leading: Callback | None = None,
              on_stopped_leading: Callback | None = None) -> threading.Thread:
        """``run`` in a daemon thread."""
        self._thread = threading.Thread(
            target=self.run, args=(on_started_leading, on_stopped_leading),
            name=f"leader-{self.config.name}", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, release: bool = True, timeout: float | None = None) -> None:
        """Stop campaigning; with ``release`` the Lease's holder is emptied for a successor.

        ``release=False`` leaves the Lease as a crashed process would (tests use it).
        """
        self._release_on_stop = release
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout if timeout is not None else 2 * self.config.retry_period)

    def run(self, on_started_leading: Callback | None = None,
            on_stopped_leading: Callback | None = None) -> None:
        """Campaign, lead, and campaign again after losing the lease, until ``stop()``."""
        while not self._stop.is_set():
            attempt = self._clock()
            if not self._try_acquire_or_renew():
                self._stop.wait(self.config.retry_period * random.uniform(1.0, _JITTER))
                continue
            self._leading = True
            self._last_renew = attempt
            self.transitions += 1
            log.info("%s: started leading %s/%s", self.identity, self.config.namespace,
                     self.config.name)
            failed = False
            try:
                if on_started_leading:
                    on_started_leading()
                self._renew_until_lost_or_stopped()
            except Exception:  # a leader that cannot start its work hands over
                log.exception("%s: on_started_leading failed; releasing the lease", self.identity)
                failed = True
            finally:
                self._leading = False
                if failed or (self._stop.is_set() and self._release_on_stop):
                    self._release()
                log.info("%s: stopped leading", self.identity)
                if on_stopped_leading:
                    try:
                        on_stopped_leading()
                    except Exception:
                        log.exception("%s: on_stopped_leading failed", self.identity)
            if failed:
                self._stop.wait(self.config.retry_period)

    # -- internals ----------------------------------------------------------------------------
    def _renew_until_lost_or_stopped(self) -> None:
        while not self._stop.wait(self.config.retry_period):
            # when the attempt began, not when its answer came: the API server wrote the
            # renewal after that, so a standby's lease_duration starts later than our deadline
            attempt = self._clock()
            if self._try_acquire_or_renew():
                self._last_renew = attempt
            elif self._observed is not None and self._observed[0] not in ("", self.identity):
                log.warning("%s: lease taken by %s", self.identity, self._observed[0])
                return
            elif self._clock() - self._last_renew >= self.config.renew_deadline:
                log.warning("%s: could not renew the lease for %.1fs", self.identity,
                            self.config.renew_deadline)
                return

    def _call_timeout(self) -> float:
        """Seconds one lease call may take, connecting included: `_max_call` (a read and a
        write fit in renew_deadline), and while leading no later than the renew deadline."""
        limit = self._max_call
        if self._leading:
            limit = min(limit, self._last_renew + self.config.renew_deadline - self._clock())
        return max(limit, 0.05)  # urllib3 needs a positive timeout; is_leader() is False by now

    def _spec(self, acquire_time: str, transitions: int, holder: str | None = None,
              duration: int | None = None) -> dict[str, Any]:
        now = _micro_time(dt.datetime.now(dt.UTC))
        return {"holderIdentity": self.identity if holder is None else holder,
                "leaseDurationSeconds": duration or max(1, math.ceil(self.config.lease_duration)),
                "acquireTime": acquire_time or now, "renewTime": now,
                "leaseTransitions": transitions}

    def _try_acquire_or_renew(self) -> bool:
        ns, name = self.config.namespace, self.config.name
        try:
            lease: Any = self._api.read_namespaced_lease(
                name, ns, _request_timeout=self._call_timeout())
        except ApiException as e:
            if e.status != 404:
                log.warning("%s: reading lease %s/%s: HTTP %s", self.identity, ns, name, e.status)
                return False
            body: Any = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                         "metadata": {"name": name, "namespace": ns}, "spec": self._spec("", 0)}
            return self._write(lambda: self._api.create_namespaced_lease(
                ns, body, _request_timeout=self._call_timeout()))
        except Exception as e:  # network trouble: just a failed attempt
            log.warning("%s: reading lease %s/%s: %s", self.identity, ns, name, e)
            return False

        spec = lease.spec
        holder = spec.holder_identity or ""
        record = (holder, spec.lease_duration_seconds, spec.renew_time, spec.acquire_time)
        if record != self._observed:
            self._observed, self._observed_at = record, self._clock()
        held_by_other = holder not in ("", self.identity)
        duration = spec.lease_duration_seconds or 0
        if held_by_other and self._clock() < self._observed_at + duration:
            return False
        transitions = (spec.lease_transitions or 0) + (0 if holder == self.identity else 1)
        acquire = (_micro_time(spec.acquire_time)
                   if holder == self.identity and spec.acquire_time else "")
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": ns,
                             "resourceVersion": lease.metadata.resource_version},
                "spec": self._spec(acquire, transitions)}
        return self._write(lambda: self._api.replace_namespaced_lease(
            name, ns, body, _request_timeout=self._call_timeout()))

    def _write(self, call: Callable[[], Any]) -> bool:
        try:
            lease = call()
        except ApiException as e:
            if e.status not in (409, 404):  # 409: somebody else wrote first
                log.warning("%s: writing lease: HTTP %s", self.identity, e.status)
            return False
        except Exception as e:
            log.warning("%s: writing lease: %s", self.identity, e)
            return False
        spec = lease.spec
        self._observed = (spec.holder_identity or "", spec.lease_duration_seconds,
                          spec.renew_time, spec.acquire_time)
        self._observed_at = self._clock()
        return True

    def _release(self) -> None:
        """Empty the holder (only if it is still us), so that a standby need not wait."""
        ns, name = self.config.namespace, self.config.name
        try:
            lease: Any = self._api.read_namespaced_lease(
                name, ns, _request_timeout=self._call_timeout())
            if (lease.spec.holder_identity or "") != self.identity:
                return
            spec = self._spec("", lease.spec.lease_transitions or 0, holder="", duration=1)
            body: Any = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                         "metadata": {"name": name, "namespace": ns,
                                      "resourceVersion": lease.metadata.resource_version},
                         "spec": spec}
            self._api.replace_namespaced_lease(name, ns, body,
                                               _request_timeout=self._call_timeout())
            log.info("%s: released lease %s/%s", self.identity, ns, name)
        except Exception as e:  # the lease then simply expires
            log.warning("%s: releasing lease %s/%s failed: %s", self.identity, ns, name, e)
