"""Hierarchical fair share, resource by resource, exactly as KAI's proportion plugin divides it.

At each level the siblings first get their deserved quota (capped by what they can request),
then the surplus is split by over-quota weight in priority buckets, highest first, in rounds
that floor each portion to a whole unit; fractional leftovers are handed out last, one unit at a
time, largest leftover first. Each queue's share is then divided among its children.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from kai_ray.core.model import UNLIMITED


@dataclass
class ShareInput:
    """One queue's numbers for one resource."""

    name: str
    deserved: float
    limit: float
    weight: float
    request: float
    priority: int = 100
    created: float = 0.0
    usage: float = 0.0
    fair_share: float = 0.0
    children: list[ShareInput] = field(default_factory=list)

    @property
    def requestable(self) -> float:
        return self.request if self.limit == UNLIMITED else min(self.limit, self.request)

    def satisfied(self) -> bool:
        if self.request <= self.fair_share:
            return True
        return self.limit != UNLIMITED and self.limit <= self.fair_share

    def remaining_request(self) -> float:
        return max(0.0, self.requestable - self.fair_share)


def divide(total: float, queues: list[ShareInput], k_value: float = 1.0) -> float:
    """Set fair_share on `queues` (siblings sharing `total`) and recurse. Returns the unassigned."""
    remaining = _give_deserved(total, queues)
    remaining = _divide_over_quota(remaining, queues, k_value) if remaining > 0 else 0.0
    for q in queues:
        if q.children:
            divide(q.fair_share, q.children, k_value)
    return remaining


def _give_deserved(total: float, queues: list[ShareInput]) -> float:
    remaining = total
    for q in queues:
        deserved = total if q.deserved == UNLIMITED else q.deserved
        amount = min(deserved, q.requestable)
        q.fair_share += amount
        remaining -= amount
    return remaining


def _divide_over_quota(total: float, queues: list[ShareInput], k_value: float) -> float:
    priorities = sorted({q.priority for q in queues}, reverse=True)
    leftovers: dict[int, dict[str, tuple[float, ShareInput]]] = {}
    remaining = total
    for prio in priorities:
        bucket = [q for q in queues if q.priority == prio]
        remaining, bucket_leftovers = _divide_rounds(remaining, bucket, k_value)
        leftovers.setdefault(prio, {}).update(bucket_leftovers)
    for prio in priorities:
        if remaining <= 0:
            break
        ordered = sorted(leftovers.get(prio, {}).values(),
                         key=lambda item: (-item[0], item[1].created, item[1].name))
        for _, q in ordered:
            if remaining == 0:
                break
            chunk = min(1.0, remaining)
            q.fair_share += chunk
            remaining -= chunk
    return remaining


def _divide_rounds(
    total: float, queues: list[ShareInput], k_value: float
) -> tuple[float, dict[str, tuple[float, ShareInput]]]:
    leftovers: dict[str, tuple[float, ShareInput]] = {}
    while True:
        weights = _share_weights(queues, k_value)
        weight_sum = _add_in_order(weights.values())
        if weight_sum == 0:
            break
        amount_this_round = total
        another_round = False
        # Go iterates a map here; sorting by name keeps us deterministic (the result is the same)
        for q in sorted(queues, key=lambda q: q.name):
            if total == 0:
                break
            if q.satisfied() or q.weight == 0:
                continue
            need = q.remaining_request()
            portion = amount_this_round * weights.get(q.name, 0.0) / weight_sum
            give = 0.0
            if need <= portion:
                give = need
                leftovers.pop(q.name, None)
            else:
                floored = math.floor(portion)
                if floored > 0:
                    give = float(floored)
                if portion - give > 0:
                    leftovers[q.name] = (portion - give, q)
            if give == 0:
                continue
            q.fair_share += give
            total -= give
            another_round = another_round or need < portion
        if not another_round or total == 0:
            break
    return total, leftovers


def _share_weights(queues: list[ShareInput], k_value: float) -> dict[str, float]:
    total_weight = _add_in_order(q.weight for q in queues if q.remaining_request() > 0)
    if total_weight == 0:
        return {}
    weights: dict[str, float] = {}
    for q in queues:
        if q.satisfied():
            continue
        normalized = q.weight / total_weight
        weights[q.name] = max(0.0, normalized + k_value * (normalized - q.usage))
    return weights


def _add_in_order(values: Iterable[float]) -> float:
    """Floats added left to right, one rounding per addition: Python 3.12's `sum` compensates
    (other results on other Pythons), and the Rust core adds in order."""
    total = 0.0
    for value in values:
        total += value
    return total
