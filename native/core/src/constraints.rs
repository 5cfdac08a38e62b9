//! Where a pod may go besides resources (kai_ray/core/constraints.py): node taints against the
//! pod's tolerations, and the pod's required node affinity.

use rustc_hash::FxHashMap;

pub const BLOCKING_EFFECTS: [&str; 2] = ["NoSchedule", "NoExecute"];

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Taint {
    pub key: String,
    pub value: String,
    pub effect: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Toleration {
    pub key: String,
    pub operator: String,
    pub value: String,
    pub effect: String,
}

impl Toleration {
    pub fn tolerates(&self, taint: &Taint) -> bool {
        if !self.effect.is_empty() && self.effect != taint.effect {
            return false;
        }
        if !self.key.is_empty() && self.key != taint.key {
            return false;
        }
        if self.operator == "Exists" {
            return true;
        }
        !self.key.is_empty() && self.value == taint.value
    }
}

/// One node selector requirement: on a label, or on the node's name (`field`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Requirement {
    pub key: String,
    pub operator: String,
    pub values: Vec<String>,
    pub field: bool,
}

/// An integer as Kubernetes reads Gt/Lt values and labels (Go's strconv.ParseInt, base 10, 64
/// bits): an optional sign and ASCII digits, nothing else (kai_ray.core.constraints.parse_int64).
pub fn parse_int64(text: &str) -> Option<i64> {
    text.parse::<i64>().ok()
}

impl Requirement {
    pub fn matches(&self, name: &str, labels: &FxHashMap<String, String>) -> bool {
        let have: Option<&str> = if self.field {
            if self.key == "metadata.name" {
                Some(name)
            } else {
                None
            }
        } else {
            labels.get(&self.key).map(|s| s.as_str())
        };
        match self.operator.as_str() {
            "In" => have.is_some_and(|h| self.values.iter().any(|v| v == h)),
            "NotIn" => have.is_none_or(|h| !self.values.iter().any(|v| v == h)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            op @ ("Gt" | "Lt") => {
                let Some(h) = have else { return false };
                if self.values.len() != 1 {
                    return false;
                }
                match (parse_int64(h), parse_int64(&self.values[0])) {
                    (Some(left), Some(right)) => {
                        if op == "Gt" {
                            left > right
                        } else {
                            left < right
                        }
                    }
                    _ => false,
                }
            }
            _ => false,
        }
    }
}

/// Required node affinity: the node must match one term (terms are ORed); a term matches when
/// all its requirements do; an empty term matches nothing.
pub type Term = Vec<Requirement>;

pub fn affinity_matches(terms: &[Term], name: &str, labels: &FxHashMap<String, String>) -> bool {
    terms.iter().any(|term| !term.is_empty() && term.iter().all(|r| r.matches(name, labels)))
}

/// The node's first taint that keeps the pod off (NoSchedule/NoExecute, not tolerated).
pub fn untolerated<'a>(taints: &'a [Taint], tolerations: &[Toleration]) -> Option<&'a Taint> {
    taints.iter().find(|taint| {
        BLOCKING_EFFECTS.contains(&taint.effect.as_str())
            && !tolerations.iter().any(|t| t.tolerates(taint))
    })
}

#[cfg(test)]
mod tests {
    use super::parse_int64;

    #[test]
    fn integers_as_kubernetes_reads_them() {
        for (text, want) in [
            ("12", Some(12)),
            ("+3", Some(3)),
            ("-7", Some(-7)),
            (" 1", None),
            ("1_0", None),
            ("\u{ff13}", None),
            ("", None),
            ("-", None),
            ("9223372036854775807", Some(i64::MAX)),
            ("9223372036854775808", None),
            ("1.5", None),
        ] {
            assert_eq!(parse_int64(text), want, "{text:?}");
        }
    }
}
