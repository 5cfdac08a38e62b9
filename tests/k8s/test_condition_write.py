"""A pod's PodScheduled condition goes out as a plain request: the first cycles write it for
gangs that still miss pods, and loading CoreV1Api for it (every core model) held the scheduling
loop for over a second right after start-up (benchmarks/gang_latency.py's first gangs)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

_WRITE = """
import json, sys
from kubernetes import client
from kai_ray.k8s.status import not_scheduled
api = client.ApiClient(client.Configuration(host=sys.argv[1]))
pod = {"metadata": {"name": "p", "namespace": "ns"}}
not_scheduled(api, pod, "Unschedulable", "2 of 4 pods exist")
print(json.dumps("kubernetes.client.api.core_v1_api" in sys.modules))
"""


class _Server(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, Any]]] = []  # the requests it was sent

    def do_PATCH(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append({"path": self.path, "type": self.headers["Content-Type"],
                          "body": json.loads(body)})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *_: Any) -> None:
        pass


def test_the_condition_is_a_strategic_merge_patch_of_the_status_without_core_v1_api() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proc = subprocess.run([sys.executable, "-c", _WRITE,
                               f"http://127.0.0.1:{server.server_port}"],
                              capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) is False, "CoreV1Api was imported to write a condition"
    [write] = _Server.seen
    assert write["path"] == "/api/v1/namespaces/ns/pods/p/status"
    # merged by the condition's type: the pod's other conditions stay
    assert write["type"] == "application/strategic-merge-patch+json"
    [cond] = write["body"]["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"], cond["message"]) == (
        "PodScheduled", "False", "Unschedulable", "2 of 4 pods exist")
