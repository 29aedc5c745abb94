//! Bounded decompression: a gzip body is inflated only up to a limit, so a small
//! decompression bomb costs at most `limit` bytes of memory before it is refused.

use std::io::Read;

use crate::FormatError;

/// True when `data` starts with the gzip magic bytes.
pub fn is_gzip(data: &[u8]) -> bool {
    data.len() >= 2 && data[0] == 0x1f && data[1] == 0x8b
}

/// Inflates a gzip stream (all members), refusing output larger than `limit` bytes.
pub fn gunzip_bounded(data: &[u8], limit: usize) -> Result<Vec<u8>, FormatError> {
    let decoder = flate2::read::MultiGzDecoder::new(data);
    let mut out = Vec::with_capacity(inflated_size_hint(data).min(limit));
    // Read one byte past the limit to tell "exactly at the limit" from "over it".
    let read = decoder
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|err| FormatError::malformed(format!("invalid gzip data: {err}")))?;
    if read > limit {
        return Err(FormatError::TooLarge(format!(
            "decompressed body exceeds the limit of {limit} bytes"
        )));
    }
    Ok(out)
}

/// The capacity to inflate into. A gzip member ends with its inflated size modulo 2^32
/// (ISIZE, RFC 1952), exact for the single-member bodies clients send; sizing the output by
/// it saves the copies of growing a vector. It is only a hint: a lying trailer costs growth
/// or unused capacity, never more than the caller's limit.
fn inflated_size_hint(data: &[u8]) -> usize {
    let guess = data.len().saturating_mul(4);
    let Some(trailer) = data
        .len()
        .checked_sub(4)
        .and_then(|start| data.get(start..))
    else {
        return guess;
    };
    let size = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]) as usize;
    // Deflate expands by at most ~1032x; anything beyond is not this body's size.
    if size < data.len() / 2 || size > data.len().saturating_mul(1032) {
        return guess;
    }
    size.saturating_add(1)
}

/// Returns the body inflated when it is gzip, or as it is otherwise; both bounded by `limit`.
pub fn maybe_gunzip(data: &[u8], limit: usize) -> Result<std::borrow::Cow<'_, [u8]>, FormatError> {
    if is_gzip(data) {
        return gunzip_bounded(data, limit).map(std::borrow::Cow::Owned);
    }
    if data.len() > limit {
        return Err(FormatError::TooLarge(format!(
            "body exceeds the decompressed limit of {limit} bytes"
        )));
    }
    Ok(std::borrow::Cow::Borrowed(data))
}

/// Gzip-compresses `data` at the default level.
pub fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing into a Vec cannot fail.
    let _ = encoder.write_all(data);
    encoder.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_limits() {
        let payload = vec![7u8; 10_000];
        let packed = gzip(&payload);
        assert!(is_gzip(&packed));
        assert_eq!(gunzip_bounded(&packed, 10_000).unwrap(), payload);
        assert!(matches!(
            gunzip_bounded(&packed, 9_999),
            Err(FormatError::TooLarge(_))
        ));
        assert!(matches!(
            gunzip_bounded(&packed[..packed.len() / 2], 100_000),
            Err(FormatError::Malformed(_))
        ));
        assert_eq!(&*maybe_gunzip(b"plain", 10).unwrap(), b"plain");
        assert!(maybe_gunzip(b"plain", 3).is_err());
    }

    #[test]
    fn bomb_is_stopped_early() {
        // 64 MiB of zeros compresses to ~64 KiB; a 1 MiB limit must refuse it.
        let bomb = gzip(&vec![0u8; 64 << 20]);
        assert!(bomb.len() < 1 << 20);
        assert!(matches!(
            gunzip_bounded(&bomb, 1 << 20),
            Err(FormatError::TooLarge(_))
        ));
    }
}
