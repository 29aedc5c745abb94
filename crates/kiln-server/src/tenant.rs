//! Tenancy: the `X-Scope-OrgID` header names the tenant, `anonymous` without it.

use axum::http::HeaderMap;

pub const TENANT_HEADER: &str = "x-scope-orgid";
pub const DEFAULT_TENANT: &str = "anonymous";

/// The tenant of a request, or why the header is unusable. Tenant ids follow Cortex's
/// rules (at most 150 characters of `[A-Za-z0-9!-_.*'()]`, not `.` or `..`) because they
/// end up in object keys and metric labels.
pub fn tenant_of(headers: &HeaderMap) -> Result<String, String> {
    let Some(value) = headers.get(TENANT_HEADER) else {
        return Ok(DEFAULT_TENANT.to_string());
    };
    let value = value
        .to_str()
        .map_err(|_| "X-Scope-OrgID is not valid ASCII".to_string())?
        .trim();
    if value.is_empty() {
        return Ok(DEFAULT_TENANT.to_string());
    }
    if value.len() > 150 {
        return Err("X-Scope-OrgID is longer than 150 characters".to_string());
    }
    if value == "." || value == ".." {
        return Err("X-Scope-OrgID must not be '.' or '..'".to_string());
    }
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "!-_.*'()".contains(*c)))
    {
        return Err(format!(
            "X-Scope-OrgID contains the invalid character {bad:?}"
        ));
    }
    Ok(value.to_string())
}
