"""`kai-ray apply-crds`: server-side apply of kai-ray's CRDs (the chart's pre-upgrade hook).

Helm installs a chart's crds/ once and never upgrades them; this applies the CRDs shipped with
this version of kai_ray (the same files as the chart's crds/) with field manager `kai-ray`,
forcing ownership of fields another manager (e.g. Helm's first install) wrote.
"""

from __future__ import annotations

import argparse
import sys

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.k8s.client import api_client
from kai_ray.k8s.crds import crd_texts

FIELD_MANAGER = "kai-ray"


def apply_crds(api: client.ApiClient) -> list[str]:
    """Apply every CRD; returns their names. Raises ApiException naming the failing CRD."""
    ext = client.ApiextensionsV1Api(api)
    names = []
    for text in crd_texts().values():
        body = yaml.safe_load(text)
        name = body["metadata"]["name"]
        try:
            ext.patch_custom_resource_definition(
                name, body, field_manager=FIELD_MANAGER, force=True,
                _content_type="application/apply-patch+yaml")
        except ApiException as e:
            raise RuntimeError(f"CustomResourceDefinition {name}: server-side apply failed: "
                               f"HTTP {e.status} {e.reason}") from e
        names.append(name)
    return names


def cmd_apply_crds(args: argparse.Namespace) -> int:
    try:
        names = apply_crds(api_client(getattr(args, "kubeconfig", None)))
    except RuntimeError as e:
        print(f"kai-ray apply-crds: {e}", file=sys.stderr)
        return 1
    for name in names:
        print(f"customresourcedefinition/{name} serverside-applied")
    return 0
