"""The writes a scheduler makes in its first cycles go out as plain requests: a pod's
PodScheduled condition (written for gangs that still miss pods) and an eviction. Loading
CoreV1Api for either (every core model) held the scheduling loop for over a second the first time
(benchmarks/gang_latency.py's first gangs waited 1-2 s)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

_CONDITION = """
from kai_ray.k8s.status import not_scheduled
not_scheduled(api, {"metadata": {"name": "p", "namespace": "ns"}}, "Unschedulable",
              "2 of 4 pods exist")
"""
_EVICTION = """
from kai_ray.k8s.rawapi import evict
evict(api, "ns", "p")
"""


class _Server(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, Any]]] = []  # the requests it was sent

    def _record(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append({"method": self.command, "path": self.path,
                          "type": self.headers["Content-Type"], "body": json.loads(body)})
        self.send_response(201 if self.command == "POST" else 200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    do_PATCH = do_POST = _record

    def log_message(self, *_: Any) -> None:
        pass


def _write(code: str) -> dict[str, Any]:
    """`code` run in a fresh interpreter against a local server (`api` pointing at it); the one
    request it made. Fails if it imported CoreV1Api."""
    _Server.seen.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    prelude = ("import json, sys\nfrom kubernetes import client\n"
               "api = client.ApiClient(client.Configuration(host=sys.argv[1]))\n")
    after = '\nprint(json.dumps("kubernetes.client.api.core_v1_api" in sys.modules))\n'
    try:
        proc = subprocess.run([sys.executable, "-c", prelude + code + after,
                               f"http://127.0.0.1:{server.server_port}"],
                              capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) is False, "CoreV1Api was imported for the write"
    [request] = _Server.seen
    return request


def test_the_condition_is_a_strategic_merge_patch_of_the_status() -> None:
    write = _write(_CONDITION)
    assert (write["method"], write["path"]) == ("PATCH", "/api/v1/namespaces/ns/pods/p/status")
    # merged by the condition's type: the pod's other conditions stay
    assert write["type"] == "application/strategic-merge-patch+json"
    [cond] = write["body"]["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"], cond["message"]) == (
        "PodScheduled", "False", "Unschedulable", "2 of 4 pods exist")


def test_an_eviction_is_posted_to_the_pods_eviction_subresource() -> None:
    write = _write(_EVICTION)
    assert (write["method"], write["path"]) == ("POST", "/api/v1/namespaces/ns/pods/p/eviction")
    assert write["body"] == {"apiVersion": "policy/v1", "kind": "Eviction",
                             "metadata": {"name": "p", "namespace": "ns"}}
