"""Where a pod may go besides resources: node taints against the pod's tolerations, and the pod's
required node affinity (Kubernetes' TaintToleration and NodeAffinity filters, which KAI runs as
predicates). Preferred affinity and PreferNoSchedule taints only score in Kubernetes and do not
filter, so they are not modelled."""

from __future__ import annotations

from dataclasses import dataclass

BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""  # empty with operator Exists: every key
    operator: str = "Equal"  # or Exists
    value: str = ""
    effect: str = ""  # empty: every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return bool(self.key) and self.value == taint.value


@dataclass(frozen=True, slots=True)
class Requirement:
    """One node selector requirement: on a label, or on the node's name (`field`)."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt
    values: tuple[str, ...] = ()
    field: bool = False  # matchFields (only metadata.name exists)

    def matches(self, name: str, labels: dict[str, str]) -> bool:
        if self.field:
            have: str | None = name if self.key == "metadata.name" else None
        else:
            have = labels.get(self.key)
        op = self.operator
        if op == "In":
            return have is not None and have in self.values
        if op == "NotIn":
            return have is None or have not in self.values
        if op == "Exists":
            return have is not None
        if op == "DoesNotExist":
            return have is None
        if op in ("Gt", "Lt") and have is not None and len(self.values) == 1:
            left, right = parse_int64(have), parse_int64(self.values[0])
            if left is None or right is None:
                return False
            return left > right if op == "Gt" else left < right
        return False


_INT64 = (-(2**63), 2**63 - 1)


def parse_int64(text: str) -> int | None:
    """An integer as Kubernetes reads Gt/Lt values and labels (Go's strconv.ParseInt, base 10,
    64 bits): an optional sign and ASCII digits, nothing else; None otherwise. (Python's int()
    would also take spaces, underscores and other scripts' digits.)"""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits or not (digits.isascii() and digits.isdigit()):
        return None
    value = int(text)
    return value if _INT64[0] <= value <= _INT64[1] else None


# required node affinity: the node must match one term (terms are ORed), a term matches when
# all its requirements do; an empty term matches nothing
Term = tuple[Requirement, ...]


def affinity_matches(terms: tuple[Term, ...], name: str, labels: dict[str, str]) -> bool:
    return any(term and all(r.matches(name, labels) for r in term) for term in terms)


def untolerated(taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...]) -> Taint | None:
    """The node's first taint that keeps the pod off (NoSchedule/NoExecute, not tolerated)."""
    for taint in taints:
        if taint.effect in BLOCKING_EFFECTS and not any(t.tolerates(taint) for t in tolerations):
            return taint
    return None
