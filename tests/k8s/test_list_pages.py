"""An informer's list in pages: the next page is asked for while the current one is parsed
(its continue token read from the head of the page), and what the parsed page says decides."""

from __future__ import annotations

import threading
from typing import Any

import orjson
import pytest
from kubernetes.client.rest import ApiException

from kai_ray.k8s.cache import Informer, _continue_token


class _Resp:
    def __init__(self, data: bytes) -> None:
        self.data = data


def _page(names: list[str], token: str | None, metadata_last: bool = False,
          head_token: str | None = None) -> bytes:
    """A list page as the API server writes it (kind, apiVersion, metadata, items), or with its
    metadata after the items; `head_token`: a first metadata key with another token (a JSON
    object with the key twice: the parser keeps the last)."""
    items = ",".join(orjson.dumps({"metadata": {"name": n, "namespace": "ns"}}).decode()
                     for n in names)
    meta = orjson.dumps({"resourceVersion": "9", **({"continue": token} if token else {})})
    head = '{"kind":"PodList","apiVersion":"v1",'
    if head_token is not None:
        head += f'"metadata":{{"continue":"{head_token}"}},'
    if metadata_last:
        return f'{head}"items":[{items}],"metadata":{meta.decode()}}}'.encode()
    return f'{head}"metadata":{meta.decode()},"items":[{items}]}}'.encode()


class _Pages:
    """list_fn over `pages` (token -> page bytes or an exception), recording each token asked."""

    def __init__(self, pages: dict[str | None, Any]) -> None:
        self.pages = pages
        self.asked: list[str | None] = []
        self.asked_event: dict[str | None, threading.Event] = {t: threading.Event() for t in pages}

    def __call__(self, **kw: Any) -> _Resp:
        token = kw.get("_continue")
        self.asked.append(token)
        self.asked_event.setdefault(token, threading.Event()).set()
        page = self.pages[token]
        if isinstance(page, Exception):
            raise page
        return _Resp(page)


def test_the_token_is_read_from_the_head_of_a_page_only() -> None:
    assert _continue_token(_page(["a"], "dG9rZW4=")) == "dG9rZW4="
    assert _continue_token(_page(["a"], None)) is None
    # metadata after the items: not guessed (an item's own fields are never read as one)
    assert _continue_token(_page(["a"], "t1", metadata_last=True)) is None


def test_the_next_page_is_asked_for_before_this_one_is_parsed() -> None:
    pages = _Pages({None: _page(["a", "b"], "t1"), "t1": _page(["c"], "t2"),
                    "t2": _page(["d"], None)})
    seen_ahead: list[bool] = []
    daemons: list[bool] = []

    def transform(obj: dict) -> dict:
        if obj["metadata"]["name"] == "a":  # page one's items: page two must be on its way
            seen_ahead.append(pages.asked_event["t1"].wait(5))
            # on a daemon thread: a page still downloading never holds the process at exit
            fetchers = [t for t in threading.enumerate() if t.name == "list-pods"]
            daemons.extend(t.daemon for t in fetchers)
        return obj

    inf = Informer("pods", pages, lambda *_: None, transform=transform)
    assert inf._list() == "9"
    assert sorted(inf.items) == ["ns/a", "ns/b", "ns/c", "ns/d"]
    assert seen_ahead == [True]
    assert all(daemons)
    assert pages.asked == [None, "t1", "t2"]


def test_without_a_token_in_the_head_the_pages_are_read_in_turn() -> None:
    pages = _Pages({None: _page(["a"], "t1", metadata_last=True),
                    "t1": _page(["b"], None, metadata_last=True)})
    inf = Informer("pods", pages, lambda *_: None)
    inf._list()
    assert sorted(inf.items) == ["ns/a", "ns/b"]
    assert pages.asked == [None, "t1"]


def test_a_guess_the_parsed_page_contradicts_is_not_used() -> None:
    # the head names "wrong" (asked for ahead), the page's metadata "t1": t1 is read
    pages = _Pages({None: _page(["a"], "t1", head_token="wrong"),
                    "wrong": _page(["x"], None), "t1": _page(["b"], None)})
    inf = Informer("pods", pages, lambda *_: None)
    inf._list()
    assert sorted(inf.items) == ["ns/a", "ns/b"]
    assert "t1" in pages.asked


def test_a_refused_page_fails_the_list_as_before() -> None:
    # an expired continue token (410): the list fails and the informer lists again
    pages = _Pages({None: _page(["a"], "t1"), "t1": ApiException(status=410, reason="Gone")})
    inf = Informer("pods", pages, lambda *_: None)
    with pytest.raises(ApiException) as e:
        inf._list()
    assert e.value.status == 410
    assert inf.items == {}
