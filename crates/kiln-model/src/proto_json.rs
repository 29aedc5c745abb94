//! The proto3 JSON mapping's awkward cases, as serde helpers for the hand-written message
//! types of querier.v1 and OTLP: 64-bit integers are strings on the wire (and numbers are
//! accepted too, as every proto3 JSON reader does), bytes are base64, enums are names or
//! numbers, and `null` is the field's default.
//!
//! Use with `#[serde(with = "kiln_model::proto_json::int64")]` and friends.

use base64::Engine;
use serde::de::{self, Deserializer};
use serde::ser::{SerializeSeq, Serializer};
use serde::Deserialize;

/// A JSON integer as clients send it: a string, or a number (an integral float included).
#[derive(Deserialize)]
#[serde(untagged)]
enum Number {
    Signed(i64),
    Unsigned(u64),
    Float(f64),
    Text(String),
}

fn to_i64<E: de::Error>(number: Number) -> Result<i64, E> {
    match number {
        Number::Signed(value) => Ok(value),
        Number::Unsigned(value) => i64::try_from(value).map_err(E::custom),
        Number::Float(value) if value.fract() == 0.0 => Ok(value as i64),
        Number::Float(value) => Err(E::custom(format!("{value} is not an integer"))),
        Number::Text(text) => text
            .trim()
            .parse()
            .map_err(|_| E::custom(format!("{text:?} is not an integer"))),
    }
}

fn to_u64<E: de::Error>(number: Number) -> Result<u64, E> {
    match number {
        Number::Signed(value) => u64::try_from(value).map_err(E::custom),
        Number::Unsigned(value) => Ok(value),
        Number::Float(value) if value.fract() == 0.0 && value >= 0.0 => Ok(value as u64),
        Number::Float(value) => Err(E::custom(format!("{value} is not an unsigned integer"))),
        Number::Text(text) => text
            .trim()
            .parse()
            .map_err(|_| E::custom(format!("{text:?} is not an unsigned integer"))),
    }
}

/// An `int64` JSON value (for example an OTLP `intValue`, which arrives as a
/// `serde_json::Value`), as a number.
pub fn i64_of<E: de::Error>(value: serde_json::Value) -> Result<i64, E> {
    to_i64(Number::deserialize(value).map_err(E::custom)?)
}

/// `int64`: written as a string, read from a string or a number.
pub mod int64 {
    use super::*;

    pub fn serialize<S: Serializer>(value: &i64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&value.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
        Option::<Number>::deserialize(deserializer)?.map_or(Ok(0), to_i64)
    }
}

/// `optional int64`.
pub mod opt_int64 {
    use super::*;

    pub fn serialize<S: Serializer>(value: &Option<i64>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => serializer.serialize_str(&value.to_string()),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<i64>, D::Error> {
        Option::<Number>::deserialize(deserializer)?
            .map(to_i64)
            .transpose()
    }
}

/// `repeated int64`.
pub mod int64s {
    use super::*;

    pub fn serialize<S: Serializer>(values: &[i64], serializer: S) -> Result<S::Ok, S::Error> {
        let mut sequence = serializer.serialize_seq(Some(values.len()))?;
        for value in values {
            sequence.serialize_element(&value.to_string())?;
        }
        sequence.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<i64>, D::Error> {
        Option::<Vec<Number>>::deserialize(deserializer)?
            .unwrap_or_default()
            .into_iter()
            .map(to_i64)
            .collect()
    }
}

/// `uint64` (and `fixed64`), read from a string or a number.
pub mod uint64 {
    use super::*;

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
        Option::<Number>::deserialize(deserializer)?.map_or(Ok(0), to_u64)
    }
}

/// `repeated uint64`.
pub mod uint64s {
    use super::*;

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u64>, D::Error> {
        Option::<Vec<Number>>::deserialize(deserializer)?
            .unwrap_or_default()
            .into_iter()
            .map(to_u64)
            .collect()
    }
}

/// The bytes of a base64 string, standard or URL-safe alphabet, as proto3 JSON allows.
pub fn base64_decode(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE.decode(text))
}

/// `bytes`: base64.
pub mod bytes {
    use super::*;

    pub fn serialize<S: Serializer>(value: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(value))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = Option::<String>::deserialize(deserializer)?.unwrap_or_default();
        base64_decode(&text).map_err(|err| de::Error::custom(format!("invalid base64: {err}")))
    }
}

/// An enum field: by name (from `names`, indexed by number) or by number; `None` when
/// absent or null.
pub fn enum_value<'de, D: Deserializer<'de>>(
    deserializer: D,
    names: &[&str],
) -> Result<Option<i32>, D::Error> {
    match Option::<Number>::deserialize(deserializer)? {
        None => Ok(None),
        Some(Number::Text(name)) => names
            .iter()
            .position(|candidate| *candidate == name)
            .map(|position| Some(position as i32))
            .ok_or_else(|| de::Error::custom(format!("unknown enum value {name:?}"))),
        Some(other) => to_i64(other).map(|number| Some(number as i32)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize, serde::Serialize, Debug, PartialEq, Default)]
    #[serde(default)]
    struct Message {
        #[serde(with = "int64")]
        signed: i64,
        #[serde(deserialize_with = "uint64::deserialize", skip_serializing)]
        unsigned: u64,
        #[serde(with = "opt_int64")]
        optional: Option<i64>,
        #[serde(with = "int64s")]
        many: Vec<i64>,
        #[serde(with = "bytes")]
        data: Vec<u8>,
    }

    #[test]
    fn integers_read_from_strings_numbers_and_null() {
        let message: Message = serde_json::from_str(
            r#"{"signed":"-5","unsigned":18446744073709551615,"optional":"7","many":[1,"2",3.0],"data":"aGk="}"#,
        )
        .unwrap();
        assert_eq!(
            message,
            Message {
                signed: -5,
                unsigned: u64::MAX,
                optional: Some(7),
                many: vec![1, 2, 3],
                data: b"hi".to_vec(),
            }
        );
        let nulls: Message =
            serde_json::from_str(r#"{"signed":null,"unsigned":null,"many":null,"data":null}"#)
                .unwrap();
        assert_eq!(nulls, Message::default());
        assert!(serde_json::from_str::<Message>(r#"{"signed":"x"}"#).is_err());
        assert!(serde_json::from_str::<Message>(r#"{"signed":1.5}"#).is_err());
        assert!(serde_json::from_str::<Message>(r#"{"unsigned":-1}"#).is_err());
        let written = serde_json::to_string(&message).unwrap();
        assert!(written.contains(r#""signed":"-5""#), "{written}");
        assert!(written.contains(r#""many":["1","2","3"]"#), "{written}");
    }
}
