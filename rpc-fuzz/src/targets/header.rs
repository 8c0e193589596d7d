//! The frame header decoder: any bytes decode to a header or a named error, never a panic;
//! what decodes encodes back to the same header.

use rpc_core::{FrameKind, Header, HEADER_LEN};

pub(crate) fn run(data: &[u8]) {
    let _ = Header::wire_len(data);
    if let Ok(header) = Header::decode(data) {
        let mut buf = [0u8; HEADER_LEN];
        let len = header.encode(&mut buf);
        assert_eq!(
            Header::decode(&buf[..len]),
            Ok(header),
            "re-encoding changed the header"
        );
        let _ = header.is_rdma_only();
        let _ = header.message_len();
    }
}

/// Headers of both forms, to mutate.
pub(crate) fn seeds() -> Vec<Vec<u8>> {
    let mut compact = Header::new(FrameKind::Request, 7);
    compact.payload_len = 32;
    let mut full = Header::new(FrameKind::Response, 1 << 40);
    full.metadata_len = 12;
    full.timeout_us = 5_000;
    [compact, full]
        .iter()
        .map(|header| {
            let mut buf = [0u8; HEADER_LEN];
            let len = header.encode(&mut buf);
            buf[..len].to_vec()
        })
        .collect()
}
