//! The TCP authentication handshake, both ends: the server reads any preface a client
//! sends (a hello of any key, time and tag), the client reads any answer a server sends (a
//! proof, a refusal, or anything else). Each gives its peer's identity or a status, never a
//! panic; the server authenticates nobody whose tag it cannot check, and the client accepts
//! no proof it did not ask for.
//!
//! Input: a byte that picks the end, then what its peer sent.

use std::time::Duration;

use rpc_core::auth::{AuthConfig, Checker, Credentials, SharedSecrets, HELLO_LEN};
use rpc_core::body::RawBody;
use rpc_core::frame::OutgoingFrame;
use rpc_core::{Code, FrameKind, Header, MetadataMap};
use rpc_transport_tcp::codec::FrameWriter;
use rpc_transport_tcp::handshake::{
    check_answer, check_preface, ANSWER_LEN, AUTH_MAGIC, AUTH_VERSION, PREFACE_LEN,
};

const KEY: u32 = 7;
const SECRET: &[u8] = b"fuzzing secret";

pub(crate) fn run(data: &[u8]) {
    let Some((end, sent)) = data.split_first() else {
        return;
    };
    if end & 1 == 0 {
        server(sent);
    } else {
        client(sent);
    }
}

fn server(sent: &[u8]) {
    let checker = checker();
    let preface = <&[u8; PREFACE_LEN]>::try_from(sent.get(..PREFACE_LEN).unwrap_or(&[])).ok();
    if let Ok((peer, answer)) = check_preface(preface, &checker, "fuzzer") {
        let hello: &[u8; HELLO_LEN] = preface
            .and_then(|p| p[8..].try_into().ok())
            .expect("no credentials authenticate nobody here");
        assert_eq!(peer.identity.as_deref(), Some("fuzzer"));
        // Only a hello tagged with the secret passes: its proof is the one its sender
        // expects.
        let credentials = Credentials::new(KEY, SECRET);
        assert!(check_answer(&answer, &credentials, hello, "fuzzed server").is_ok());
    }
}

fn client(sent: &[u8]) {
    let credentials = Credentials::new(KEY, SECRET);
    let hello = hello();
    let accepted = check_answer(sent, &credentials, &hello, "fuzzed server").is_ok();
    if accepted {
        // Then it is the proof of this very hello, and nothing more.
        assert_eq!(sent.len(), ANSWER_LEN);
        let mut other = hello;
        other[0] ^= 1;
        assert!(check_answer(sent, &credentials, &other, "fuzzed server").is_err());
    }
}

/// A server that knows the key, and takes hellos of any time: what an input reaches does
/// not depend on the clock.
fn checker() -> Checker {
    let mut config = AuthConfig::new(SharedSecrets::new().with_key(KEY, SECRET, "fuzzer"));
    config.max_clock_skew = Duration::MAX;
    Checker::new(config)
}

/// The hello of the seeds, and the one the client sends.
fn hello() -> [u8; HELLO_LEN] {
    Credentials::new(KEY, SECRET).hello_at(1_800_000_000, *b"rpc-fuzz")
}

/// To mutate: a client's preface (to the server); a server's answer with the proof, one
/// with a wrong proof, and a server's refusal (to the client).
pub(crate) fn seeds() -> Vec<Vec<u8>> {
    let mut preface = [0u8; PREFACE_LEN];
    preface[..4].copy_from_slice(&AUTH_MAGIC);
    preface[4] = AUTH_VERSION;
    preface[8..].copy_from_slice(&hello());
    let (_, answer) = check_preface(Some(&preface), &checker(), "seed").expect("a valid hello");
    let to_server = [&[0u8][..], &preface].concat();
    let to_client = [&[1u8][..], &answer].concat();
    let mut wrong = to_client.clone();
    *wrong.last_mut().expect("a proof") ^= 1;
    let mut header = Header::new(FrameKind::Response, 0);
    header.status = Code::Unauthenticated;
    let reason = RawBody(b"unknown key 9");
    let metadata = MetadataMap::new();
    let refusal = OutgoingFrame::new(header, &metadata, &reason).expect("fits");
    let mut writer = FrameWriter::new(vec![1u8]);
    writer.write(&refusal).expect("a Vec takes every write");
    vec![to_server, to_client, wrong, writer.into_inner()]
}
