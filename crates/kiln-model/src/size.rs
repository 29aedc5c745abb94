//! Byte sizes as operators write them, for flags and config alike.

/// A size in bytes: `134217728`, `128MiB`, `128M`, `1GiB`, `512KiB`. Every unit is binary
/// (`MB` is `MiB`, as the agent's `--memory-limit` always took it), any case.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size: give bytes, or e.g. 128MiB"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        "t" | "tib" | "tb" => 40,
        other => {
            return Err(format!(
                "unknown size unit {other:?}: use KiB, MiB, GiB or TiB"
            ))
        }
    };
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(parse_bytes("128MiB"), Ok(128 << 20));
        assert_eq!(parse_bytes("64M"), Ok(64 << 20));
        assert_eq!(parse_bytes("64 mb"), Ok(64 << 20));
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("12 parsecs").unwrap_err().contains("unit"));
        assert!(parse_bytes("MiB").is_err());
        assert!(parse_bytes("99999999999999999999GiB").is_err());
        assert!(parse_bytes("99999999999TiB")
            .unwrap_err()
            .contains("too large"));
    }
}
