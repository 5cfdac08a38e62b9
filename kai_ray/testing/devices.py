"""Plays the NVIDIA device plugin's part for GPU reservation pods on KWOK nodes (there is no
kubelet or device plugin there): each reservation pod gets a GPU id of its node, distinct from the
other reservation pods on that node, in annotation `run.ai/reserve_for_gpu_index`. Test harness
only; the product code waits for the annotation as it would on a real cluster."""

from __future__ import annotations

import threading
from typing import Any

from kubernetes import client, watch

RESERVATION_NAMESPACE = "kai-resource-reservation"
GPU_INDEX_ANNOTATION = "run.ai/reserve_for_gpu_index"


class FakeDevicePlugin:
    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="fake-device-plugin", daemon=True)
        self._watch: watch.Watch | None = None
        self.assigned: dict[str, set[str]] = {}

    def start(self) -> FakeDevicePlugin:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self._watch is not None:
            self._watch.stop()

    def _assign(self, pod: dict[str, Any]) -> None:
        m = pod["metadata"]
        if (m.get("annotations") or {}).get(GPU_INDEX_ANNOTATION) or m.get("deletionTimestamp"):
            return
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            return
        taken = self.assigned.setdefault(node, set())
        for other in self.core.list_namespaced_pod(RESERVATION_NAMESPACE).items:
            if other.spec.node_name == node and other.metadata.annotations:
                gpu = other.metadata.annotations.get(GPU_INDEX_ANNOTATION)
                if gpu:
                    taken.add(gpu)
        index = 0
        while f"GPU-{node}-{index}" in taken:
            index += 1
        gpu = f"GPU-{node}-{index}"
        self.core.patch_namespaced_pod(m["name"], RESERVATION_NAMESPACE, {
            "metadata": {"annotations": {GPU_INDEX_ANNOTATION: gpu}}})
        taken.add(gpu)

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                self._watch = watch.Watch()
                for event in self._watch.stream(self.core.list_namespaced_pod,
                                                RESERVATION_NAMESPACE, timeout_seconds=60):
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._assign(event["raw_object"])
            except Exception:
                if self.stopping.wait(0.5):
                    return
