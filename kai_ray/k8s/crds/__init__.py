"""KAI-compatible CustomResourceDefinitions (Queue, PodGroup, BindRequest), written once as YAML.

The same files are installed by the test control plane, the dev cluster and the Helm chart.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

#: file names in install order (Queue first: PodGroups name queues)
CRD_FILES: tuple[str, ...] = ("queues.yaml", "podgroups.yaml", "bindrequests.yaml")


def crd_texts() -> dict[str, str]:
    """The raw YAML of every CRD file, by file name."""
    pkg = resources.files(__name__)
    return {name: pkg.joinpath(name).read_text(encoding="utf-8") for name in CRD_FILES}


def crd_manifests() -> list[dict[str, Any]]:
    """The parsed CustomResourceDefinition objects, ready to create."""
    return [yaml.safe_load(text) for text in crd_texts().values()]


def crd_names() -> list[str]:
    """metadata.name of every CRD (e.g. queues.scheduling.run.ai)."""
    return [str(m["metadata"]["name"]) for m in crd_manifests()]
