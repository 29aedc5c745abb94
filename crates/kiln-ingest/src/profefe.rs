//! profefe's collector API: `POST /api/0/profiles?service=S&type=T&labels=k=v,k=v` with the
//! raw pprof as the body, whatever content type the client claims.

use std::collections::HashMap;

use kiln_model::labels::{client_labels, ClientLabels, SERVICE_NAME};

use crate::parse::{from_pprof_bytes, ProfileContext};
use crate::{IngestError, Limits, ParsedProfile};

/// profefe's profile types and the profile name each is stored under.
pub const PROFEFE_TYPES: [(&str, Option<&str>); 7] = [
    ("cpu", Some("process_cpu")),
    ("heap", Some("memory")),
    ("block", Some("block")),
    ("mutex", Some("mutex")),
    ("goroutine", Some("goroutines")),
    ("threadcreate", Some("threadcreate")),
    ("other", None),
];

/// The profile name for a profefe type, or an error listing the valid ones.
pub fn profile_name_for_type(profefe_type: &str) -> Result<Option<&'static str>, IngestError> {
    PROFEFE_TYPES
        .iter()
        .find(|(name, _)| *name == profefe_type)
        .map(|(_, profile_name)| *profile_name)
        .ok_or_else(|| {
            IngestError::BadRequest(format!(
                "unknown profile type {profefe_type:?}; expected one of cpu, heap, block, mutex, goroutine, threadcreate, other"
            ))
        })
}

/// The profefe type of a stored profile name.
pub fn type_for_profile_name(name: &str) -> &'static str {
    PROFEFE_TYPES
        .iter()
        .find(|(_, profile_name)| *profile_name == Some(name))
        .map(|(profefe_type, _)| *profefe_type)
        .unwrap_or("other")
}

/// Parses `k=v,k=v`: names are checked, never rewritten ([`client_labels`]).
pub fn parse_labels(text: &str) -> Result<ClientLabels, IngestError> {
    let mut pairs = Vec::new();
    for pair in text
        .split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
    {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(IngestError::BadRequest(format!(
                "invalid label {pair:?}: expected key=value"
            )));
        };
        pairs.push((key.trim(), value.trim()));
    }
    Ok(client_labels(pairs, &[])?)
}

pub fn parse_profefe(
    params: &HashMap<String, String>,
    body: &[u8],
    limits: &Limits,
) -> Result<ParsedProfile, IngestError> {
    let service = params
        .get("service")
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| IngestError::BadRequest("the service parameter is required".into()))?;
    let profefe_type = params
        .get("type")
        .ok_or_else(|| IngestError::BadRequest("the type parameter is required".into()))?;
    let name = profile_name_for_type(profefe_type)?;
    let ClientLabels {
        mut labels,
        warnings,
    } = parse_labels(params.get("labels").map_or("", String::as_str))?;
    labels.set(SERVICE_NAME, service.to_string());
    let context = ProfileContext {
        labels,
        warnings,
        name: name.map(str::to_string),
        ..Default::default()
    };
    from_pprof_bytes(body, context, limits)
}
