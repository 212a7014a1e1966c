use serde::Serialize;
use utoipa::ToSchema;

/// One invalid field of a request, as RFC 9457's `errors` extension lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct FieldError {
    /// JSON Pointer (RFC 6901) to the field, e.g. `#/items/0/quantity`.
    pub pointer: String,
    /// What is wrong with it, for a person.
    pub detail: String,
}

impl FieldError {
    /// `path` is the pointer without its leading `#`, e.g. `/items/0/sku`.
    pub fn new(path: impl AsRef<str>, detail: impl Into<String>) -> Self {
        Self {
            pointer: format!("#{}", path.as_ref()),
            detail: detail.into(),
        }
    }
}
