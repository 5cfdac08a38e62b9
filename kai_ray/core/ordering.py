"""Which job goes next: KAI's queue order (over-utilisation, starvation, priority, dominant
resource share, ...) over the queue tree, and job order inside a leaf queue.

`JobQueue` pops jobs the way KAI's JobsOrderByQueues does: descend from the roots, at each level
take the child whose subtree's best job compares best. `reverse=True` gives the victim order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from heapq import heapify, heappop, heappush
from typing import Generic, Protocol, TypeVar

from kai_ray.core.accounting import QueueState, leq, pending_amount
from kai_ray.core.jobs import JobState, Task
from kai_ray.core.model import Amounts
from kai_ray.core.state import Session

_ZERO_SHARE_MULT = 1000.0
E = TypeVar("E", bound="Entry")


def job_request(sess: Session, job: JobState, simulation: bool = False
                ) -> Amounts:
    """The candidate request of a job: its tasks-to-allocate (pending gpu-memory via 100 MiB)."""
    return tasks_request(job.tasks_to_allocate(simulation))


def tasks_request(tasks: Iterable[Task]) -> Amounts:
    """What `tasks` ask for as pending tasks, summed in their order."""
    cpu = mem = gpu = 0.0
    for task in tasks:
        amount = pending_amount(task.req)
        cpu += amount[0]
        mem += amount[1]
        gpu += amount[2]
    return (cpu, mem, gpu)


def _share(sess: Session, q: QueueState, r: int, allocated: float) -> float:
    allocatable = q.allocatable(r)
    if allocatable == -1:
        allocatable = sess.cluster.total[r]
    return allocated * _ZERO_SHARE_MULT if allocatable == 0 else allocated / allocatable


def _dominant_share(sess: Session, q: QueueState, extra: Amounts = (0.0, 0.0, 0.0)) -> float:
    """The queue's largest share over the resources, with `extra` allocated."""
    share = 0.0
    for r in range(3):
        share = max(share, _share(sess, q, r, q.allocated[r] + extra[r]))
    return share


def _over(q: QueueState) -> bool:
    return all(q.fair_share[r] < q.allocated[r] for r in range(3))


def _zero_quota_wanted(q: QueueState, with_request: Amounts) -> bool:
    return any(q.allocatable(r) == 0 and with_request[r] > 0 for r in range(3))


def _plus(a: Sequence[float], b: Amounts) -> Amounts:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def _minus(a: Amounts, b: Amounts) -> Amounts:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2])


def compare_queues(sess: Session, lq: QueueState, rq: QueueState, lreq: Amounts, rreq: Amounts,
                   ltaken: Amounts = (0.0, 0.0, 0.0), rtaken: Amounts = (0.0, 0.0, 0.0)) -> int:
    """Negative when `lq` goes first (KAI's queue_order.go). `*taken` (victim order only)
    lower the queue's dominant share: what KAI counts as the queue's victims so far."""
    l_over, r_over = _over(lq), _over(rq)
    if l_over != r_over:
        return 1 if l_over else -1
    l_with, r_with = _plus(lq.allocated, lreq), _plus(rq.allocated, rreq)
    l_starved, r_starved = leq(l_with, lq.deserved), leq(r_with, rq.deserved)
    if l_starved != r_starved:
        return -1 if l_starved else 1
    if lq.priority != rq.priority:
        return -1 if lq.priority > rq.priority else 1
    l_zero, r_zero = _zero_quota_wanted(lq, l_with), _zero_quota_wanted(rq, r_with)
    if l_zero != r_zero:
        return 1 if l_zero else -1
    ls = _dominant_share(sess, lq, _minus(lreq, ltaken))
    rs = _dominant_share(sess, rq, _minus(rreq, rtaken))
    if ls != rs:
        return -1 if ls < rs else 1
    ls, rs = _dominant_share(sess, lq), _dominant_share(sess, rq)
    if ls != rs:
        return -1 if ls < rs else 1
    lcap = [lq.allocatable(r) for r in range(3)]
    rcap = [rq.allocatable(r) for r in range(3)]
    if leq(lcap, rcap) and not leq(rcap, lcap):
        return -1
    if leq(rcap, lcap) and not leq(lcap, rcap):
        return 1
    if lq.created != rq.created:
        return -1 if lq.created < rq.created else 1
    return -1 if lq.name < rq.name else (1 if lq.name > rq.name else 0)


class Entry(Protocol):
    """What a JobQueue holds: a job, or a victim unit standing for part of one."""

    @property
    def queue(self) -> str: ...

    @property
    def job(self) -> JobState: ...

    def order_number(self, sess: Session) -> int: ...

    def victim_amount(self) -> Amounts: ...


class JobQueue(Generic[E]):
    """Jobs waiting in a queue tree, popped in KAI order (or its reverse for victims)."""

    def __init__(self, sess: Session, items: Iterable[E], reverse: bool = False,
                 simulation: bool = False,
                 heaps: dict[str, list[tuple[int, int, E]]] | None = None) -> None:
        """`heaps`: entries (order number, sequence number, item) per queue, made by a caller
        that numbers some items otherwise than they would themselves (a victim scenario's
        preemptor): order numbers negated for `reverse`, sequence numbers 1, 2, ...; heapified
        here."""
        self.sess = sess
        self.reverse = reverse
        self.simulation = simulation
        # a job compared by another request than its own (a victim scenario's preemptor)
        self.request_of: tuple[JobState, Amounts] | None = None
        # per leaf queue, the victim amounts of the items popped from it (victim order only)
        self.popped: dict[str, Amounts] = {}
        self.heaps: dict[str, list[tuple[int, int, E]]] = {} if heaps is None else heaps
        self.seq = sum(len(heap) for heap in self.heaps.values())
        # the victim order is the job order reversed (heapq is a min-heap: numbers negated)
        sign = -1 if reverse else 1
        for item in items:
            self.seq += 1
            self.heaps.setdefault(item.queue, []).append(
                (sign * item.order_number(sess), self.seq, item))
        for heap in self.heaps.values():
            heapify(heap)

    def clone(self) -> JobQueue[E]:
        """An independent copy (heap lists are copied, so the heap order is kept)."""
        other: JobQueue[E] = JobQueue(self.sess, (), self.reverse, self.simulation)
        other.heaps = {q: list(h) for q, h in self.heaps.items()}
        other.seq = self.seq
        other.popped = dict(self.popped)
        other.request_of = self.request_of
        return other

    def live_queues(self) -> list[str]:
        """The queues that still hold an item."""
        return [name for name, heap in self.heaps.items() if heap]

    def push(self, item: E) -> None:
        number = item.order_number(self.sess)
        entry = -number if self.reverse else number
        self.seq += 1
        heappush(self.heaps.setdefault(item.queue, []), (entry, self.seq, item))

    def __bool__(self) -> bool:
        return bool(self.live_queues())

    def _request(self, item: E) -> Amounts:
        # victims are compared on what their queue holds, not on what they still want
        if self.reverse:
            return (0.0, 0.0, 0.0)
        if self.request_of is not None and item.job is self.request_of[0]:
            return self.request_of[1]
        return job_request(self.sess, item.job, self.simulation)

    def _best_in(self, queue: str) -> E | None:
        """The item that would pop next from `queue`'s subtree."""
        q = self.sess.queues[queue]
        if q.children:
            return self._pick(q.children)
        heap = self.heaps.get(queue)
        return heap[0][2] if heap else None

    def _pick(self, names: Iterable[str]) -> E | None:
        best_name: str | None = None
        best: E | None = None
        for name in names:
            cand = self._best_in(name)
            if cand is None:
                continue
            if best is None or best_name is None:
                best_name, best = name, cand
                continue
            cmp = compare_queues(self.sess, self.sess.queues[name], self.sess.queues[best_name],
                                 self._request(cand), self._request(best),
                                 self._victims(cand), self._victims(best))
            if (cmp > 0) if self.reverse else (cmp < 0):
                best_name, best = name, cand
        return best

    def pop(self) -> E | None:
        """The next item: down from the roots, at each level the child whose best item compares
        best. Items of queues missing from the tree are never popped (QueueDoesNotExist)."""
        picked = self._pick(self.sess.queues.roots())
        if picked is None:
            return None
        item = heappop(self.heaps[picked.queue])[2]
        if self.reverse:
            amount = item.victim_amount()
            old = self.popped.get(item.queue, (0.0, 0.0, 0.0))
            self.popped[item.queue] = (old[0] + amount[0], old[1] + amount[1], old[2] + amount[2])
        return item

    def _victims(self, cand: E) -> Amounts:
        """What a subtree's share is lowered by in the victim order, `cand` being the item it
        would give next: KAI (job_order_by_queue.go, VictimQueue) subtracts the jobs already
        popped from `cand`'s leaf queue and `cand` itself, at every level of the tree (a parent
        queue only by its best leaf's), each by its whole `Allocated`, even where a pop took
        only part of a job and what is left of it comes again."""
        if not self.reverse:
            return (0.0, 0.0, 0.0)
        amount = cand.victim_amount()
        popped = self.popped.get(cand.queue)
        if popped is None:
            return amount
        return (popped[0] + amount[0], popped[1] + amount[1], popped[2] + amount[2])


def pending_leaf_jobs(sess: Session) -> list[tuple[int, JobState]]:
    """Every job with a pending task in a leaf queue of the tree, with its order number, in job
    order (a job in a parent queue, or in a queue left out of the tree, is never popped)."""
    found = [(job.order_number(sess), job) for job in sess.jobs.values()
             if job.has_pending() and sess.queues.is_leaf(job.queue)]
    found.sort(key=lambda entry: entry[0])
    return found


def scenario_queue(sess: Session, wanted: list[JobState],
                   pending: list[tuple[int, JobState]] | None,
                   prefix: list[Task]) -> JobQueue[JobState]:
    """The order in which a victim scenario places its preemptor and victims again (`wanted`,
    distinct, as they are once the victims are evicted; the preemptor first). KAI pops them
    from a queue over every job with a pending task (GetJobsToAllocate); it skips the others,
    but while one of them is the first of its queue it is what that queue is compared by.
    `pending` holds those others as they were before the scenario (`pending_leaf_jobs`: it
    changes only the wanted jobs); None when the wanted jobs are all in one queue, where their
    own job order is the whole answer. The preemptor is compared by what its `prefix` asks: KAI
    puts in its place the partial job of the prefix (job_solver.go
    getPartialJobRepresentative, action.go GetJobsToAllocate)."""
    # the preemptor's partial job holds only the prefix's pending pods, each podset's minimum
    # that many: it is below its minimum (the elastic order's first rank), however many of the
    # whole job's pods run (job_solver.go getPartialJobRepresentative, elastic.go JobOrderFn)
    first = wanted[0]
    numbers = [sess.order_number((-first.priority, 0, first.created, first.name))]
    numbers += [job.order_number(sess) for job in wanted[1:]]
    heaps: dict[str, list[tuple[int, int, JobState]]] = {}
    for job, number in zip(wanted, numbers, strict=True):
        heaps.setdefault(job.queue, []).append((number, len(heaps[job.queue]), job))
    if pending is not None:
        wanted_ids = {id(job) for job in wanted}
        for number, job in pending:
            if id(job) not in wanted_ids:
                heaps.setdefault(job.queue, []).append((number, 0, job))
    seq = 0
    for heap in heaps.values():
        for i, (number, _, job) in enumerate(heap):
            seq += 1
            heap[i] = (number, seq, job)
    order: JobQueue[JobState] = JobQueue(sess, (), simulation=True, heaps=heaps)
    order.request_of = (wanted[0], tasks_request(prefix))
    return order
