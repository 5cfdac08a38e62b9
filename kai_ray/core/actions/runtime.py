"""Min-runtime protection of victims (KAI's preemptMinRuntime and reclaimMinRuntime)."""

from __future__ import annotations

from kai_ray.core.jobs import JobState
from kai_ray.core.state import Session


def _resolve(sess: Session, queue: str, kind: str) -> float:
    for q in sess.queues.path(queue):
        value = q.preempt_min_runtime if kind == "preempt" else q.reclaim_min_runtime
        if value is not None:
            return value
    cfg = sess.config
    return cfg.default_preempt_min_runtime_s if kind == "preempt" else \
        cfg.default_reclaim_min_runtime_s


def protected(sess: Session, job: JobState, kind: str, reclaimer_queue: str | None = None) -> bool:
    """True when a non-elastic victim started too recently to be evicted."""
    if job.last_start is None:
        return False
    minimum = _resolve(sess, job.queue, kind)
    if minimum <= 0 or sess.now >= job.last_start + minimum:
        return False
    # an elastic job may still lose its extra pods; only its gang minimum is protected
    return job.elastic_rank() != 2
