"""Writes fenced on leadership: a replica writes only while it surely leads (the elector's
`lease_left`: until its renew deadline, before which no standby can take over), and each
request's timeout ends within that time."""

from __future__ import annotations

import math
from collections.abc import Callable

# a write is made only with at least this much leadership left
MIN_LEASE_LEFT_S = 1.0

Fence = Callable[[], float]  # seconds of leadership left; inf without election


class Fenced(RuntimeError):
    """This replica may no longer lead (its lease is about to lapse, or it is stopping): no
    more writes; a gang's intent is left for whoever leads next."""


def fenced_timeout(fence: Fence, default: tuple[float, float]) -> tuple[float, float] | None:
    """The (connect, read) timeout of a request made now under `fence`: `default` cut to the
    leadership left; None when there is no limit (no election). Raises Fenced when less than
    MIN_LEASE_LEFT_S is left."""
    left = fence()
    if left < MIN_LEASE_LEFT_S:
        raise Fenced(f"{left:.1f}s of leadership left")
    if math.isinf(left):
        return None
    return min(default[0], left), min(default[1], left)
