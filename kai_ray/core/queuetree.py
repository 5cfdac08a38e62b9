"""Parent cycles in the queue tree.

A queue whose parent chain comes back to it (its own parent, A -> B -> A, longer) never reaches
a root: the session leaves it out, with every queue under it, as it leaves out orphans (parent
missing), and their jobs stay pending with reason `QueueParentCycle`. The API server refuses a
queue that names itself (the Queue CRD's rule), not a longer cycle: `queue_cycles` is what the
Kubernetes layer reports on each Queue of one. The Rust core (native/core/src/queuetree.rs)
finds and words them alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kai_ray.core.model import Queue

QUEUE_PARENT_CYCLE = "QueueParentCycle"


def parent_links(queues: Iterable[Queue]) -> dict[str, str]:
    """Each queue's parent by name, "" for a root; a later queue of a name replaces the earlier
    one, as the session reads them."""
    return {q.name: q.parent or "" for q in queues}


def cycles_of(parents: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """Each queue on a parent cycle -> the cycle from that queue on, parent after parent (a
    self-parent's is just itself). Sorted by name; the tuples depend only on the links."""
    cycles: dict[str, tuple[str, ...]] = {}
    done: set[str] = set()
    for start in parents:
        # follow parents until a root, a missing parent, a queue seen on an earlier walk, or
        # one seen on this walk: a cycle (each queue has one parent, so at most one per walk)
        on_walk: dict[str, int] = {}
        walk: list[str] = []
        at = start
        while at and at in parents and at not in done and at not in on_walk:
            on_walk[at] = len(walk)
            walk.append(at)
            at = parents[at]
        if at in on_walk:
            loop = walk[on_walk[at]:]
            for i, name in enumerate(loop):
                cycles[name] = tuple(loop[i:] + loop[:i])
        done.update(walk)
    return dict(sorted(cycles.items()))


def under_cycles(parents: Mapping[str, str],
                 cycles: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    """Each queue not on a cycle whose parent chain reaches one -> the first queue of the cycle
    it reaches. Sorted by name."""
    reaches: dict[str, str] = {}  # "" for a chain that ends (root or missing parent)
    for start in parents:
        walk: list[str] = []
        at = start
        while at and at in parents and at not in cycles and at not in reaches:
            walk.append(at)
            at = parents[at]
        top = at if at in cycles else reaches.get(at, "")
        for name in walk:
            reaches[name] = top
    return {name: top for name, top in sorted(reaches.items()) if top}


_WAIT = ": left out of the queue tree until a spec.parentQueue on the cycle changes"


def _chain(cycle: tuple[str, ...]) -> str:
    return " -> ".join((*cycle, cycle[0]))


def excluded_queues(parents: Mapping[str, str]) -> dict[str, str]:
    """Each queue the session leaves out for a parent cycle (on one, or under one) -> why, as
    its jobs' pending message says it."""
    cycles = cycles_of(parents)
    out = {name: f"Queue '{name}' is on a parent cycle ({_chain(cycle)}){_WAIT}"
           for name, cycle in cycles.items()}
    for name, top in under_cycles(parents, cycles).items():
        out[name] = (f"Queue '{name}' is under queue '{top}', which is on a parent cycle "
                     f"({_chain(cycles[top])}){_WAIT}")
    return out


def queue_cycles(queues: Iterable[Queue]) -> dict[str, tuple[str, ...]]:
    """Each Queue on a parent cycle -> the cycle's queue names from it on, in parent order (a
    self-parent: `(name,)`; A -> B -> A: A: (A, B), B: (B, A)); sorted by name. The queues under
    a cycle are left out too but are not on it: only the cycle's own Queues need a change."""
    return cycles_of(parent_links(queues))
