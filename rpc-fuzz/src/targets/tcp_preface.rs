//! The TCP authentication handshake, both ends: the server reads any preface a client
//! sends (a hello of any key, time and tag), the client reads any answer a server sends (a
//! proof, a refusal, or anything else). Each gives its peer's identity or a status, never a
//! panic; the server authenticates nobody whose tag it cannot check, and the client accepts
//! no proof it did not ask for.
//!
//! Input: a byte that picks the end, then what its peer sent.

use rpc_core::auth::{AuthConfig, Checker, Credentials, SharedSecrets, HELLO_LEN};
use rpc_core::{Code, FrameKind, Header, HEADER_LEN};
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
    let config = AuthConfig::new(SharedSecrets::new().with_key(KEY, SECRET, "fuzzer"));
    let checker = Checker::new(config);
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
    let hello = [0x5a; HELLO_LEN];
    let accepted = check_answer(sent, &credentials, &hello, "fuzzed server").is_ok();
    if accepted {
        // Then it is the proof of this very hello, and nothing more.
        assert_eq!(sent.len(), ANSWER_LEN);
        let mut other = hello;
        other[0] ^= 1;
        assert!(check_answer(sent, &credentials, &other, "fuzzed server").is_err());
    }
}

/// To mutate: a client's preface (to the server); a server's answer with a wrong proof,
/// and a server's refusal (to the client).
pub(crate) fn seeds() -> Vec<Vec<u8>> {
    let credentials = Credentials::new(KEY, SECRET);
    let mut preface = vec![0u8];
    preface.extend_from_slice(&AUTH_MAGIC);
    preface.extend_from_slice(&[AUTH_VERSION, 0, 0, 0]);
    preface.extend_from_slice(&credentials.hello());
    let mut answer = vec![1u8];
    answer.extend_from_slice(&AUTH_MAGIC);
    answer.extend_from_slice(&[0; ANSWER_LEN - 4]);
    let mut refusal = vec![1u8];
    let mut header = Header::new(FrameKind::Response, 0);
    header.status = Code::Unauthenticated;
    let reason = b"unknown key 9";
    header.payload_len = reason.len() as u32;
    let mut buf = [0u8; HEADER_LEN];
    let len = header.encode(&mut buf);
    refusal.extend_from_slice(&buf[..len]);
    refusal.extend_from_slice(reason);
    vec![preface, answer, refusal]
}
