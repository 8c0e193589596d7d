//! Why a server rejected a connection, carried in the rdma_cm REJECT private data so the
//! client's error can name it.
//!
//! Layout: [`REJECT_MAGIC`] (`"RRRJ"`), one byte of gRPC status code (the kind of refusal:
//! `INVALID_ARGUMENT` for unusable parameters, `RESOURCE_EXHAUSTED` for a limit,
//! `UNAUTHENTICATED` for bad credentials, ...), then the reason in UTF-8, at most
//! [`MAX_REJECT_REASON`] bytes (cut at a character boundary). Private data that does not
//! start with the magic (a peer that is not rdma-rpc, or a reject by the CM itself) has no
//! reason to show.

use rpc_wire::Code;

/// First four bytes of a reject's private data: `"RRRJ"`.
pub const REJECT_MAGIC: [u8; 4] = *b"RRRJ";
/// Private data an RC REJECT may carry (InfiniBand CM limit).
pub const MAX_REJECT_PRIVATE_DATA: usize = 148;
/// Longest reason sent.
pub const MAX_REJECT_REASON: usize = MAX_REJECT_PRIVATE_DATA - REJECT_MAGIC.len() - 1;

/// The private data of a reject with `code` for `reason`.
pub fn encode_reject(code: Code, reason: &str) -> Vec<u8> {
    let mut end = reason.len().min(MAX_REJECT_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let mut data = Vec::with_capacity(REJECT_MAGIC.len() + 1 + end);
    data.extend_from_slice(&REJECT_MAGIC);
    data.push(code as u8);
    data.extend_from_slice(&reason.as_bytes()[..end]);
    data
}

/// The code and reason in a reject's private data, if an rdma-rpc server gave them (an
/// unknown code reads as `UNAVAILABLE`). rdma_cm pads private data with zeros, which are
/// dropped; bytes that are not UTF-8 are replaced.
pub fn decode_reject(data: &[u8]) -> Option<(Code, String)> {
    let (&code, reason) = data.strip_prefix(&REJECT_MAGIC)?.split_first()?;
    let code = Code::from_wire(u16::from(code))
        .filter(|&c| c != Code::Ok)
        .unwrap_or(Code::Unavailable);
    let end = reason.iter().position(|&b| b == 0).unwrap_or(reason.len());
    let reason = &reason[..end.min(MAX_REJECT_REASON)];
    Some((code, String::from_utf8_lossy(reason).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_round_trip_and_are_cut_to_fit() {
        let mut padded = encode_reject(Code::InvalidArgument, "bad parameters");
        padded.resize(MAX_REJECT_PRIVATE_DATA, 0);
        assert_eq!(
            decode_reject(&padded),
            Some((Code::InvalidArgument, "bad parameters".to_owned()))
        );
        let long = "é".repeat(100);
        let data = encode_reject(Code::Unauthenticated, &long);
        assert!(data.len() <= MAX_REJECT_PRIVATE_DATA);
        assert_eq!(
            decode_reject(&data),
            Some((Code::Unauthenticated, "é".repeat(MAX_REJECT_REASON / 2)))
        );
        assert_eq!(decode_reject(b"RRCMxxxx"), None);
        assert_eq!(decode_reject(&[]), None);
        assert_eq!(decode_reject(b"RRRJ"), None, "no code");
        assert_eq!(
            decode_reject(b"RRRJ\xee\xff\xfe"),
            Some((Code::Unavailable, "\u{fffd}\u{fffd}".to_owned())),
            "an unknown code, bytes that are not UTF-8"
        );
    }
}
