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

/// Python's `int(str)`: optional surrounding whitespace, a sign, digits (underscores between
/// digits allowed). Only whether it parses and the comparison matter here.
fn py_int(text: &str) -> Option<i128> {
    let s = text.trim();
    let (negative, digits) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
    {
        return None;
    }
    let mut value: i128 = 0;
    for c in digits.chars() {
        if c == '_' {
            continue;
        }
        let d = c.to_digit(10)? as i128;
        value = value.checked_mul(10)?.checked_add(d)?;
    }
    Some(if negative { -value } else { value })
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
                match (py_int(h), py_int(&self.values[0])) {
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
