"""The pod admission webhook: kopf's HTTPS server, the pure rules of ``grouping/admission.py``.

    handle = start_webhook(kubeconfig, WebhookConfig(grouping=GroupingConfig(validate_queue=True)))
    handle.wait_ready(30)      # server up, configurations written, API server calling us
    ...
    handle.stop()              # or stop(remove_configuration=True)

What runs (kopf embedded with ``kopf.operator()`` in a thread with its own event loop, standalone,
with a private registry so it never mixes with other kopf handlers of the process):

- ``validate-pod`` (``kopf.on.validate``, CREATE and UPDATE): on CREATE
  ``admission.validate_pod`` with the Queue tree and namespace labels from two list/watch caches;
  on UPDATE ``admission.validate_pod_update`` (a scheduler-owned annotation set or changed, or a
  changed GPU-sharing annotation that breaks the rules). A denial carries the rule's message
  (``gpu-fraction annotation value must be ...``, ``queue 'x' does not exist``, ``annotation
  kai-ray.io/bind-intent is written only by the scheduler ...``). UPDATEs by the users in
  ``WebhookConfig.exempt_updaters`` (the scheduler's own identity) never reach the webhook (a
  match condition), so the scheduler's pod patches never wait on it.
- ``mutate-pod`` (``kopf.on.mutate``, CREATE only): ``admission.mutate_pod``'s JSON patch (env
  ``valueFrom.configMapKeyRef`` to the pod's GPU ConfigMap) for fractional / gpu-memory pods.
  Pods whose GPU request is invalid are left alone here; the validator rejects them.

Why kopf does not *manage* the webhook configurations itself (``settings.admission.managed``):
its generated configuration has no ``matchConditions``, so every pod of the cluster would call
us, and with ``failurePolicy: Fail`` a stopped webhook would block all pod creation. Instead the
server subclass below writes a Validating- and a MutatingWebhookConfiguration each time kopf's
server yields its client config (URL + CA bundle), with a CEL match condition on
``spec.schedulerName``: only our scheduler's pods ever reach the webhook, so other pods are
never affected by it being down, while our pods fail closed (no unvalidated fraction gets in).

kopf remembers a memo per object for every non-CREATE admission call and forgets it only when
its watch sees the object deleted; the webhook watches nothing, so it runs kopf with memories
that are never kept (``_NoMemories``): a pod UPDATE does not grow the process.

The certificate is self-signed (``cryptography``; kopf's own generator needs ``certbuilder``,
which is not installed), for 127.0.0.1 by default, and is the CA bundle of the configurations.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import json
import logging
import os
import re
import secrets
import string
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import kopf
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kopf._core.reactor.inventory import ResourceMemories, ResourceMemory
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from kai_ray.api_names import QUEUE
from kai_ray.grouping import admission
from kai_ray.grouping.config import GroupingConfig
from kai_ray.k8s import rawapi
from kai_ray.k8s.cache import Informer

log = logging.getLogger(__name__)

VALIDATE_ID = "validate-pod"
MUTATE_ID = "mutate-pod"
_SUFFIX_ALPHABET = string.ascii_lowercase + string.digits
_DNS1123 = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
# a Kubernetes username safe inside a CEL string literal (service accounts, users, nodes)
_USERNAME = re.compile(r"[A-Za-z0-9@._:/-]+")


# a matchCondition: a CREATE, or an UPDATE whose annotations differ from the old object's
UPDATE_CHANGES_ANNOTATIONS = (
    "request.operation != 'UPDATE' || "
    "object.metadata.?annotations.orValue({}) != oldObject.metadata.?annotations.orValue({})")


@dataclass(frozen=True)
class WebhookConfig:
    """How the webhook serves and registers itself; ``grouping`` holds the admission rules."""

    grouping: GroupingConfig = field(default_factory=GroupingConfig)
    addr: str = "127.0.0.1"  # listening address, also the URL host the API server calls
    port: int = 0  # 0: a free port
    certfile: str | None = None  # with keyfile: serve this certificate instead of a self-signed
    keyfile: str | None = None
    configuration_name: str = "kai-ray-admission"  # both configurations are named so
    failure_policy: str = "Fail"  # for our scheduler's pods only (see the module docstring)
    timeout_seconds: int = 5  # per call; the API server's limit is 30
    namespace_selector: Mapping[str, Any] | None = None  # e.g. to exclude namespaces
    remove_configuration_on_stop: bool = False
    # wait_ready() dry-runs an invalid pod here until the API server reports our denial
    probe_namespace: str = "default"
    # in cluster: the configurations name this Service (namespace, name, port) instead of a URL
    service: tuple[str, str, int] | None = None
    # False: someone else (the Helm chart) owns the configurations; the webhook only serves,
    # so it needs no RBAC on webhook configurations or pods, and wait_ready() does not probe
    manage_configurations: bool = True
    # usernames whose pod UPDATEs the API server does not send us (a match condition): the
    # scheduler's own (e.g. system:serviceaccount:kai-ray:kai-ray-scheduler), so its patches of
    # pods (grouping annotation, GPU-group labels) never depend on the webhook being up
    exempt_updaters: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.failure_policy not in ("Fail", "Ignore"):
            raise ValueError(f"WebhookConfig.failure_policy: {self.failure_policy!r} is not "
                             "'Fail' or 'Ignore'")
        if not 1 <= self.timeout_seconds <= 30:
            raise ValueError(f"WebhookConfig.timeout_seconds: {self.timeout_seconds} is not in "
                             "1..30 (the API server's range)")
        if not _DNS1123.fullmatch(self.grouping.scheduler_name):
            raise ValueError(f"GroupingConfig.scheduler_name: {self.grouping.scheduler_name!r} "
                             "is not a DNS-1123 name")
        for user in self.exempt_updaters:
            if not _USERNAME.fullmatch(user):
                raise ValueError(f"WebhookConfig.exempt_updaters: {user!r} is not a username")


# -- certificate ------------------------------------------------------------------------------
def self_signed_certificate(hostnames: Collection[str], password: str | None = None,
                            days: int = 365) -> tuple[bytes, bytes]:
    """PEM ``(certificate, private key)`` valid for ``hostnames`` (IPs become IP SANs).

    The certificate is its own CA (the API server is given it as the caBundle).
    """
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for h in dict.fromkeys(hostnames):  # ordered, deduplicated
        try:
            ip = ipaddress.ip_address(h)
        except ValueError:
            sans.append(x509.DNSName(h))
        else:
            if not ip.is_unspecified:
                sans.append(x509.IPAddress(ip))
    if not sans:
        raise ValueError(f"no usable hostname for the webhook certificate in {list(hostnames)}")
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kai-ray-webhook")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_encipherment=True, key_cert_sign=True,
            content_commitment=False, data_encipherment=False, key_agreement=False,
            crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(key, hashes.SHA256())
    )
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode()) if password
        else serialization.NoEncryption())
    key_pem = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.PKCS8, encryption)
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


# -- webhook configurations -------------------------------------------------------------------
def webhook_configurations(config: WebhookConfig, url: str, ca_bundle: str | None,
                           ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The (validating, mutating) configuration manifests pointing at ``url``."""

    def hook(handler_id: str, kind: str) -> dict[str, Any]:
        client_config: dict[str, Any]
        if config.service is not None:
            namespace, name, port = config.service
            client_config = {"service": {"namespace": namespace, "name": name,
                                         "path": f"/{handler_id}", "port": port}}
        else:
            client_config = {"url": f"{url.rstrip('/')}/{handler_id}"}
        if ca_bundle:
            client_config["caBundle"] = ca_bundle
        scheduler = config.grouping.scheduler_name
        webhook: dict[str, Any] = {
            "name": f"{kind}.pods.{config.configuration_name}.kai-ray.run.ai",
            "clientConfig": client_config,
            # validation sees UPDATEs too (no forged scheduler annotation, no broken fraction
            # edited in later); the mutation only adds what a new pod needs
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                       "operations": ["CREATE", "UPDATE"] if kind == "validate" else ["CREATE"],
                       "scope": "Namespaced"}],
            "matchConditions": [{
                "name": "scheduler-name",
                "expression": f"has(object.spec.schedulerName) && "
                              f"object.spec.schedulerName == '{scheduler}'",
            }],
            "failurePolicy": config.failure_policy,
            "matchPolicy": "Equivalent",
            "sideEffects": "None",
            "timeoutSeconds": config.timeout_seconds,
            "admissionReviewVersions": ["v1"],
        }
        if kind == "validate":
            # an UPDATE reaches the webhook only when it changes annotations (all it checks on
            # UPDATE): a stopped webhook then never blocks label edits, ownerReference changes
            # by the garbage collector or finalizer removals
            webhook["matchConditions"].append({
                "name": "annotations-changed",
                "expression": UPDATE_CHANGES_ANNOTATIONS,
            })
        if kind == "validate" and config.exempt_updaters:
            users = ", ".join(f"'{u}'" for u in config.exempt_updaters)
            webhook["matchConditions"].append({
                "name": "not-an-exempt-update",
                "expression": f"request.operation != 'UPDATE' || "
                              f"!(request.userInfo.username in [{users}])",
            })
        if config.namespace_selector is not None:
            webhook["namespaceSelector"] = dict(config.namespace_selector)
        if kind == "mutate":
            webhook["reinvocationPolicy"] = "Never"
        return webhook

    meta = {"name": config.configuration_name,
            "labels": {"app.kubernetes.io/managed-by": "kai-ray"}}
    validating = {"apiVersion": "admissionregistration.k8s.io/v1",
                  "kind": "ValidatingWebhookConfiguration", "metadata": meta,
                  "webhooks": [hook(VALIDATE_ID, "validate")]}
    mutating = {"apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingWebhookConfiguration", "metadata": dict(meta),
                "webhooks": [hook(MUTATE_ID, "mutate")]}
    return validating, mutating


def _apply(create: Any, replace: Any, read: Any, body: dict[str, Any]) -> None:
    name = body["metadata"]["name"]
    try:
        create(body)
    except ApiException as e:
        if e.status != 409:
            raise
        current = read(name)
        body = {**body, "metadata": {**body["metadata"],
                                     "resourceVersion": current.metadata.resource_version}}
        replace(name, body)


def apply_configurations(api: client.ApiClient, config: WebhookConfig, url: str,
                         ca_bundle: str | None) -> None:
    """Create or replace both configurations (idempotent)."""
    adm = client.AdmissionregistrationV1Api(api)
    validating, mutating = webhook_configurations(config, url, ca_bundle)
    _apply(adm.create_validating_webhook_configuration,
           adm.replace_validating_webhook_configuration,
           adm.read_validating_webhook_configuration, validating)
    _apply(adm.create_mutating_webhook_configuration,
           adm.replace_mutating_webhook_configuration,
           adm.read_mutating_webhook_configuration, mutating)


def remove_configurations(api: client.ApiClient, name: str) -> None:
    adm = client.AdmissionregistrationV1Api(api)
    for delete in (adm.delete_validating_webhook_configuration,
                   adm.delete_mutating_webhook_configuration):
        try:
            delete(name)
        except ApiException as e:
            if e.status != 404:
                raise


def _api_message(e: Exception) -> str:
    """The API server's own message of an ApiException (not the headers and the raw body)."""
    if isinstance(e, ApiException):
        try:
            return f"HTTP {e.status}: {json.loads(e.body)['message']}"
        except (TypeError, ValueError, KeyError):
            return f"HTTP {e.status}: {e.reason}"
    return f"{type(e).__name__}: {e}"


class _Server(kopf.WebhookServer):
    """kopf's HTTPS server that registers itself each time it (re)starts serving."""

    def __init__(self, publish: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._publish = publish

    @staticmethod
    def build_certificate(hostnames: Collection[str],
                          password: str | None = None) -> tuple[bytes, bytes]:
        return self_signed_certificate(hostnames, password)

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        async for client_config in super().__call__(fn):
            # the server listens already: only now point the API server at it
            await asyncio.to_thread(self._publish, dict(client_config))
            yield client_config


# -- the running webhook ----------------------------------------------------------------------
class WebhookHandle:
    """A running webhook; ``stop()`` ends it (idempotent)."""

    def __init__(self, api: client.ApiClient, config: WebhookConfig) -> None:
        self.api = api
        self.config = config
        self.url: str | None = None  # base URL once serving
        self.error: BaseException | None = None
        self._published = threading.Event()
        self._kopf_ready = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # the Queues and Namespaces the admission rules read, kept current by watches (a round
        # trip per pod creation would sit inside the API server's own request)
        self.queues: Informer | None = None
        self.namespaces: Informer | None = None
        # admission calls served, by handler id (what reached us past the match conditions)
        self.calls: Counter[str] = Counter()

    # the admission rules with the caches' current contents
    def _queue_inputs(self) -> dict[str, str | None] | None:
        if self.queues is None:
            return None
        if not self.queues.synced.is_set():
            raise kopf.AdmissionError("kai-ray admission: the Queue list is not loaded yet "
                                      f"({self.queues.last_error or 'starting'}); retry",
                                      code=503)
        return {q["metadata"]["name"]: q["parent"] for q in self.queues.values()}

    def _namespace_labels(self, namespace: str) -> dict[str, str] | None:
        if self.namespaces is None:
            return None
        seen = self.namespaces.get(namespace)
        if seen is None:  # created an instant ago, not seen by the watch yet
            ns = client.CoreV1Api(self.api).read_namespace(namespace)
            return dict(ns.metadata.labels or {})
        return dict(seen["labels"])

    def _fresh_queues(self) -> dict[str, str | None]:
        listing = client.CustomObjectsApi(self.api).list_cluster_custom_object(*QUEUE.gvp)
        return admission.queue_parents(listing.get("items") or [])

    def validate(self, pod: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> None:
        """Deny (kopf.AdmissionError) what ``admission.validate_pod`` denies, or for an UPDATE
        (``old``: the pod before it) what ``admission.validate_pod_update`` denies.

        Runs in kopf's thread pool (a sync handler): the rare fallbacks below call the API.
        """
        self.calls[VALIDATE_ID] += 1
        if old is not None:
            update = admission.validate_pod_update(old, pod, self.config.grouping)
            if not update.allowed:
                raise kopf.AdmissionError(update.message, code=400)
            return
        queues = self._queue_inputs()
        ns_labels = None
        if queues is not None:
            ns_labels = self._namespace_labels((pod.get("metadata") or {}).get("namespace", ""))
        verdict = admission.validate_pod(pod, self.config.grouping, queues, ns_labels)
        if not verdict.allowed and queues is not None:
            # a Queue created an instant ago may not be in the cache yet: check before denying
            verdict = admission.validate_pod(pod, self.config.grouping, self._fresh_queues(),
                                             ns_labels)
        if not verdict.allowed:
            raise kopf.AdmissionError(verdict.message, code=400)

    def mutate(self, pod: Mapping[str, Any]) -> list[dict[str, Any]]:
        self.calls[MUTATE_ID] += 1
        if admission.validate_gpu_request(pod) is not None:
            return []  # the validator denies it with the message
        suffix = "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(7))
        try:
            return admission.mutate_pod(pod, suffix, self.config.grouping)
        except admission.AdmissionError:
            return []  # e.g. a missing fraction container: the validator denies it

    def _publish(self, client_config: dict[str, Any]) -> None:
        url = str(client_config["url"])
        if not self.config.manage_configurations:
            self.url = url
            self._published.set()
            log.info("admission webhook serving at %s (configurations managed elsewhere)", url)
            return
        try:
            apply_configurations(self.api, self.config, url, client_config.get("caBundle"))
        except Exception as e:  # kopf would only log it: make wait_ready() fail with it
            self.error = RuntimeError(
                f"writing webhook configuration {self.config.configuration_name!r}: "
                f"{_api_message(e)}")
            raise self.error from e
        self.url = url
        self._published.set()
        log.info("admission webhook serving at %s", url)

    # lifecycle
    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until the API server routes our scheduler's pods to this webhook.

        Raises TimeoutError (naming the missing step) or the error the webhook thread died of.
        """
        deadline = time.monotonic() + timeout
        steps = [("kopf started", self._kopf_ready), ("configurations written", self._published)]
        for what, event in steps:
            while not event.wait(0.1):
                self._raise_if_dead()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"admission webhook: not ready after {timeout:.0f}s "
                                       f"({what}: no)")
        for cache in (self.queues, self.namespaces):
            if cache is not None and not cache.synced.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"admission webhook: {cache.name} not listed after "
                                   f"{timeout:.0f}s ({cache.last_error})")
        if not self.config.manage_configurations:
            return  # nothing of ours to probe: whoever owns the configurations routes to us
        last = ""
        while True:  # the API server picks up new configurations asynchronously
            self._raise_if_dead()
            last = self._probe()
            if not last:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"admission webhook: the API server does not call it after "
                                   f"{timeout:.0f}s (probe: {last})")
            time.sleep(0.1)

    def _probe(self) -> str:
        """'' once a dry-run pod with an invalid fraction is denied by us; else what happened."""
        pod: Any = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "kai-ray-webhook-probe-",
                         "annotations": {admission.GPU_FRACTION: "2"}},
            "spec": {"schedulerName": self.config.grouping.scheduler_name,
                     "containers": [{"name": "probe", "image": "probe"}]}}
        try:
            client.CoreV1Api(self.api).create_namespaced_pod(
                self.config.probe_namespace, pod, dry_run="All")
        except ApiException as e:
            if e.status == 400 and "gpu-fraction" in str(e.body):
                return ""
            return f"HTTP {e.status}: {str(e.body)[:200]}"
        return "a dry-run pod with gpu-fraction 2 was admitted"

    def _raise_if_dead(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"admission webhook failed: {self.error}") from self.error
        if self._thread is not None and not self._thread.is_alive() and not self._stop.is_set():
            raise RuntimeError("admission webhook: the kopf thread exited")

    def stop(self, remove_configuration: bool | None = None, timeout: float = 15.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        for cache in (self.queues, self.namespaces):
            if cache is not None:
                cache.stop()
        remove = (self.config.remove_configuration_on_stop if remove_configuration is None
                  else remove_configuration)
        if remove:
            remove_configurations(self.api, self.config.configuration_name)

    def __enter__(self) -> WebhookHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _connection_info(kubeconfig: str | None) -> kopf.ConnectionInfo:
    """kopf credentials from a kubeconfig file (kopf's own login reads only $KUBECONFIG), or
    the pod's service account when there is no kubeconfig and we run in a cluster."""
    cfg = client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        kube_config.load_incluster_config(client_configuration=cfg)
    else:
        kube_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    keys = cfg.api_key or {}
    token = keys.get("authorization") or keys.get("BearerToken")
    if token and token.lower().startswith("bearer "):
        token = token[7:]
    return kopf.ConnectionInfo(
        server=cfg.host, ca_path=cfg.ssl_ca_cert, insecure=not cfg.verify_ssl,
        certificate_path=cfg.cert_file, private_key_path=cfg.key_file,
        token=token or None, username=cfg.username or None, password=cfg.password or None)


def _registry(handle: WebhookHandle, kubeconfig: str | None) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return _connection_info(kubeconfig)

    @kopf.on.validate("", "v1", "pods", id=VALIDATE_ID, operations={"CREATE", "UPDATE"},
                      registry=registry)
    def validate(body: kopf.Body, **kwargs: Any) -> None:  # sync: kopf runs it in a thread
        old = kwargs.get("old")  # the pod before an UPDATE
        before = dict(old) if kwargs.get("operation") == "UPDATE" and old is not None else None
        handle.validate(dict(body), before)

    @kopf.on.mutate("", "v1", "pods", id=MUTATE_ID, operations={"CREATE"},
                   registry=registry)
    async def mutate(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        ops = handle.mutate(dict(body))
        if ops:
            # kopf diffs the transformed body against the original into the response's patch
            patch.fns.append(lambda raw: jsonpatch.apply_patch(raw, ops, in_place=True))

    return registry


class _NoMemories(ResourceMemories):
    """kopf's per-object memories, never kept: the handlers use no memo, and kopf would keep one
    per pod ever updated (it forgets only what its own watch sees deleted)."""

    async def recall(self, raw_body: Any, **kwargs: Any) -> ResourceMemory:
        return await super().recall(raw_body, **{**kwargs, "ephemeral": True})


def _watch(api: client.ApiClient, kind: str, path: str, key: str,
           value: Callable[[Mapping[str, Any]], Any]) -> Informer:
    """The scheduler's own informer on a cluster-scoped kind, each object trimmed to its name,
    its resourceVersion (where the watch resumes) and `key`: value(object)."""
    def keep(obj: dict[str, Any]) -> dict[str, Any]:
        m = obj.get("metadata") or {}
        return {"metadata": {"name": m.get("name"), "resourceVersion": m.get("resourceVersion")},
                key: value(obj)}

    informer = Informer(kind, rawapi.lister(api, path), on_change=lambda *_: None,
                        transform=keep)
    informer.start()
    return informer


def start_webhook(kubeconfig: str | None, config: WebhookConfig | None = None,
                  api: client.ApiClient | None = None) -> WebhookHandle:
    """Start the webhook in a background thread; returns at once (see ``wait_ready``)."""
    config = config or WebhookConfig()
    api = api or kube_config.new_client_from_config(config_file=kubeconfig)
    handle = WebhookHandle(api, config)
    if config.grouping.validate_queue:
        handle.queues = _watch(api, "queues", QUEUE.path(), "parent",
                               lambda q: (q.get("spec") or {}).get("parentQueue") or None)
        if config.grouping.namespace_queue:
            handle.namespaces = _watch(
                api, "namespaces", "/api/v1/namespaces", "labels",
                lambda ns: dict((ns.get("metadata") or {}).get("labels") or {}))

    settings = kopf.OperatorSettings()
    settings.admission.server = _Server(
        handle._publish, addr=config.addr, port=config.port or None, host=config.addr,
        certfile=config.certfile, pkeyfile=config.keyfile)
    settings.admission.managed = None  # we write the configurations (matchConditions)
    if not config.manage_configurations:
        # declare the restricted mode: no CRD/namespace scanning (no RBAC for it, none needed)
        settings.scanning.disabled = True
    settings.posting.enabled = False  # no k8s events for handler logs
    registry = _registry(handle, kubeconfig)

    def run() -> None:
        try:
            asyncio.run(kopf.operator(
                registry=registry, settings=settings, memories=_NoMemories(),
                standalone=True, clusterwide=True,
                stop_flag=handle._stop, ready_flag=handle._kopf_ready))
        except BaseException as e:
            handle.error = e
            log.exception("admission webhook stopped with an error")

    handle._thread = threading.Thread(target=run, name="kai-ray-webhook", daemon=True)
    handle._thread.start()
    return handle
