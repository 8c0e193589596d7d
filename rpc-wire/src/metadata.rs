//! Small key-value metadata carried with requests and responses.
//!
//! Encoded on the wire as a protobuf message (`repeated Entry { string key = 1; bytes value = 2; }`)
//! so peers in any language can read it; keys follow gRPC's rules (lowercase ASCII letters,
//! digits, `-`, `_`, `.`).

use crate::body::EncodeBody;
use crate::error::Error;

/// Largest encoded metadata accepted from a peer or a caller.
pub const MAX_METADATA_LEN: usize = 16 * 1024;

#[derive(Clone, PartialEq, prost::Message)]
struct Entry {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// An ordered list of metadata entries; a key may repeat.
///
/// ```
/// let mut md = rpc_wire::MetadataMap::new();
/// md.insert("x-request-id", "abc-123").unwrap();
/// assert_eq!(md.get("x-request-id"), Some(&b"abc-123"[..]));
/// ```
#[derive(Clone, PartialEq, prost::Message)]
pub struct MetadataMap {
    #[prost(message, repeated, tag = "1")]
    entries: Vec<Entry>,
}

impl MetadataMap {
    /// An empty map.
    pub const fn new() -> Self {
        MetadataMap {
            entries: Vec::new(),
        }
    }

    /// Appends `key` → `value`. Fails if the key is not a valid metadata key.
    pub fn insert(&mut self, key: &str, value: impl AsRef<[u8]>) -> Result<(), Error> {
        validate_key(key)?;
        self.entries.push(Entry {
            key: key.to_owned(),
            value: value.as_ref().to_vec(),
        });
        Ok(())
    }

    /// The first value stored under `key`.
    pub fn get(&self, key: &str) -> Option<&[u8]> {
        self.entries
            .iter()
            .find(|e| e.key == key)
            .map(|e| e.value.as_slice())
    }

    /// All entries in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_slice()))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Decodes metadata received from a peer, validating size and keys.
    pub fn decode_from(bytes: &[u8]) -> Result<MetadataMap, Error> {
        if bytes.is_empty() {
            return Ok(MetadataMap::new());
        }
        if bytes.len() > MAX_METADATA_LEN {
            return Err(Error::TooLarge {
                what: "metadata",
                actual: bytes.len() as u64,
                limit: MAX_METADATA_LEN as u64,
            });
        }
        let map = <MetadataMap as prost::Message>::decode(bytes)
            .map_err(|e| Error::Metadata(e.to_string()))?;
        for entry in &map.entries {
            validate_key(&entry.key)?;
        }
        Ok(map)
    }

    /// Encoded size, checked against [`MAX_METADATA_LEN`].
    pub fn checked_encoded_len(&self) -> Result<usize, Error> {
        let len = EncodeBody::encoded_len(self);
        if len > MAX_METADATA_LEN {
            return Err(Error::TooLarge {
                what: "metadata",
                actual: len as u64,
                limit: MAX_METADATA_LEN as u64,
            });
        }
        Ok(len)
    }
}

fn validate_key(key: &str) -> Result<(), Error> {
    let valid = !key.is_empty()
        && key.len() <= 256
        && key
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.'));
    if valid {
        Ok(())
    } else {
        Err(Error::Metadata(format!(
            "invalid metadata key {key:?}: use 1-256 lowercase ASCII letters, digits, '-', '_' or '.'"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_in_order_with_repeats() {
        let mut md = MetadataMap::new();
        md.insert("a", "1").unwrap();
        md.insert("b", [0u8, 255]).unwrap();
        md.insert("a", "2").unwrap();
        let mut buf = vec![0; EncodeBody::encoded_len(&md)];
        md.encode_into(&mut buf);
        let back = MetadataMap::decode_from(&buf).unwrap();
        let entries: Vec<_> = back.iter().collect();
        assert_eq!(
            entries,
            vec![("a", &b"1"[..]), ("b", &[0u8, 255][..]), ("a", &b"2"[..])]
        );
        assert_eq!(back.get("a"), Some(&b"1"[..]));
    }

    #[test]
    fn rejects_bad_keys_from_callers_and_peers() {
        let mut md = MetadataMap::new();
        assert!(md.insert("Upper", "x").is_err());
        assert!(md.insert("", "x").is_err());
        // A peer sending a forbidden key is rejected at decode time.
        let forged = MetadataMap {
            entries: vec![Entry {
                key: "bad key".into(),
                value: vec![],
            }],
        };
        let mut buf = vec![0; EncodeBody::encoded_len(&forged)];
        forged.encode_into(&mut buf);
        assert!(MetadataMap::decode_from(&buf).is_err());
        assert!(MetadataMap::decode_from(&[0xff, 0xff, 0xff]).is_err());
    }
}
