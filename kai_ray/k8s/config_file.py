"""The scheduler's YAML configuration file (the chart's ConfigMap, `kai-ray run --config`).

Every key, its default and its bounds: docs/configuration.md. The file is a pydantic model
(`ConfigModel`); its JSON schema (`json_schema()`, committed as charts/kai-ray/config.schema.json
and regenerated with `python3 -m kai_ray.k8s.config_file --schema`) is the same rules for
editors and the chart. Unknown keys and bad values stop with one line naming the file and
the key: `<file>: <dotted.key>: <what is wrong>, got <value>`.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
)

from kai_ray.core.model import NodePlacement, SchedulerConfig
from kai_ray.k8s.binder import BinderConfig
from kai_ray.k8s.ratelimit import DEFAULT_BURST, DEFAULT_QPS, validate

DEFAULT_PERIOD_S = 1.0
_CORE = SchedulerConfig()
_BINDER = BinderConfig()
# the names the core runs (kai_ray.core.python_cycle.run_action) and its packing policies, spelt
# out for the schema; tests/k8s/test_config_file.py checks them against the core's own
Action = Literal["allocate", "consolidation", "reclaim", "preempt", "stalegangeviction"]
ACTIONS: tuple[Action, ...] = get_args(Action)
GpuPacking = Literal["best_fit", "packing", "kai", "fgd", "lookahead"]
Spread = Literal["binpack", "spread"]


def _text(value: object) -> object:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("expected a non-empty string")
    return value.strip()


def _distinct(actions: list[str]) -> list[str]:
    if not actions:
        raise ValueError(f"expected at least one of {list(ACTIONS)} (leave the key out for all "
                         "of them)")
    twice = sorted({a for a in actions if actions.count(a) > 1})
    if twice:
        raise ValueError(f"{twice} listed more than once")
    return actions


_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def _namespace(value: str) -> str:
    if len(value) > 63 or not re.match(_DNS_LABEL, value):
        raise ValueError("expected a namespace name (lower-case letters, digits and '-', at "
                         "most 63)")
    return value


def _empty_is_default(value: object) -> object:
    # `health:` with nothing under it (YAML null) is the defaults, as a missing section
    return {} if value is None else value


Text = Annotated[str, BeforeValidator(_text), WithJsonSchema({"type": "string", "minLength": 1})]
Namespace = Annotated[str, BeforeValidator(_text), AfterValidator(_namespace),
                     WithJsonSchema({"type": "string", "pattern": _DNS_LABEL, "maxLength": 63})]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True,
                              populate_by_name=True)


class Placement(_Model):
    """Node order for pods: fill the fullest node first (binpack) or the emptiest (spread)."""

    gpu: Spread = "binpack"
    cpu: Spread = "binpack"


class SchedulerSettings(_Model):
    """The top-level keys the scheduling core reads."""

    cycle_period_seconds: float = Field(
        DEFAULT_PERIOD_S, gt=0, le=3600, alias="cyclePeriodSeconds",
        description="Seconds from the start of one scheduling cycle to the next.")
    placement: Annotated[Placement, BeforeValidator(_empty_is_default)] = Field(
        Placement.model_validate({}), description=Placement.__doc__)
    gpu_packing: GpuPacking = Field(
        "kai", alias="gpuPacking",
        description="Node and device choice for GPU pods: kai (KAI's rules) or a packing "
                    "policy.")
    staleness_grace_period_seconds: float = Field(
        _CORE.staleness_grace_period_s, ge=0, alias="stalenessGracePeriodSeconds",
        description="How long a running gang may stay below its minimum before it is "
                    "evicted.")
    max_consolidation_preemptees: int = Field(
        _CORE.max_consolidation_preemptees, ge=0, le=1_000_000,
        alias="maxConsolidationPreemptees",
        description="Most pods one consolidation may move (0: no consolidation).")
    actions: Annotated[list[Action], AfterValidator(_distinct)] = Field(
        list(ACTIONS), json_schema_extra={"minItems": 1, "uniqueItems": True},
        description="The actions of a cycle, in the order they run.")

    def core(self) -> SchedulerConfig:
        return SchedulerConfig(
            gpu_packing=self.gpu_packing,
            placement=NodePlacement(gpu=self.placement.gpu, cpu=self.placement.cpu),
            staleness_grace_period_s=float(self.staleness_grace_period_seconds),
            max_consolidation_preemptees=self.max_consolidation_preemptees,
            actions=tuple(self.actions))


class ClientConnectionSettings(_Model):
    """The API client: kube-scheduler's rate limit keys, and timeouts."""

    # qps and burst are checked together, by ratelimit.validate (client_connection below)
    qps: Annotated[Any, WithJsonSchema({"type": "number", "not": {"const": 0}})] = Field(
        DEFAULT_QPS, description="Requests per second (-1: no limit).")
    burst: Annotated[Any, WithJsonSchema({"type": "integer", "minimum": 0})] = Field(
        DEFAULT_BURST, description="Requests allowed at once above the rate (>= 1 when qps "
                                   "limits).")
    timeout_seconds: float = Field(
        30.0, gt=0, le=3600, alias="timeoutSeconds",
        description="Longest wait for the answer to one request.")
    connect_timeout_seconds: float = Field(
        5.0, gt=0, le=600, alias="connectTimeoutSeconds",
        description="Longest wait for a connection to the API server.")
    watch_timeout_seconds: float = Field(
        60.0, ge=1, le=3600, alias="watchTimeoutSeconds",
        description="The API server ends each watch after this long and it is opened again.")


class HealthSection(_Model):
    """When /healthz turns unhealthy."""

    max_cycle_age_seconds: float = Field(
        60.0, gt=0, le=86400, alias="maxCycleAgeSeconds",
        description="No scheduling cycle completed for this long (while leading).")
    max_informer_silence_seconds: float = Field(
        120.0, gt=0, le=86400, alias="maxInformerSilenceSeconds",
        description="A watch has not heard from the API server for this long.")


class ReservationSettings(_Model):
    """The GPU reservation pods the binder creates for shared devices."""

    image: Text = Field(_BINDER.reservation_image, description="The reservation pods' image.")
    service_account_name: Text = Field(_BINDER.reservation_service_account,
                                       alias="serviceAccountName",
                                       description="Their service account.")
    namespace: Namespace = Field(
        _BINDER.reservation_namespace,
        description="The namespace of the reservation pods and of their service account.")
    timeout_seconds: float = Field(
        _BINDER.reservation_timeout_s, gt=0, lt=86400, alias="timeoutSeconds",
        description="How long a reservation pod may take to report its device.")


class ConfigModel(SchedulerSettings):
    """The whole file, for its JSON schema (ConfigFile checks it section by section)."""

    model_config = ConfigDict(title="kai-ray scheduler configuration")

    client_connection: Annotated[ClientConnectionSettings,
                                 BeforeValidator(_empty_is_default)] = Field(
        ClientConnectionSettings.model_validate({}), alias="clientConnection",
        description=ClientConnectionSettings.__doc__)
    health: Annotated[HealthSection, BeforeValidator(_empty_is_default)] = Field(
        HealthSection.model_validate({}), description=HealthSection.__doc__)
    reservation: Annotated[ReservationSettings, BeforeValidator(_empty_is_default)] = Field(
        ReservationSettings.model_validate({}), description=ReservationSettings.__doc__)


def _aliases(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


KEYS = frozenset(_aliases(ConfigModel))
SCHEDULER_KEYS = frozenset(_aliases(SchedulerSettings))
RESERVATION_KEYS = frozenset(_aliases(ReservationSettings))


@dataclass(frozen=True)
class ClientConnection:
    """Token bucket of the API client: `qps` requests per second, bursts of `burst`; a negative
    `qps` means no limit (as in client-go)."""

    qps: float = DEFAULT_QPS
    burst: int = DEFAULT_BURST


@dataclass(frozen=True)
class ApiTimeouts:
    """Seconds: to connect, to read one answer, and the server-side timeout of each watch."""

    connect_s: float = 5.0
    request_s: float = 30.0
    watch_s: float = 60.0


@dataclass(frozen=True)
class HealthSettings:
    """When /healthz fails (kai_ray.controller.health)."""

    max_cycle_age_s: float = 60.0
    max_informer_silence_s: float = 120.0


@dataclass(frozen=True)
class ConfigFile:
    """The file parsed once (top-level keys checked); each section is checked when read, so a
    tool that needs only the scheduler's keys is not stopped by a bad clientConnection."""

    path: str | None
    raw: dict[str, Any]

    def scheduler(self) -> tuple[SchedulerConfig, float]:
        """(core configuration, cycle period in seconds); defaults when there is no file."""
        settings = self._scheduler()
        return settings.core(), float(settings.cycle_period_seconds)

    def client_connection(self) -> ClientConnection:
        """clientConnection {qps, burst}; kube-scheduler's defaults (50, 100) when absent."""
        conn = self._client()
        try:
            qps, burst = validate(conn.qps, conn.burst, "clientConnection.qps",
                                  "clientConnection.burst")
        except ValueError as e:
            raise SystemExit(f"{self.path}: {e}") from None
        return ClientConnection(qps, burst)

    def api_timeouts(self) -> ApiTimeouts:
        """clientConnection {connectTimeoutSeconds, timeoutSeconds, watchTimeoutSeconds}."""
        conn = self._client()
        return ApiTimeouts(connect_s=float(conn.connect_timeout_seconds),
                           request_s=float(conn.timeout_seconds),
                           watch_s=float(conn.watch_timeout_seconds))

    def health(self) -> HealthSettings:
        """health {maxCycleAgeSeconds, maxInformerSilenceSeconds}. Each must exceed what a
        healthy scheduler can take (a cycle period, a quiet watch), or /healthz fails a
        scheduler that works."""
        section = _section(HealthSection, self.raw, "health", self.path)
        period = self._scheduler().cycle_period_seconds
        if section.max_cycle_age_seconds <= period:
            raise SystemExit(f"{self.path}: health.maxCycleAgeSeconds: expected more than "
                             f"cyclePeriodSeconds ({_number(period)}), "
                             f"got {_number(section.max_cycle_age_seconds)}")
        watch = self._client().watch_timeout_seconds
        if section.max_informer_silence_seconds <= watch:
            raise SystemExit(f"{self.path}: health.maxInformerSilenceSeconds: expected more "
                             f"than clientConnection.watchTimeoutSeconds ({_number(watch)}), "
                             f"got {_number(section.max_informer_silence_seconds)}")
        return HealthSettings(max_cycle_age_s=float(section.max_cycle_age_seconds),
                              max_informer_silence_s=float(section.max_informer_silence_seconds))

    def binder(self) -> BinderConfig:
        """reservation {image, serviceAccountName, namespace, timeoutSeconds}; defaults when
        absent."""
        section = _section(ReservationSettings, self.raw, "reservation", self.path)
        return BinderConfig(reservation_timeout_s=float(section.timeout_seconds),
                            reservation_image=section.image,
                            reservation_service_account=section.service_account_name,
                            reservation_namespace=section.namespace)

    def check(self) -> None:
        """Every key of the file, section by section (the first error stops)."""
        self.scheduler()
        self.client_connection()
        self.api_timeouts()
        self.health()
        self.binder()

    def _scheduler(self) -> SchedulerSettings:
        own = {k: v for k, v in self.raw.items() if k in SCHEDULER_KEYS}
        return _validated(SchedulerSettings, own, "", self.path)

    def _client(self) -> ClientConnectionSettings:
        return _section(ClientConnectionSettings, self.raw, "clientConnection", self.path)


def load(path: str | None) -> ConfigFile:
    """Read and parse `path` (no file: every default)."""
    if not path:
        return ConfigFile(None, {})
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SystemExit(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        raw: Any = yaml.safe_load(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise SystemExit(f"{path}: not UTF-8 text (byte {e.start})") from None
    except yaml.YAMLError as e:
        raise SystemExit(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise SystemExit(f"{path}: not valid YAML: nested too deeply") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SystemExit(f"{path}: expected a mapping of keys, got {type(raw).__name__}")
    unknown = sorted(str(k) for k in raw if k not in KEYS)
    if unknown:
        raise SystemExit(f"{path}: unknown key(s) {unknown}; known: {sorted(KEYS)}")
    return ConfigFile(path, raw)


def client_connection(path: str | None) -> ClientConnection:
    """clientConnection of the file at `path` (see ConfigFile.client_connection)."""
    return load(path).client_connection()


def read(path: str | None) -> tuple[SchedulerConfig, float]:
    """The scheduler's keys of the file at `path` (see ConfigFile.scheduler)."""
    return load(path).scheduler()


def json_schema() -> dict[str, Any]:
    """The file's JSON schema (draft 2020-12), as committed in charts/kai-ray/config.schema.json."""
    schema = _untitled(ConfigModel.model_json_schema(by_alias=True))
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": ConfigModel.model_config.get("title"), **schema}


def _untitled(node: Any) -> Any:
    """The schema without pydantic's titles made from field and class names ("Qps")."""
    if isinstance(node, dict):
        return {k: _untitled(v) for k, v in node.items() if k != "title"}
    if isinstance(node, list):
        return [_untitled(v) for v in node]
    return node


# ---------------------------------------------------------------------------------- errors

M = TypeVar("M", bound=BaseModel)


def _section(model: type[M], raw: Mapping[str, Any], key: str,
             path: str | None) -> M:
    return _validated(model, _empty_is_default(raw.get(key)), key, path)


def _validated(model: type[M], value: object, prefix: str,
               path: str | None) -> M:
    try:
        return model.model_validate(value)
    except ValidationError as e:
        raise SystemExit(f"{path}: {_first_error(model, e, prefix)}") from None


_MESSAGES: dict[str, Callable[[dict[str, Any]], str]] = {
    "literal_error": lambda err: f"expected one of {err['ctx']['expected']}",
    "list_type": lambda err: "expected a list",
    "model_type": lambda err: "expected a mapping",
    "dict_type": lambda err: "expected a mapping",
    "string_type": lambda err: "expected a string",
    "missing": lambda err: "required",
}
# pydantic's errors of a number field: said once, with every bound of the field
_NUMBER_ERRORS = {"float_type", "int_type", "finite_number", "greater_than",
                  "greater_than_equal", "less_than", "less_than_equal", "int_from_float"}
_BOUNDS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))


def _first_error(model: type[BaseModel], error: ValidationError, prefix: str) -> str:
    """`dotted.key: what is wrong, got value` of the first error (one line: an operator reads
    the first problem, fixes it, and runs again)."""
    err: dict[str, Any] = dict(error.errors()[0])
    loc = [str(p) for p in err["loc"]]
    where = ".".join([prefix, *loc] if prefix else loc) or prefix or "(file)"
    if err["type"] == "extra_forbidden":
        known = sorted(_aliases(_model_at(model, loc[:-1])))
        return f"{where}: unknown key; known: {known}"
    describe = _MESSAGES.get(err["type"])
    if err["type"] in _NUMBER_ERRORS and loc:
        what = _expected_number(_model_at(model, loc[:-1]), loc[-1])
    elif describe is not None:
        what = describe(err)
    else:
        what = err["msg"].removeprefix("Value error, ")
    return " ".join(f"{where}: {what}, got {err['input']!r}".split())


def _expected_number(model: type[BaseModel], key: str) -> str:
    """`expected a number > 0 and <= 3600` from the field's type and constraints."""
    field = next(f for name, f in model.model_fields.items() if (f.alias or name) == key)
    kind = "an integer" if field.annotation is int else "a number"
    bounds = [f"{op} {_number(getattr(m, attr))}" for m in field.metadata
              for attr, op in _BOUNDS if getattr(m, attr, None) is not None]
    return f"expected {kind}" + (f" {' and '.join(bounds)}" if bounds else "")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _model_at(model: type[BaseModel], loc: list[str]) -> type[BaseModel]:
    """The model of the mapping at `loc` (aliases) inside `model`."""
    for part in loc:
        fields = {f.alias or name: f for name, f in model.model_fields.items()}
        annotation = fields[part].annotation if part in fields else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            break
        model = annotation
    return model


def main(argv: list[str] | None = None) -> int:
    """`python3 -m kai_ray.k8s.config_file --schema`: print the JSON schema;
    `python3 -m kai_ray.k8s.config_file FILE`: check every key of FILE."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["--schema"]:
        print(json.dumps(json_schema(), indent=2))
        return 0
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python3 -m kai_ray.k8s.config_file (--schema | FILE)", file=sys.stderr)
        return 2
    load(args[0]).check()
    print(f"{args[0]}: ok")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
