//! `PUT /api/v1/debuginfo/{build_id}` takes a tenant's debug file, streamed to disk
//! (they run to gigabytes); `GET` says what is held for a build id. kiln-symbolize checks,
//! keeps and reads them.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::Json;
use kiln_symbolize::SymbolizeError;
use tokio::io::AsyncWriteExt;

use crate::body::{is_timeout, BodyError};
use crate::error::ApiError;
use crate::state::SharedState;
use crate::tenant::Tenant;

pub(crate) const PREFIX: &str = "/api/v1/debuginfo/";

pub(crate) async fn upload(
    State(state): State<SharedState>,
    tenant: Tenant,
    Path(build_id): Path<String>,
    body: Body,
) -> Result<Json<serde_json::Value>, ApiError> {
    let build_id = build_id.to_ascii_lowercase();
    if !kiln_symbolize::elf::valid_build_id(&build_id) {
        return Err(SymbolizeError::BuildId(build_id).into());
    }
    // A declared length past the limit was refused by the listener, unread.
    let symbolizer = &state.symbolizer;
    let path = symbolizer.incoming();
    let written = receive(body, &path, symbolizer.max_bytes()).await;
    if let Err(err) = written {
        let _ = tokio::fs::remove_file(&path).await;
        return Err(err);
    }
    let contents = symbolizer.upload(&tenant, &path, Some(&build_id)).await?;
    Ok(Json(describe(&contents, kiln_symbolize::Origin::Upload)))
}

/// Writes the body to `path`, refusing past `limit` bytes.
async fn receive(body: Body, path: &std::path::Path, limit: u64) -> Result<(), ApiError> {
    let mut file = tokio::fs::File::create(path)
        .await
        .map_err(SymbolizeError::Io)?;
    let mut body = body.into_data_stream();
    let mut written = 0u64;
    while let Some(chunk) = futures_util::StreamExt::next(&mut body).await {
        let chunk = chunk.map_err(|err| {
            let err: axum::BoxError = Box::new(err);
            if is_timeout(err.as_ref()) {
                BodyError::Timeout(err)
            } else {
                BodyError::Read(err)
            }
        })?;
        written += chunk.len() as u64;
        if written > limit {
            return Err(too_large(written, limit));
        }
        file.write_all(&chunk).await.map_err(SymbolizeError::Io)?;
    }
    file.sync_all().await.map_err(SymbolizeError::Io)?;
    Ok(())
}

/// 413, saying which limit: "N bytes is more than the L allowed
/// (symbolization.max_debuginfo_bytes)", N what had come when the body passed it.
fn too_large(bytes: u64, limit: u64) -> ApiError {
    SymbolizeError::Refused(kiln_symbolize::Refused::TooLarge { bytes, limit }).into()
}

pub(crate) async fn status(
    State(state): State<SharedState>,
    tenant: Tenant,
    Path(build_id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let build_id = build_id.to_ascii_lowercase();
    match state.symbolizer.status(&tenant, &build_id).await? {
        Some((contents, origin)) => Ok(Json(describe(&contents, origin))),
        None => Err(SymbolizeError::NotHeld(build_id).into()),
    }
}

fn describe(
    contents: &kiln_symbolize::Contents,
    origin: kiln_symbolize::Origin,
) -> serde_json::Value {
    serde_json::json!({
        "build_id": contents.build_id,
        "origin": origin,
        "bytes": contents.bytes,
        "symbols": contents.symbols,
        "lines": contents.lines,
        "inline_frames": contents.inline_frames,
        "go_pclntab": contents.go_pclntab,
    })
}
