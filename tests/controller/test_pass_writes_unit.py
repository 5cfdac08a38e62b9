"""PassWrites: one PodGroup write per key and grouping pass, however many pods race to it; the
others wait for it and share its outcome (a failure too, so they are retried with it)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from kai_ray.controller.podgrouper import PassWrites


def test_one_write_per_key_while_many_race() -> None:
    writes = PassWrites()
    done: list[str] = []
    gate = threading.Event()

    def write(key: str) -> None:
        gate.wait(5)  # every racer has arrived before the first write finishes
        done.append(key)

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(writes.once, key, lambda k=key: write(k))
                   for key in ["ns/a"] * 6 + ["ns/b"] * 2]
        time.sleep(0.2)
        gate.set()
        wrote = [f.result(5) for f in futures]
    assert sorted(done) == ["ns/a", "ns/b"]
    assert wrote.count(True) == 2


def test_the_others_share_the_writers_failure() -> None:
    writes = PassWrites()
    started = threading.Event()

    def failing() -> None:
        started.set()
        time.sleep(0.2)
        raise RuntimeError("409 from a replace")

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(writes.once, "ns/a", failing)
        started.wait(5)
        second = pool.submit(writes.once, "ns/a", lambda: pytest.fail("written twice"))
        for f in (first, second):
            with pytest.raises(RuntimeError, match="409 from a replace"):
                f.result(5)
