"""The one quiet PodGroup annotation write (rawapi.annotate_quietly) that the binder's last-start
stamp and the status writer's stale marks share: a merge patch of the annotations, a deleted
PodGroup (404) ignored, other refusals logged and never raised. Against a local HTTP server."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import ClassVar

import pytest
from kubernetes import client

from kai_ray import api_names
from kai_ray.api_names import PODGROUP
from kai_ray.core.result import Bind, CycleResult
from kai_ray.k8s import rawapi
from kai_ray.k8s.binder import Binder
from kai_ray.k8s.events import EventRecorder
from kai_ray.k8s.status import StatusWriter
from tests.k8s.local_http import JsonHandler, serving

PG_PATH = PODGROUP.path("ns", "pg-1")


class _Server(JsonHandler):
    """Answers every request with 2xx, except PodGroup patches: `pg_status`."""

    hits: ClassVar[list[tuple[str, str, str, dict]]] = []
    pg_status: ClassVar[int] = 200

    def answer(self, body: dict) -> tuple[int, bytes]:
        type(self).hits.append((self.command, self.path, self.headers.get("Content-Type", ""),
                                body))
        code = 201 if self.command == "POST" else 200
        if self.command == "PATCH" and self.path.startswith(PG_PATH):
            code = type(self).pg_status
        return code, json.dumps({"kind": "Status", "code": code}).encode()


@pytest.fixture
def api() -> Iterator[client.ApiClient]:
    _Server.hits = []
    _Server.pg_status = 200
    with serving(_Server) as url:
        cfg = client.Configuration()
        cfg.host = url
        yield client.ApiClient(cfg)


def _pg() -> dict:
    return {"metadata": {"name": "pg-1", "namespace": "ns", "annotations": {}}}


def _pg_patches() -> list[tuple[str, dict]]:
    return [(ctype, body) for method, path, ctype, body in _Server.hits
            if method == "PATCH" and path == PG_PATH]


def test_writes_a_merge_patch_of_the_annotations(api: client.ApiClient) -> None:
    assert rawapi.annotate_quietly(api, PODGROUP, _pg(),
                                   {"a": "1", "b": None})
    assert _pg_patches() == [(rawapi.MERGE_PATCH,
                              {"metadata": {"annotations": {"a": "1", "b": None}}})]


@pytest.mark.parametrize("status,logged", [(404, False), (409, True), (500, True)])
def test_refusals_are_never_raised_and_only_a_deleted_object_is_silent(
        api: client.ApiClient, caplog: pytest.LogCaptureFixture, status: int,
        logged: bool) -> None:
    _Server.pg_status = status
    with caplog.at_level(logging.WARNING, logger="kai_ray"):
        assert not rawapi.annotate_quietly(api, PODGROUP,
                                           _pg(), {"a": "1"})
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ([f"PodGroup pg-1 annotations ['a'] not written: {status}"] if logged
                        else [])


@pytest.mark.parametrize("status", [200, 404, 500])
def test_status_writer_stale_marks_go_through_it(api: client.ApiClient,
                                                 caplog: pytest.LogCaptureFixture,
                                                 status: int) -> None:
    _Server.pg_status = status
    writer = StatusWriter(api, EventRecorder(api))
    result = CycleResult(stale_set={"pg-1": 0.0})
    with caplog.at_level(logging.WARNING, logger="kai_ray"):
        writer.stale(result, {"pg-1": _pg()})
    assert _pg_patches() == [(rawapi.MERGE_PATCH, {"metadata": {"annotations": {
        api_names.STALE_ANNOTATION: "1970-01-01T00:00:00Z"}}})]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ([f"PodGroup pg-1 annotations ['{api_names.STALE_ANNOTATION}'] not "
                         f"written: {status}"] if status == 500 else [])


@pytest.mark.parametrize("status", [200, 404, 500])
def test_binder_last_start_stamp_goes_through_it(api: client.ApiClient,
                                                 caplog: pytest.LogCaptureFixture,
                                                 status: int) -> None:
    _Server.pg_status = status
    events = EventRecorder(api)
    binder = Binder(api, events)
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {}}
    result = CycleResult(binds=[Bind(job="pg-1", namespace="ns", pod="p", node="n1")])
    with caplog.at_level(logging.WARNING, logger="kai_ray"):
        bound = binder.apply_binds(result, {"pg-1": _pg()}, {"ns/p": pod}, starting={"pg-1"})
    events.flush(5)
    assert bound == 1  # a refused stamp does not undo the bind
    ((_ctype, body),) = _pg_patches()
    assert list(body["metadata"]["annotations"]) == [api_names.LAST_START_ANNOTATION]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ([f"PodGroup pg-1 annotations ['{api_names.LAST_START_ANNOTATION}'] not "
                         f"written: {status}"] if status == 500 else [])
