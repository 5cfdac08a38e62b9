"""The KWOK GPU reporter: a dev-cluster component that plays, for KWOK nodes only, the part of
the GPU device plugin and of the reservation pod's program (`kai_ray.reservation`).

KWOK nodes run no containers, so on them no reservation pod can discover and report the GPU it
holds. This process watches reservation pods bound to KWOK nodes and writes what the program
would: a GPU id of that node, distinct from the other reservation pods' on it, in annotation
`run.ai/reserve_for_gpu_index`. Pods on any other node (a real kubelet node, a real cluster) are
left to their own program. It is part of the local cluster (`kai_ray.testing.plane` starts it
beside KWOK), never of kai-ray itself: the scheduler waits for the annotation as it does on a
real cluster.

    python3 -m kai_ray.testing.devices --kubeconfig PATH
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from kai_ray.api_names import RESERVATION_NAMESPACE
from kai_ray.reservation import GPU_INDEX_ANNOTATION
from kai_ray.testing.nodes import KWOK_NODE_ANNOTATION

# a KWOK node annotated so stands for a node whose device plugin or reservation image is broken:
# its reservation pods never report (tests of what the scheduler does then)
SILENT_ANNOTATION = ("kai-ray.io/kwok-gpu-reporter", "off")
log = logging.getLogger("kwok-gpu-reporter")


class KwokGpuReporter:
    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.stopping = threading.Event()
        self._watch: watch.Watch | None = None
        self._kwok_nodes: dict[str, bool] = {}
        self.reported = 0

    def stop(self) -> None:
        self.stopping.set()
        if self._watch is not None:
            self._watch.stop()

    def _is_kwok(self, node: str) -> bool:
        if node not in self._kwok_nodes:
            try:
                ann = self.core.read_node(node).metadata.annotations or {}
            except ApiException as e:
                if e.status == 404:
                    return False
                raise
            self._kwok_nodes[node] = (
                ann.get(KWOK_NODE_ANNOTATION[0]) == KWOK_NODE_ANNOTATION[1]
                and ann.get(SILENT_ANNOTATION[0]) != SILENT_ANNOTATION[1])
        return self._kwok_nodes[node]

    def _report(self, pod: dict[str, Any]) -> None:
        m = pod["metadata"]
        if (m.get("annotations") or {}).get(GPU_INDEX_ANNOTATION) or m.get("deletionTimestamp"):
            return
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or not self._is_kwok(node):
            return
        taken = set()
        for other in self.core.list_namespaced_pod(RESERVATION_NAMESPACE).items:
            gpu = (other.metadata.annotations or {}).get(GPU_INDEX_ANNOTATION)
            if other.metadata.name == m["name"] and gpu:
                # an event older than our own patch (the pod's status moved meanwhile): it has
                # reported; a second report would move a device the binder already handed out
                return
            if other.spec.node_name == node and gpu:
                taken.add(gpu)
        index = 0
        while f"GPU-{node}-{index}" in taken:
            index += 1
        gpu = f"GPU-{node}-{index}"
        self.core.patch_namespaced_pod(m["name"], RESERVATION_NAMESPACE, {
            "metadata": {"annotations": {GPU_INDEX_ANNOTATION: gpu}}})
        self.reported += 1
        log.info("reservation pod %s on KWOK node %s: reported %s", m["name"], node, gpu)

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self._watch = watch.Watch()
                for event in self._watch.stream(self.core.list_namespaced_pod,
                                                RESERVATION_NAMESPACE, timeout_seconds=60,
                                                _request_timeout=90):
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._report(event["raw_object"])
            except Exception as e:  # the API server restarting, a pod deleted meanwhile
                log.warning("watch interrupted (%s); restarting", e)
                if self.stopping.wait(0.5):
                    return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m kai_ray.testing.devices",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    reporter = KwokGpuReporter(config.new_client_from_config(args.kubeconfig))
    signal.signal(signal.SIGTERM, lambda *_: reporter.stop())
    thread = threading.Thread(target=reporter.run, daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.5)
        if reporter.stopping.is_set():
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
