//! The error of a translation: the object, the field, its value and what is
//! wrong.

use std::fmt;

/// A Kubernetes object that could not be translated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct TranslateError {
    /// `pod ns/name`, `node n1`, …
    pub object: String,
    /// The field path, e.g. `spec.containers[0].resources.requests.cpu`.
    pub field: String,
    pub value: String,
    pub problem: String,
}

impl fmt::Display for TranslateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} = {:?}: {}",
            self.object, self.field, self.value, self.problem
        )
    }
}

/// An error naming the object, the field, its value and what is wrong.
pub(crate) fn err(
    object: &str,
    field: &str,
    value: &str,
    problem: impl Into<String>,
) -> TranslateError {
    TranslateError {
        object: object.to_string(),
        field: field.to_string(),
        value: value.to_string(),
        problem: problem.into(),
    }
}
