use super::*;
use crate::Code;

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

fn checker(replay_cache: usize) -> Checker {
    Checker::new(AuthConfig {
        replay_cache,
        ..AuthConfig::new(SharedSecrets::new().with_key(7, SECRET, "alice"))
    })
}

fn refused(result: Result<(Peer, Option<[u8; PROOF_LEN]>), Status>) -> Status {
    result.expect_err("refused")
}

#[test]
fn the_right_secret_names_the_peer_and_both_sides_prove_it() {
    let checker = checker(16);
    let credentials = Credentials::new(7, SECRET);
    let hello = credentials.hello();
    let (peer, proof) = checker.check("tcp://10.0.0.2:4000", Some(&hello)).unwrap();
    assert_eq!(
        peer,
        Peer {
            addr: "tcp://10.0.0.2:4000".into(),
            identity: Some("alice".into())
        }
    );
    let proof = proof.expect("a proof for the client");
    credentials.check_proof(&hello, &proof).unwrap();
    let impostor = Credentials::new(7, b"another secret");
    let status = impostor.check_proof(&hello, &proof).unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    let other_hello = credentials.hello();
    assert!(
        credentials.check_proof(&other_hello, &proof).is_err(),
        "a proof answers one hello"
    );
}

#[test]
fn wrong_secret_unknown_key_and_no_credentials_are_refused_with_the_reason() {
    let checker = checker(16);
    let cases = [
        (
            Some(Credentials::new(7, b"guess").hello()),
            "bad credentials for key 7",
        ),
        (Some(Credentials::new(8, SECRET).hello()), "unknown key 8"),
        (None, "requires credentials"),
    ];
    for (hello, reason) in cases {
        let status = refused(checker.check("rdma://x", hello.as_ref().map(|h| &h[..])));
        assert_eq!(status.code(), Code::Unauthenticated, "{status}");
        assert!(status.message().contains(reason), "{status}");
    }
    let status = refused(checker.check("rdma://x", Some(&[1, 2, 3])));
    assert!(status.message().contains("3 bytes"), "{status}");
}

#[test]
fn a_hello_is_accepted_once_and_only_while_fresh() {
    let checker = checker(16);
    let credentials = Credentials::new(7, SECRET);
    let hello = credentials.hello();
    checker.check("a", Some(&hello)).unwrap();
    let status = refused(checker.check("b", Some(&hello)));
    assert!(status.message().contains("replayed"), "{status}");
    let now = unix_seconds();
    for time in [now - 61, now + 61] {
        let stale = credentials.hello_at(time, [9; 8]);
        let status = refused(checker.check("c", Some(&stale)));
        assert!(status.message().contains("max_clock_skew"), "{status}");
    }
    let skewed = credentials.hello_at(now - 59, [10; 8]);
    checker.check("d", Some(&skewed)).unwrap();
}

#[test]
fn the_replay_cache_is_bounded_and_forgets_what_aged_out() {
    let checker = checker(2);
    let credentials = Credentials::new(7, SECRET);
    let now = unix_seconds();
    checker
        .check("a", Some(&credentials.hello_at(now - 60, [1; 8])))
        .unwrap();
    checker.check("b", Some(&credentials.hello())).unwrap();
    let status = refused(checker.check("c", Some(&credentials.hello())));
    assert_eq!(status.code(), Code::ResourceExhausted, "{status}");
    assert!(status.message().contains("replay_cache"), "{status}");
    // The oldest ages out of the window: room for one more.
    std::thread::sleep(Duration::from_millis(1100));
    checker.check("d", Some(&credentials.hello())).unwrap();
}

#[test]
fn an_authenticator_of_its_own_may_admit_anonymous_peers() {
    struct ByAddress;
    impl Authenticator for ByAddress {
        fn authenticate(&self, attempt: &Attempt<'_>) -> Result<String, Status> {
            match attempt.key_id() {
                None if attempt.peer_addr().starts_with("tcp://10.") => {
                    Ok(format!("anonymous at {}", attempt.peer_addr()))
                }
                None => Err(Status::permission_denied("not from the inside")),
                Some(key) => Err(Status::unauthenticated(format!("no key {key} here"))),
            }
        }
    }
    let checker = Checker::new(AuthConfig::new(ByAddress));
    let (peer, proof) = checker.check("tcp://10.1.1.1:9", None).unwrap();
    assert_eq!(
        peer.identity.as_deref(),
        Some("anonymous at tcp://10.1.1.1:9")
    );
    assert_eq!(proof, None, "no hello, no proof");
    let status = refused(checker.check("tcp://192.0.2.1:9", None));
    assert_eq!(status.code(), Code::PermissionDenied);
}

#[test]
fn secrets_never_show_in_debug_output() {
    let credentials = Credentials::new(7, SECRET);
    let shown = format!(
        "{credentials:?} {:?}",
        SharedSecrets::new().with_key(1, SECRET, "a")
    );
    assert!(!shown.contains("0123456789"), "{shown}");
}
