//! Tenancy: the `X-Scope-OrgID` header names the tenant, `anonymous` without it.

use crate::error::{ApiError, TenantError};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderMap;

pub const TENANT_HEADER: &str = "x-scope-orgid";
pub const DEFAULT_TENANT: &str = "anonymous";

/// The tenant of a request. Tenant ids follow Cortex's rules (at most 150 characters of
/// `[A-Za-z0-9!-_.*'()]`, not `.` or `..`) because they end up in object keys and metric
/// labels.
pub fn tenant_of(headers: &HeaderMap) -> Result<String, TenantError> {
    let Some(value) = headers.get(TENANT_HEADER) else {
        return Ok(DEFAULT_TENANT.to_string());
    };
    let value = value.to_str().map_err(|_| TenantError::NotAscii)?.trim();
    if value.is_empty() {
        return Ok(DEFAULT_TENANT.to_string());
    }
    validate(value)?;
    Ok(value.to_string())
}

/// Checks a tenant id against the rules of [`tenant_of`] (for ids from the config too).
pub fn validate(value: &str) -> Result<(), TenantError> {
    if value.len() > 150 {
        return Err(TenantError::TooLong);
    }
    if value == "." || value == ".." {
        return Err(TenantError::Dots);
    }
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "!-_.*'()".contains(*c)))
    {
        return Err(TenantError::InvalidCharacter(bad));
    }
    Ok(())
}

/// The request's tenant, as an extractor: a handler that takes a `Tenant` never runs for
/// a request with an unusable header.
#[derive(Debug, Clone)]
pub struct Tenant(pub String);

impl std::ops::Deref for Tenant {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        Ok(Tenant(tenant_of(&parts.headers)?))
    }
}
