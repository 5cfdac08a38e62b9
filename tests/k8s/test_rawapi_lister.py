"""`rawapi.lister`: the cache's lists and watches as plain GETs, with the generated methods'
arguments and answers (the raw response; ApiException on a refusal)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import orjson
import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.k8s import rawapi
from kai_ray.k8s.cache import Informer
from tests.k8s.local_http import JsonHandler, serving

SEEN: list[str] = []


class _Server(JsonHandler):
    def answer(self, body: dict) -> tuple[int, bytes]:
        SEEN.append(self.path)
        if self.path.startswith("/api/v1/missing"):
            return 404, json.dumps({"kind": "Status", "code": 404, "reason": "NotFound"}).encode()
        if "continue=" not in self.path:
            page = {"metadata": {"continue": "t1", "resourceVersion": "5"},
                    "items": [{"metadata": {"name": "a", "namespace": "n"}}]}
        else:
            page = {"metadata": {"resourceVersion": "7"},
                    "items": [{"metadata": {"name": "b", "namespace": "n"}}]}
        return 200, json.dumps(page).encode()


@pytest.fixture
def api() -> Iterator[client.ApiClient]:
    SEEN.clear()
    with serving(_Server) as url:
        cfg = client.Configuration()
        cfg.host = url
        yield client.ApiClient(cfg)


def test_query_carries_the_generated_methods_arguments(api: client.ApiClient) -> None:
    lister = rawapi.lister(api, "/api/v1/pods")
    resp = lister(_preload_content=False, limit=500, _continue="tok",
                  allow_watch_bookmarks=True, timeout_seconds=3)
    assert orjson.loads(resp.data)["items"][0]["metadata"]["name"] == "b"
    path = SEEN[-1]
    assert path.startswith("/api/v1/pods?")
    assert sorted(path.split("?", 1)[1].split("&")) == [
        "allowWatchBookmarks=true", "continue=tok", "limit=500", "timeoutSeconds=3"]


def test_a_refusal_is_an_api_exception_with_its_status(api: client.ApiClient) -> None:
    with pytest.raises(ApiException) as e:
        rawapi.lister(api, "/api/v1/missing")(_preload_content=False, limit=1)
    assert e.value.status == 404


def test_an_unknown_argument_is_an_error_not_dropped(api: client.ApiClient) -> None:
    with pytest.raises(TypeError, match="label_selector"):
        rawapi.lister(api, "/api/v1/pods")(_preload_content=False, label_selector="a=b")


def test_an_informer_lists_every_page_through_it(api: client.ApiClient) -> None:
    inf = Informer("pods", rawapi.lister(api, "/api/v1/pods"), lambda *_: None)
    assert inf._list() == "7"
    assert sorted(inf.items) == ["n/a", "n/b"]
    assert "continue=t1" in SEEN[-1] and "limit=" in SEEN[-1]
