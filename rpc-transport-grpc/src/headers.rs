//! gRPC's HTTP/2 headers and ours: metadata both ways (`-bin` values in base64), the
//! `grpc-timeout` budget, and a call's end (`grpc-status`, `grpc-message`
//! percent-encoded), as gRPC's `PROTOCOL-HTTP2.md` defines them.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD_NO_PAD;
use base64::Engine;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::HeaderMap;
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};
use rpc_core::{Code, MetadataMap, Status, BINARY_SUFFIX};

/// The content type of every gRPC request and response (`application/grpc+proto` and other
/// `application/grpc+…` forms are accepted on requests).
pub(crate) const GRPC_CONTENT_TYPE: &str = "application/grpc";
/// gRPC's own headers, made once (a name given as a string is parsed at every use).
pub(crate) const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
pub(crate) const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
pub(crate) const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
pub(crate) const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
pub(crate) const GRPC_ACCEPT_ENCODING: HeaderName = HeaderName::from_static("grpc-accept-encoding");
/// Longest `grpc-timeout` value: at most 8 digits and a unit.
const MAX_TIMEOUT_DIGITS: usize = 8;

/// What `grpc-message` leaves as is: printable ASCII but `%` (every other byte is
/// percent-encoded, as gRPC requires).
const MESSAGE_ESCAPES: &AsciiSet = &CONTROLS.add(b'%');

/// Whether `headers` name a gRPC content type.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v == GRPC_CONTENT_TYPE
                || v.strip_prefix(GRPC_CONTENT_TYPE)
                    .is_some_and(|rest| rest.starts_with('+') || rest.starts_with(';'))
        })
}

/// Whether a header is gRPC's or HTTP's own, not the call's metadata: the content type,
/// `te`, and every `grpc-` key (reserved by gRPC) but a status's details.
fn is_reserved(name: &str) -> bool {
    name == "content-type"
        || name == "te"
        || (name.starts_with("grpc-") && name != rpc_core::STATUS_DETAILS_KEY)
}

/// A request's metadata: every header but the reserved ones, `-bin` values decoded from
/// base64 (padded or not). A header our metadata cannot carry fails, naming it.
pub(crate) fn metadata_from(headers: &HeaderMap) -> Result<MetadataMap, Status> {
    let mut metadata = MetadataMap::new();
    for (name, value) in headers {
        let key = name.as_str();
        if is_reserved(key) {
            continue;
        }
        let bad = |why: String| Status::invalid_argument(format!("request header {key}: {why}"));
        if key.ends_with(BINARY_SUFFIX) {
            // Several values may share one header, comma-separated (base64 has no comma).
            for part in value.as_bytes().split(|b| *b == b',') {
                let bytes = decode_binary(part.trim_ascii())
                    .map_err(|e| bad(format!("not base64: {e}")))?;
                metadata
                    .insert(key, bytes)
                    .map_err(|e| bad(e.to_string()))?;
            }
        } else {
            metadata
                .insert(key, value.as_bytes())
                .map_err(|e| bad(e.to_string()))?;
        }
    }
    Ok(metadata)
}

/// A `-bin` value: base64, with or without padding, as gRPC reads it.
fn decode_binary(value: &[u8]) -> Result<Vec<u8>, base64::DecodeError> {
    let unpadded = value
        .strip_suffix(b"==")
        .or_else(|| value.strip_suffix(b"="));
    STANDARD_NO_PAD.decode(unpadded.unwrap_or(value))
}

/// Whether a response's metadata key is gRPC's or HTTP's own, which the response sets
/// itself (or HTTP/2 forbids): left out of the headers and trailers.
fn is_reserved_out(key: &str) -> bool {
    matches!(
        key,
        "content-type"
            | "te"
            | "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "upgrade"
            | "grpc-status"
            | "grpc-message"
            | "grpc-encoding"
            | "grpc-accept-encoding"
            | "grpc-timeout"
    )
}

/// Adds `metadata` to `headers`, `-bin` values in base64 without padding (as gRPC sends
/// them), but for keys the response sets itself ([`is_reserved_out`]). Our keys and values
/// are always valid headers; one that is not is left out and logged.
pub(crate) fn add_metadata(headers: &mut HeaderMap, metadata: &MetadataMap) {
    for (key, value) in metadata.iter() {
        if is_reserved_out(key) {
            tracing::debug!(key, "metadata key reserved by gRPC or HTTP/2; left out");
            continue;
        }
        let Ok(name) = HeaderName::from_bytes(key.as_bytes()) else {
            tracing::warn!(key, "metadata key is not a header name; left out");
            continue;
        };
        let value = if key.ends_with(BINARY_SUFFIX) {
            HeaderValue::from_str(&STANDARD_NO_PAD.encode(value))
        } else {
            HeaderValue::from_bytes(value)
        };
        match value {
            Ok(value) => {
                headers.append(name, value);
            }
            Err(_) => tracing::warn!(key, "metadata value is not a header value; left out"),
        }
    }
}

/// The time budget `grpc-timeout` gives, if any: at most 8 digits and a unit (`H`, `M`,
/// `S`, `m`, `u`, `n`). A malformed one fails, naming it.
pub(crate) fn timeout_from(headers: &HeaderMap) -> Result<Option<Duration>, Status> {
    let Some(value) = headers.get(GRPC_TIMEOUT) else {
        return Ok(None);
    };
    let bad = || {
        Status::invalid_argument(format!(
            "grpc-timeout {value:?} is not 1 to {MAX_TIMEOUT_DIGITS} digits and a unit (H, M, S, m, u, n)"
        ))
    };
    let text = value.to_str().map_err(|_| bad())?;
    let (digits, unit) = text.split_at(text.len().saturating_sub(1));
    if digits.is_empty()
        || digits.len() > MAX_TIMEOUT_DIGITS
        || !digits.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    Ok(Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return Err(bad()),
    }))
}

/// The headers that end a call with `code`, `message` (its bytes, UTF-8 by convention)
/// and `metadata` (the trailers, or an error's metadata and details).
pub(crate) fn status_headers(code: Code, message: &[u8], metadata: &MetadataMap) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(GRPC_STATUS, HeaderValue::from(code as u16));
    if !message.is_empty() {
        let text = String::from_utf8_lossy(message);
        let encoded = utf8_percent_encode(&text, MESSAGE_ESCAPES).to_string();
        if let Ok(value) = HeaderValue::from_str(&encoded) {
            headers.insert(GRPC_MESSAGE, value);
        }
    }
    add_metadata(&mut headers, metadata);
    headers
}

/// The headers that end a call with `status`.
pub(crate) fn headers_of(status: &Status) -> HeaderMap {
    static NO_TRAILERS: MetadataMap = MetadataMap::new();
    let wire = status.to_wire(&NO_TRAILERS);
    status_headers(status.code(), wire.message.as_bytes(), &wire.metadata)
}

/// Digits a `grpc-timeout` value carries at most.
const TIMEOUT_LIMIT: u64 = 100_000_000;

/// `grpc-timeout` for a budget of `micros` microseconds: the finest unit whose value fits
/// 8 digits.
pub(crate) fn grpc_timeout(micros: u64) -> HeaderValue {
    let value = [(1, 'u'), (1_000, 'm'), (1_000_000, 'S'), (60_000_000, 'M')]
        .into_iter()
        .find(|(per, _)| micros / per < TIMEOUT_LIMIT)
        .map_or_else(
            || format!("{}H", (micros / 3_600_000_000).min(TIMEOUT_LIMIT - 1)),
            |(per, unit)| format!("{}{unit}", micros / per),
        );
    HeaderValue::from_str(&value).expect("digits and a unit are a header value")
}

/// The status that headers (a Trailers-Only response) or trailers end a call with, if they
/// carry `grpc-status`: its code (an unknown one is `UNKNOWN`), its message
/// (percent-decoded) and its metadata, details included; metadata our rules refuse is
/// `INTERNAL`.
pub(crate) fn status_of(headers: &HeaderMap) -> Option<Status> {
    let raw = headers.get(GRPC_STATUS)?;
    let code = raw
        .to_str()
        .ok()
        .and_then(|v| v.parse::<u16>().ok())
        .map_or(Code::Unknown, |n| {
            Code::from_wire(n).unwrap_or(Code::Unknown)
        });
    let message = headers
        .get(GRPC_MESSAGE)
        .map(|v| {
            percent_encoding::percent_decode(v.as_bytes())
                .decode_utf8_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    Some(match metadata_from(headers) {
        Ok(metadata) => Status::from_wire(code, message.as_bytes(), metadata),
        Err(e) => Status::internal(format!("the server's status metadata: {}", e.message())),
    })
}

/// The status of an HTTP answer that is not gRPC's (gRPC's own mapping of HTTP statuses).
pub(crate) fn status_of_http(status: http::StatusCode) -> Status {
    let code = match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502..=504 => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(code, format!("the server answered HTTP {status}, not gRPC"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::STANDARD;

    fn decode_message(value: &str) -> String {
        percent_encoding::percent_decode(value.as_bytes())
            .decode_utf8_lossy()
            .into_owned()
    }

    fn encode_padded(value: &[u8]) -> String {
        STANDARD.encode(value)
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    }

    #[test]
    fn timeouts_in_every_unit_and_malformed_ones() {
        let t = |v: &str| timeout_from(&headers(&[("grpc-timeout", v)]));
        assert_eq!(t("1H").unwrap(), Some(Duration::from_secs(3600)));
        assert_eq!(t("2M").unwrap(), Some(Duration::from_secs(120)));
        assert_eq!(t("3S").unwrap(), Some(Duration::from_secs(3)));
        assert_eq!(t("250m").unwrap(), Some(Duration::from_millis(250)));
        assert_eq!(
            t("99999999u").unwrap(),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(t("7n").unwrap(), Some(Duration::from_nanos(7)));
        assert_eq!(timeout_from(&HeaderMap::new()).unwrap(), None);
        for bad in ["", "S", "100", "123456789S", "1x", "-1S", "1.5S", "1 S"] {
            let err = t(bad).unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{bad:?}");
            assert!(err.message().contains("grpc-timeout"), "{err}");
        }
    }

    #[test]
    fn metadata_leaves_out_reserved_headers_and_decodes_binary_either_way() {
        let map = headers(&[
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("grpc-timeout", "1S"),
            ("grpc-accept-encoding", "gzip"),
            ("user-agent", "grpc-python/1"),
            ("x-token", "abc"),
            ("x-raw-bin", &encode_padded(&[0, 1, 2, 255])),
            ("x-nopad-bin", &STANDARD_NO_PAD.encode([9u8])),
        ]);
        let metadata = metadata_from(&map).unwrap();
        let keys: Vec<&str> = metadata.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["user-agent", "x-token", "x-raw-bin", "x-nopad-bin"]);
        assert_eq!(metadata.get("x-raw-bin"), Some(&[0u8, 1, 2, 255][..]));
        assert_eq!(metadata.get("x-nopad-bin"), Some(&[9u8][..]));
    }

    #[test]
    fn binary_values_joined_by_commas_are_several_values() {
        let map = headers(&[("x-two-bin", "AQ==, AgM"), ("x-text", "a, b")]);
        let metadata = metadata_from(&map).unwrap();
        let two: Vec<&[u8]> = metadata
            .iter()
            .filter(|(k, _)| *k == "x-two-bin")
            .map(|(_, v)| v)
            .collect();
        assert_eq!(two, [&[1u8][..], &[2, 3][..]]);
        assert_eq!(
            metadata.get("x-text"),
            Some(&b"a, b"[..]),
            "text values stay whole"
        );
    }

    #[test]
    fn metadata_our_rules_refuse_is_named() {
        let err = metadata_from(&headers(&[("x-bad-bin", "***")])).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains("x-bad-bin"), "{err}");
        let err = metadata_from(&headers(&[("x-key", "tab\there")])).unwrap_err();
        assert!(err.message().contains("x-key"), "{err}");
    }

    #[test]
    fn metadata_round_trips_through_headers() {
        let mut metadata = MetadataMap::new();
        metadata.insert("x-a", "1").unwrap();
        metadata.insert("x-a", "2").unwrap();
        metadata.insert("x-blob-bin", [0u8, 0xfe, 7]).unwrap();
        let mut map = HeaderMap::new();
        add_metadata(&mut map, &metadata);
        assert_eq!(map.get("x-blob-bin").unwrap(), "AP4H");
        assert_eq!(metadata_from(&map).unwrap(), metadata);
    }

    #[test]
    fn a_response_cannot_set_what_grpc_and_http2_set() {
        let mut metadata = MetadataMap::new();
        for key in [
            "grpc-status",
            "grpc-message",
            "connection",
            "te",
            "content-type",
        ] {
            metadata.insert(key, "7").unwrap();
        }
        metadata.insert("x-kept", "1").unwrap();
        let map = status_headers(Code::Ok, b"", &metadata);
        assert_eq!(map.get_all("grpc-status").iter().count(), 1);
        assert_eq!(map.get("grpc-status").unwrap(), "0");
        for key in ["grpc-message", "connection", "te", "content-type"] {
            assert!(map.get(key).is_none(), "{key} was sent");
        }
        assert_eq!(map.get("x-kept").unwrap(), "1");
    }

    #[test]
    fn status_messages_are_percent_encoded() {
        let status = Status::invalid_argument("50% off: naïve\r\nline");
        let map = headers_of(&status);
        assert_eq!(map.get("grpc-status").unwrap(), "3");
        let sent = map.get("grpc-message").unwrap().to_str().unwrap();
        assert_eq!(sent, "50%25 off: na%C3%AFve%0D%0Aline");
        assert_eq!(decode_message(sent), status.message());
    }

    #[test]
    fn status_details_travel_as_a_binary_header() {
        let status = Status::with_details(Code::NotFound, "", &b"\x08\x05"[..]);
        let map = headers_of(&status);
        assert_eq!(map.get("grpc-status").unwrap(), "5");
        assert!(map.get("grpc-message").is_none());
        assert_eq!(map.get("grpc-status-details-bin").unwrap(), "CAU");
    }

    #[test]
    fn timeouts_sent_in_the_finest_unit_that_fits() {
        assert_eq!(grpc_timeout(1), "1u");
        assert_eq!(grpc_timeout(99_999_999), "99999999u");
        assert_eq!(grpc_timeout(100_000_000), "100000m");
        assert_eq!(grpc_timeout(u64::MAX), "99999999H");
        for micros in [1, 999, 123_456_789, 10_u64.pow(14), u64::MAX] {
            let sent = timeout_from(&headers(&[(
                "grpc-timeout",
                grpc_timeout(micros).to_str().unwrap(),
            )]))
            .unwrap()
            .unwrap();
            assert!(sent <= Duration::from_micros(micros), "{micros}: {sent:?}");
        }
    }

    #[test]
    fn statuses_read_from_headers() {
        let sent = Status::with_details(Code::NotFound, "gone: 50%", &b"why"[..]);
        let read = status_of(&headers_of(&sent)).unwrap();
        assert_eq!(read, sent);
        assert!(status_of(&HeaderMap::new()).is_none());
        let odd = status_of(&headers(&[("grpc-status", "99")])).unwrap();
        assert_eq!(odd.code(), Code::Unknown);
        assert_eq!(
            status_of_http(http::StatusCode::NOT_FOUND).code(),
            Code::Unimplemented
        );
        assert_eq!(
            status_of_http(http::StatusCode::BAD_GATEWAY).code(),
            Code::Unavailable
        );
    }

    #[test]
    fn grpc_content_types() {
        let ct = |v: &str| is_grpc(&headers(&[("content-type", v)]));
        assert!(ct("application/grpc"));
        assert!(ct("application/grpc+proto"));
        assert!(ct("application/grpc; charset=utf-8"));
        assert!(!ct("application/grpc-web"));
        assert!(!ct("application/json"));
        assert!(!is_grpc(&HeaderMap::new()));
    }
}
