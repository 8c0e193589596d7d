//! Small key-value metadata carried with requests and responses.
//!
//! Encoded on the wire as a protobuf message (`repeated Entry { string key = 1; bytes value = 2; }`)
//! so peers in any language can read it. Keys and values follow gRPC's rules: a key is
//! lowercase ASCII letters, digits, `-`, `_` and `.`; a key ending in [`BINARY_SUFFIX`]
//! carries any bytes, every other key printable ASCII (space to `~`). Both ends check them.
//!
//! A response's metadata section holds two lists ([`ResponseMetadata`]): its headers, and the
//! trailers of a unary call, which the server sends with its message.

use crate::body::EncodeBody;
use crate::error::Error;

/// Largest encoded metadata accepted from a peer or a caller.
pub const MAX_METADATA_LEN: usize = 16 * 1024;

/// The ending of keys whose values are bytes rather than printable ASCII (gRPC's binary
/// headers).
pub const BINARY_SUFFIX: &str = "-bin";

#[derive(Clone, PartialEq, Eq, prost::Message)]
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
/// md.insert("x-digest-bin", [0u8, 0xff]).unwrap();
/// assert_eq!(md.get("x-request-id"), Some(&b"abc-123"[..]));
/// // Only a key ending in `-bin` takes bytes that are not printable ASCII.
/// assert!(md.insert("x-digest", [0u8, 0xff]).is_err());
/// ```
#[derive(Clone, PartialEq, Eq, prost::Message)]
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

    /// Appends `key` → `value`. Fails, naming the key, if the key is not a valid metadata
    /// key, or if its value is not printable ASCII and the key does not end in
    /// [`BINARY_SUFFIX`].
    pub fn insert(&mut self, key: &str, value: impl AsRef<[u8]>) -> Result<(), Error> {
        let value = value.as_ref();
        validate_entry(key, value)?;
        self.entries.push(Entry {
            key: key.to_owned(),
            value: value.to_vec(),
        });
        Ok(())
    }

    /// Removes every entry under `key`, returning the first one's value.
    pub fn remove(&mut self, key: &str) -> Option<Vec<u8>> {
        let first = self.entries.iter().position(|e| e.key == key)?;
        let value = std::mem::take(&mut self.entries[first].value);
        self.entries.retain(|e| e.key != key);
        Some(value)
    }

    /// Appends every entry of `other`, in order.
    pub fn extend(&mut self, other: &MetadataMap) {
        self.entries.extend_from_slice(&other.entries);
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

    /// Decodes metadata received from a peer, validating size, keys and values. A
    /// response's trailers, if the section holds any, are skipped
    /// ([`ResponseMetadata::decode_from`] reads both).
    pub fn decode_from(bytes: &[u8]) -> Result<MetadataMap, Error> {
        if bytes.is_empty() {
            return Ok(MetadataMap::new());
        }
        check_section_len(bytes.len())?;
        let map = <MetadataMap as prost::Message>::decode(bytes)
            .map_err(|e| Error::Metadata(e.to_string()))?;
        map.validate()?;
        Ok(map)
    }

    fn validate(&self) -> Result<(), Error> {
        self.entries
            .iter()
            .try_for_each(|e| validate_entry(&e.key, &e.value))
    }

    /// Encoded size, checked against [`MAX_METADATA_LEN`].
    pub fn checked_encoded_len(&self) -> Result<usize, Error> {
        let len = EncodeBody::encoded_len(self);
        check_section_len(len)?;
        Ok(len)
    }
}

/// A response's metadata section: its headers (field 1, as a [`MetadataMap`] encodes them)
/// and a unary call's trailers (field 2). Without trailers it is exactly the headers'
/// encoding, and [`MetadataMap::decode_from`] reads the headers of either.
#[derive(Clone, Copy, Debug)]
pub struct ResponseMetadata<'a> {
    /// The response's headers.
    pub headers: &'a MetadataMap,
    /// The trailers, sent with a unary call's message.
    pub trailers: &'a MetadataMap,
}

/// Both lists of a response's metadata section, decoded.
#[derive(Clone, PartialEq, Eq, prost::Message)]
struct Sections {
    #[prost(message, repeated, tag = "1")]
    headers: Vec<Entry>,
    #[prost(message, repeated, tag = "2")]
    trailers: Vec<Entry>,
}

/// Field number of the trailers in a response's metadata section.
const TRAILERS_FIELD: u32 = 2;

impl ResponseMetadata<'_> {
    /// Decodes a response's metadata section received from a peer into its headers and its
    /// trailers, validating them as [`MetadataMap::decode_from`] does.
    pub fn decode_from(bytes: &[u8]) -> Result<(MetadataMap, MetadataMap), Error> {
        if bytes.is_empty() {
            return Ok((MetadataMap::new(), MetadataMap::new()));
        }
        check_section_len(bytes.len())?;
        let sections = <Sections as prost::Message>::decode(bytes)
            .map_err(|e| Error::Metadata(e.to_string()))?;
        let headers = MetadataMap {
            entries: sections.headers,
        };
        let trailers = MetadataMap {
            entries: sections.trailers,
        };
        headers.validate()?;
        trailers.validate()?;
        Ok((headers, trailers))
    }

    /// Encoded size, checked against [`MAX_METADATA_LEN`].
    pub fn checked_encoded_len(&self) -> Result<usize, Error> {
        let len = EncodeBody::encoded_len(self);
        check_section_len(len)?;
        Ok(len)
    }
}

impl EncodeBody for ResponseMetadata<'_> {
    fn encoded_len(&self) -> usize {
        EncodeBody::encoded_len(self.headers)
            + prost::encoding::message::encoded_len_repeated(TRAILERS_FIELD, &self.trailers.entries)
    }

    fn encode_into(&self, dst: &mut [u8]) {
        let (headers, mut trailers) = dst.split_at_mut(EncodeBody::encoded_len(self.headers));
        self.headers.encode_into(headers);
        for entry in &self.trailers.entries {
            prost::encoding::message::encode(TRAILERS_FIELD, entry, &mut trailers);
        }
        debug_assert!(trailers.is_empty(), "encoded_len disagreed with encode");
    }
}

fn check_section_len(len: usize) -> Result<(), Error> {
    if len > MAX_METADATA_LEN {
        return Err(Error::TooLarge {
            what: "metadata",
            actual: len as u64,
            limit: MAX_METADATA_LEN as u64,
        });
    }
    Ok(())
}

fn validate_entry(key: &str, value: &[u8]) -> Result<(), Error> {
    validate_key(key)?;
    if key.ends_with(BINARY_SUFFIX) || value.iter().all(|b| matches!(b, b' '..=b'~')) {
        return Ok(());
    }
    Err(Error::Metadata(format!(
        "the value of metadata key {key:?} is not printable ASCII: only a key ending in \"{BINARY_SUFFIX}\" carries bytes"
    )))
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
        md.insert("b-bin", [0u8, 255]).unwrap();
        md.insert("a", "2").unwrap();
        let mut buf = vec![0; EncodeBody::encoded_len(&md)];
        md.encode_into(&mut buf);
        let back = MetadataMap::decode_from(&buf).unwrap();
        let entries: Vec<_> = back.iter().collect();
        assert_eq!(
            entries,
            vec![
                ("a", &b"1"[..]),
                ("b-bin", &[0u8, 255][..]),
                ("a", &b"2"[..])
            ]
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

    fn encode(body: &dyn EncodeBody) -> Vec<u8> {
        let mut buf = vec![0; body.encoded_len()];
        body.encode_into(&mut buf);
        buf
    }

    #[test]
    fn only_binary_keys_carry_bytes_that_are_not_printable_ascii() {
        let mut md = MetadataMap::new();
        md.insert("x-text", " printable ~ASCII, with spaces ")
            .unwrap();
        md.insert("x-empty", "").unwrap();
        md.insert("x-raw-bin", [0u8, b'\n', 0xc3, 0xa9, 0xff])
            .unwrap();
        for value in [&b"line\nbreak"[..], "caf\u{e9}".as_bytes(), &[0x7f]] {
            let err = md.insert("x-text", value).unwrap_err().to_string();
            assert!(err.contains("\"x-text\"") && err.contains("-bin"), "{err}");
        }
        assert_eq!(md.len(), 3, "a refused entry is not added");
        // A peer's entry breaking the rule is refused at decode time too.
        let forged = MetadataMap {
            entries: vec![Entry {
                key: "x-text".into(),
                value: vec![0],
            }],
        };
        let err = MetadataMap::decode_from(&encode(&forged)).unwrap_err();
        assert!(err.to_string().contains("\"x-text\""), "{err}");
        assert_eq!(MetadataMap::decode_from(&encode(&md)).unwrap(), md);
    }

    #[test]
    fn remove_takes_every_entry_under_a_key() {
        let mut md = MetadataMap::new();
        md.insert("a", "1").unwrap();
        md.insert("b", "2").unwrap();
        md.insert("a", "3").unwrap();
        assert_eq!(md.remove("a"), Some(b"1".to_vec()));
        assert_eq!(md.iter().collect::<Vec<_>>(), vec![("b", &b"2"[..])]);
        assert_eq!(md.remove("a"), None);
    }

    #[test]
    fn a_response_section_keeps_headers_and_trailers_apart() {
        let mut headers = MetadataMap::new();
        headers.insert("x-header", "h").unwrap();
        let mut trailers = MetadataMap::new();
        trailers.insert("x-trailer", "t").unwrap();
        trailers.insert("x-sum-bin", [0u8, 1]).unwrap();
        let both = ResponseMetadata {
            headers: &headers,
            trailers: &trailers,
        };
        let bytes = encode(&both);
        assert_eq!(bytes.len(), both.checked_encoded_len().unwrap());
        let (h, t) = ResponseMetadata::decode_from(&bytes).unwrap();
        assert_eq!((h, t), (headers.clone(), trailers.clone()));
        // A reader of headers alone skips the trailers.
        assert_eq!(MetadataMap::decode_from(&bytes).unwrap(), headers);
        // Without trailers the section is the headers' own encoding.
        let none = MetadataMap::new();
        let alone = ResponseMetadata {
            headers: &headers,
            trailers: &none,
        };
        assert_eq!(encode(&alone), encode(&headers));
        assert_eq!(
            ResponseMetadata::decode_from(&[]).unwrap(),
            (MetadataMap::new(), MetadataMap::new())
        );
    }

    #[test]
    fn a_response_section_is_bounded_and_checked_like_any_metadata() {
        let mut trailers = MetadataMap::new();
        trailers
            .insert("x-big-bin", vec![7u8; MAX_METADATA_LEN])
            .unwrap();
        let none = MetadataMap::new();
        let section = ResponseMetadata {
            headers: &none,
            trailers: &trailers,
        };
        let err = section.checked_encoded_len().unwrap_err();
        assert!(matches!(err, Error::TooLarge { .. }), "{err}");
        let err = ResponseMetadata::decode_from(&encode(&section)).unwrap_err();
        assert!(matches!(err, Error::TooLarge { .. }), "{err}");
        let forged = Sections {
            headers: vec![],
            trailers: vec![Entry {
                key: "Bad".into(),
                value: vec![],
            }],
        };
        let mut buf = Vec::new();
        prost::Message::encode(&forged, &mut buf).unwrap();
        assert!(ResponseMetadata::decode_from(&buf).is_err());
    }
}
