//! The frame header decoder: any bytes decode to a header or a named error, never a panic;
//! what decodes encodes back to the same header.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpc_core::{Header, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
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
});
