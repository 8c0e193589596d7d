//! Header encoding, both forms, and validation of hostile bytes.

use super::*;
use proptest::prelude::*;

fn sample() -> Header {
    Header {
        flags: Flags::NONE,
        method_id: 0xDEAD_BEEF,
        metadata_len: 12,
        payload_len: 4096,
        credits: 7,
        timeout_us: 1_500_000,
        ..Header::new(FrameKind::Request, 42)
    }
}

#[test]
fn round_trips_every_field() {
    let mut h = sample();
    h.flags = Flags::RESPONSE_BUFFER;
    h.remote = RemoteBuffer {
        addr: 0x7fff_0000_1000,
        rkey: 0x1234,
        generation: 9,
        len: 1 << 30,
    };
    assert_eq!(Header::decode(&h.to_bytes()), Ok(h));

    let mut resp = Header::new(FrameKind::Response, u64::MAX);
    resp.status = Code::ResourceExhausted;
    resp.payload_len = 3;
    assert_eq!(Header::decode(&resp.to_bytes()), Ok(resp));
}

#[test]
fn wire_layout_is_little_endian_and_fixed() {
    let bytes = sample().to_bytes();
    assert_eq!(&bytes[0..4], &[0x52, 0x52, PROTOCOL_VERSION, 1]);
    assert_eq!(&bytes[8..16], &42u64.to_le_bytes());
    assert_eq!(&bytes[16..20], &0xDEAD_BEEFu32.to_le_bytes());
    assert_eq!(&bytes[24..28], &4096u32.to_le_bytes());
}

#[test]
fn rejects_bad_fields_with_named_errors() {
    let good = sample().to_bytes();
    let with = |at: usize, v: u8| {
        let mut b = good;
        b[at] = v;
        Header::decode(&b)
    };
    assert_eq!(with(0, 0), Err(HeaderError::BadMagic(0x5200)));
    assert_eq!(with(2, 9), Err(HeaderError::UnsupportedVersion(9)));
    assert_eq!(with(3, 99), Err(HeaderError::UnknownKind(99)));
    assert_eq!(with(5, 0x80), Err(HeaderError::UnknownFlags(0x8000)));
    assert_eq!(with(6, 17), Err(HeaderError::InvalidStatus(17)));
    assert_eq!(
        with(6, 2),
        Err(HeaderError::StatusOnNonResponse {
            kind: FrameKind::Request
        })
    );
    assert_eq!(
        Header::decode(&good[..63]),
        Err(HeaderError::Truncated { len: 63, need: 64 })
    );
}

fn small() -> Header {
    Header {
        method_id: 0xDEAD_BEEF,
        payload_len: 34,
        credits: 3,
        ..Header::new(FrameKind::Request, 42)
    }
}

#[test]
fn headers_without_timeout_or_descriptor_are_compact() {
    let h = small();
    assert!(h.is_compact());
    assert_eq!(h.encoded_len(), COMPACT_HEADER_LEN);
    let mut buf = [0xEEu8; HEADER_LEN];
    assert_eq!(h.encode(&mut buf), COMPACT_HEADER_LEN);
    assert_eq!(
        &buf[COMPACT_HEADER_LEN..],
        &[0xEE; 32],
        "nothing past the header"
    );
    assert_eq!(&buf[4..6], &COMPACT_BIT.to_le_bytes());
    assert_eq!(Header::wire_len(&buf), Ok(COMPACT_HEADER_LEN));
    // A compact header decodes from exactly its 32 bytes.
    assert_eq!(Header::decode(&buf[..COMPACT_HEADER_LEN]), Ok(h));
    assert_eq!(
        Header::decode(&buf[..31]),
        Err(HeaderError::Truncated { len: 31, need: 32 })
    );
    // Control frames too.
    for kind in [
        FrameKind::Cancel,
        FrameKind::CreditOnly,
        FrameKind::Response,
    ] {
        let call_id = u64::from(kind != FrameKind::CreditOnly);
        assert_eq!(Header::new(kind, call_id).encoded_len(), COMPACT_HEADER_LEN);
    }
    // Anything in the omitted half, and the rendezvous kinds, need the full form.
    let full = [
        Header {
            timeout_us: 1,
            ..small()
        },
        Header {
            flags: Flags::LARGE_PAYLOAD,
            ..small()
        },
        Header {
            remote: RemoteBuffer {
                len: 10,
                ..RemoteBuffer::default()
            },
            ..Header::new(FrameKind::LargeRequest, 1)
        },
    ];
    for h in full {
        assert_eq!(h.encoded_len(), HEADER_LEN, "{h:?}");
        assert_eq!(Header::wire_len(&h.to_bytes()), Ok(HEADER_LEN));
        assert_eq!(Header::decode(&h.to_bytes()), Ok(h));
    }
    assert_eq!(
        Header::wire_len(&[0x52, 0x52, 2]),
        Err(HeaderError::Truncated { len: 3, need: 32 })
    );
}

#[test]
fn each_header_has_one_form() {
    // A full header whose omitted half is zero must have been compact.
    let mut bytes = [0u8; HEADER_LEN];
    small().encode(&mut bytes);
    bytes[4] &= !(COMPACT_BIT as u8);
    assert_eq!(
        Header::decode(&bytes),
        Err(HeaderError::WrongForm {
            kind: FrameKind::Request,
            compact: false
        })
    );
    // A compact header cannot carry flags that need the full form.
    let mut bytes = small().to_bytes();
    bytes[4] |= Flags::LARGE_PAYLOAD.bits() as u8;
    assert_eq!(
        Header::decode(&bytes),
        Err(HeaderError::WrongForm {
            kind: FrameKind::Request,
            compact: true
        })
    );
    let mut bytes = Header::new(FrameKind::LargeRequest, 1).to_bytes();
    bytes[4] |= COMPACT_BIT as u8;
    assert_eq!(
        Header::decode(&bytes[..COMPACT_HEADER_LEN]),
        Err(HeaderError::WrongForm {
            kind: FrameKind::LargeRequest,
            compact: true
        })
    );
}

#[test]
fn rejects_kind_specific_violations() {
    let mut cancel = Header::new(FrameKind::Cancel, 5);
    cancel.payload_len = 1;
    assert_eq!(
        Header::decode(&cancel.to_bytes()),
        Err(HeaderError::UnexpectedBody {
            kind: FrameKind::Cancel
        })
    );
    let mut credit = Header::new(FrameKind::CreditOnly, 3);
    credit.credits = 4;
    assert_eq!(
        Header::decode(&credit.to_bytes()),
        Err(HeaderError::CallIdOnCreditOnly(3))
    );
    let mut stray = Header::new(FrameKind::Request, 1);
    stray.remote.rkey = 77;
    assert_eq!(
        Header::decode(&stray.to_bytes()),
        Err(HeaderError::StrayDescriptor {
            kind: FrameKind::Request
        })
    );
    let mut grant_flags = Header::new(FrameKind::LargeGrant, 1);
    grant_flags.flags = Flags::LARGE_PAYLOAD;
    grant_flags.remote.len = 10;
    assert_eq!(
        Header::decode(&grant_flags.to_bytes()),
        Err(HeaderError::FlagsNotAllowed {
            kind: FrameKind::LargeGrant,
            flags: 1
        })
    );
    let mut ask = Header::new(FrameKind::LargeRequest, 1);
    ask.remote.len = 100;
    assert_eq!(Header::decode(&ask.to_bytes()), Ok(ask));
    ask.remote.rkey = 5;
    assert!(matches!(
        Header::decode(&ask.to_bytes()),
        Err(HeaderError::BadDescriptor { .. })
    ));
    let mut refusal = Header::new(FrameKind::LargeGrant, 1);
    refusal.status = Code::ResourceExhausted;
    assert_eq!(Header::decode(&refusal.to_bytes()), Ok(refusal));
    refusal.remote.addr = 4096;
    assert!(matches!(
        Header::decode(&refusal.to_bytes()),
        Err(HeaderError::BadDescriptor { .. })
    ));
    let mut placed_response = Header::new(FrameKind::Response, 1);
    placed_response.flags = Flags::RESPONSE_BUFFER;
    assert!(matches!(
        Header::decode(&placed_response.to_bytes()),
        Err(HeaderError::FlagsNotAllowed { .. })
    ));
}

#[test]
fn placed_bodies_do_not_follow_the_header() {
    let mut h = Header::new(FrameKind::Response, 3);
    h.flags = Flags::LARGE_PAYLOAD;
    h.metadata_len = 10;
    h.payload_len = 1 << 20;
    assert_eq!(Header::decode(&h.to_bytes()), Ok(h));
    assert_eq!((h.body_len(), h.message_len()), (0, 10 + (1 << 20)));
    assert!(h.is_rdma_only());
    assert!(!sample().is_rdma_only());
}

#[test]
fn validate_agrees_with_the_decoder() {
    let mut credit = Header::new(FrameKind::CreditOnly, 3);
    credit.credits = 4;
    assert_eq!(credit.validate(), Err(HeaderError::CallIdOnCreditOnly(3)));
    let mut stray = Header::new(FrameKind::Cancel, 1);
    stray.status = Code::Internal;
    assert_eq!(
        stray.validate(),
        Header::decode(&stray.to_bytes()).map(|_| ())
    );
    assert_eq!(sample().validate(), Ok(()));
}

proptest! {
    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..160)) {
        let _ = Header::decode(&bytes);
    }

    #[test]
    fn decoding_mutated_valid_headers_never_panics(
        at in 0usize..HEADER_LEN, value in any::<u8>()
    ) {
        for original in [sample(), small()] {
            let mut bytes = original.to_bytes();
            bytes[at] = value;
            if let Ok(h) = Header::decode(&bytes) {
                // Whatever decodes must re-encode to the same bytes.
                let len = h.encoded_len();
                prop_assert_eq!(Header::wire_len(&bytes), Ok(len));
                prop_assert_eq!(&h.to_bytes()[..len], &bytes[..len]);
                prop_assert_eq!(h.validate(), Ok(()));
            }
        }
    }
}

#[test]
fn a_messages_frame_carries_a_payload_and_nothing_else() {
    let mut batch = Header::stream(FrameKind::Messages, 9, 5);
    batch.payload_len = 100;
    let wire = batch.to_bytes();
    assert_eq!(Header::decode(&wire[..COMPACT_HEADER_LEN]), Ok(batch));
    assert_eq!(wire[3], 11, "kind 11 on the wire");
    for (flags, bits) in [(Flags::LARGE_PAYLOAD, 1), (Flags::STREAM, 8)] {
        let mut flagged = batch;
        flagged.flags = flags;
        assert_eq!(
            flagged.validate(),
            Err(HeaderError::FlagsNotAllowed {
                kind: FrameKind::Messages,
                flags: bits
            })
        );
    }
    let mut with_metadata = batch;
    with_metadata.metadata_len = 4;
    assert_eq!(
        with_metadata.validate(),
        Err(HeaderError::UnexpectedBody {
            kind: FrameKind::Messages
        })
    );
    let mut with_status = batch;
    with_status.status = Code::Internal;
    assert_eq!(
        with_status.validate(),
        Err(HeaderError::StatusOnNonResponse {
            kind: FrameKind::Messages
        })
    );
}

#[test]
fn a_sender_grows_an_encoded_frame_in_place() {
    for mut header in [small(), sample()] {
        let mut wire = header.to_bytes();
        Header::set_encoded_payload_len(&mut wire, 12_345);
        header.payload_len = 12_345;
        let len = header.encoded_len();
        assert_eq!(Header::decode(&wire[..len]), Ok(header));
    }
}

#[test]
fn offered_bodies_name_their_source_and_its_answer_names_none() {
    let mut offer = Header::stream(FrameKind::LargeSource, 4, 0);
    offer.remote = RemoteBuffer {
        addr: 0x7000,
        rkey: 9,
        generation: 2,
        len: 300_000,
    };
    assert_eq!(Header::decode(&offer.to_bytes()), Ok(offer));
    assert_eq!(offer.encoded_len(), HEADER_LEN);
    assert!(offer.is_rdma_only());
    offer.remote.len = 0;
    assert!(matches!(
        Header::decode(&offer.to_bytes()),
        Err(HeaderError::BadDescriptor { .. })
    ));

    let done = Header::new(FrameKind::LargeSourceDone, 4);
    assert_eq!(Header::decode(&done.to_bytes()), Ok(done));
    assert_eq!(
        done.encoded_len(),
        HEADER_LEN,
        "a rendezvous kind is never compact"
    );
    assert!(done.is_rdma_only());
    let mut read_with_len = done;
    read_with_len.remote.len = 5;
    assert!(matches!(
        Header::decode(&read_with_len.to_bytes()),
        Err(HeaderError::BadDescriptor { .. })
    ));
    let mut refused = done;
    refused.status = Code::ResourceExhausted;
    refused.remote.len = 1 << 20;
    assert_eq!(Header::decode(&refused.to_bytes()), Ok(refused));
    refused.remote.rkey = 3;
    assert!(matches!(
        Header::decode(&refused.to_bytes()),
        Err(HeaderError::BadDescriptor { .. })
    ));
    let mut with_body = Header::new(FrameKind::LargeSource, 4);
    with_body.remote.len = 10;
    with_body.payload_len = 3;
    assert_eq!(
        Header::decode(&with_body.to_bytes()),
        Err(HeaderError::UnexpectedBody {
            kind: FrameKind::LargeSource
        })
    );
}
