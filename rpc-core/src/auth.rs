//! Connect-time authentication by shared secret, the same on both transports.
//!
//! The client proves that it holds the secret of a key the server knows, without sending
//! the secret: its [`HELLO_LEN`]-byte hello (in the rdma_cm connect private data, or the
//! TCP preface) carries the key's id, the time, a random nonce and an HMAC-SHA256 over
//! them, keyed by the secret. The server's [`Authenticator`] looks the key up, checks the
//! MAC ([`Attempt::verify`]: right secret, time within the allowed clock skew, nonce not
//! seen before in that window) and names the peer's identity, or rejects it with a status
//! the client sees as its connect error. All of it happens before the server registers
//! memory or creates a queue pair for the peer.
//!
//! The server answers with a [`PROOF_LEN`]-byte proof, an HMAC of the hello under the same
//! secret, so the client knows it reached a holder of the secret too.
//!
//! Hello layout (little-endian):
//!
//! | offset | size | field  |                                                    |
//! |-------:|-----:|--------|----------------------------------------------------|
//! | 0      | 4    | key_id | which secret                                       |
//! | 4      | 4    | time   | seconds since the Unix epoch (mod 2^32)            |
//! | 8      | 8    | nonce  | random                                             |
//! | 16     | 16   | mac    | HMAC-SHA256(secret, "rdma-rpc hello v1" ‖ 0..16)[..16] |
//!
//! Proof: HMAC-SHA256(secret, "rdma-rpc proof v1" ‖ hello)[..16].

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use parking_lot::Mutex;
use sha2::Sha256;

use crate::Status;

pub use rpc_wire::auth::{HELLO_LEN, PROOF_LEN};
/// Default [`AuthConfig::max_clock_skew`].
pub const DEFAULT_MAX_CLOCK_SKEW: Duration = Duration::from_secs(60);
/// Default [`AuthConfig::replay_cache`].
pub const DEFAULT_REPLAY_CACHE: usize = 65_536;

const HELLO_LABEL: &[u8] = b"rdma-rpc hello v1";
const PROOF_LABEL: &[u8] = b"rdma-rpc proof v1";
const MAC_LEN: usize = 16;

type HmacSha256 = Hmac<Sha256>;

fn mac(secret: &[u8], label: &[u8], data: &[u8]) -> [u8; MAC_LEN] {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(label);
    mac.update(data);
    let full = mac.finalize().into_bytes();
    let mut out = [0; MAC_LEN];
    out.copy_from_slice(&full[..MAC_LEN]);
    out
}

/// Compares in time independent of where the inputs differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Eight bytes from the operating system's random source.
fn random_nonce() -> [u8; 8] {
    let mut nonce = [0; 8];
    // Without a random source the nonce is the clock's nanoseconds: unique, not secret,
    // which is all a nonce must be.
    if getrandom::fill(&mut nonce).is_err() {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        nonce = nanos.to_le_bytes();
    }
    nonce
}

fn unix_seconds() -> u32 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    now.as_secs() as u32
}

/// A shared secret. Its `Debug` never shows it.
#[derive(Clone)]
pub struct Secret(Arc<[u8]>);

impl Secret {
    /// A secret of these bytes (use at least 16 random ones).
    pub fn new(bytes: impl AsRef<[u8]>) -> Secret {
        Secret(Arc::from(bytes.as_ref()))
    }

    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

/// What a client authenticates with: a key id the server knows and its secret.
#[derive(Debug, Clone)]
pub struct Credentials {
    key_id: u32,
    secret: Secret,
}

impl Credentials {
    /// Credentials of key `key_id` with `secret`.
    pub fn new(key_id: u32, secret: impl AsRef<[u8]>) -> Credentials {
        Credentials {
            key_id,
            secret: Secret::new(secret),
        }
    }

    /// A fresh hello (the current time, a new nonce).
    pub fn hello(&self) -> [u8; HELLO_LEN] {
        self.hello_at(unix_seconds(), random_nonce())
    }

    /// The hello of a client at `time` (seconds since the Unix epoch) with `nonce`: what
    /// [`Credentials::hello`] makes from the clock and a random nonce, made reproducible
    /// (tests, fuzzing).
    pub fn hello_at(&self, time: u32, nonce: [u8; 8]) -> [u8; HELLO_LEN] {
        let mut hello = [0; HELLO_LEN];
        hello[..4].copy_from_slice(&self.key_id.to_le_bytes());
        hello[4..8].copy_from_slice(&time.to_le_bytes());
        hello[8..16].copy_from_slice(&nonce);
        let tag = mac(self.secret.bytes(), HELLO_LABEL, &hello[..16]);
        hello[16..].copy_from_slice(&tag);
        hello
    }

    /// Checks the server's answer to `hello`.
    pub fn check_proof(&self, hello: &[u8; HELLO_LEN], proof: &[u8]) -> Result<(), Status> {
        if same(&mac(self.secret.bytes(), PROOF_LABEL, hello), proof) {
            Ok(())
        } else {
            Err(Status::unauthenticated(
                "the server could not prove it holds the shared secret",
            ))
        }
    }
}

/// Who is connecting, as the server's [`Authenticator`] sees it.
#[derive(Debug)]
pub struct Attempt<'a> {
    addr: &'a str,
    hello: Option<[u8; HELLO_LEN]>,
    check: &'a Checker,
    /// The secret [`Attempt::verify`] accepted, for the server's proof.
    verified: Mutex<Option<Secret>>,
}

impl Attempt<'_> {
    /// The peer's address, as a URL (`rdma://10.0.0.2:40312`, `tcp://...`).
    pub fn peer_addr(&self) -> &str {
        self.addr
    }

    /// The key the peer claims to hold; `None` if it sent no hello.
    pub fn key_id(&self) -> Option<u32> {
        self.hello
            .map(|h| u32::from_le_bytes([h[0], h[1], h[2], h[3]]))
    }

    /// Checks that the peer holds `secret` (the secret of [`Attempt::key_id`]): the hello's
    /// MAC, its time within the allowed clock skew, and its nonce unused in that window.
    pub fn verify(&self, secret: &Secret) -> Result<(), Status> {
        let hello = self
            .hello
            .ok_or_else(|| Status::unauthenticated("the peer sent no credentials"))?;
        if !same(
            &mac(secret.bytes(), HELLO_LABEL, &hello[..16]),
            &hello[16..],
        ) {
            return Err(Status::unauthenticated(format!(
                "bad credentials for key {}",
                self.key_id().unwrap_or_default()
            )));
        }
        self.check.fresh(&hello)?;
        *self.verified.lock() = Some(secret.clone());
        Ok(())
    }
}

/// Decides who may connect: verifies the peer's credentials (or lets it in without) and
/// names it. Runs on the transport's accepting thread, before anything is built for the
/// peer: keep it quick.
pub trait Authenticator: Send + Sync + 'static {
    /// The identity of the peer of `attempt`, or the status to reject it with.
    fn authenticate(&self, attempt: &Attempt<'_>) -> Result<String, Status>;
}

/// The keys a server accepts, each with the identity of its holders; peers without a known
/// key are rejected.
#[derive(Debug, Default, Clone)]
pub struct SharedSecrets {
    keys: HashMap<u32, (Secret, String)>,
}

impl SharedSecrets {
    /// No keys yet.
    pub fn new() -> SharedSecrets {
        SharedSecrets::default()
    }

    /// Accepts key `key_id` with `secret`; its holders are `identity`.
    pub fn with_key(
        mut self,
        key_id: u32,
        secret: impl AsRef<[u8]>,
        identity: impl Into<String>,
    ) -> Self {
        self.keys
            .insert(key_id, (Secret::new(secret), identity.into()));
        self
    }
}

impl Authenticator for SharedSecrets {
    fn authenticate(&self, attempt: &Attempt<'_>) -> Result<String, Status> {
        let key_id = attempt
            .key_id()
            .ok_or_else(|| Status::unauthenticated("this server requires credentials"))?;
        let (secret, identity) = self
            .keys
            .get(&key_id)
            .ok_or_else(|| Status::unauthenticated(format!("unknown key {key_id}")))?;
        attempt.verify(secret)?;
        Ok(identity.clone())
    }
}

/// A server's authentication settings.
#[derive(Clone)]
pub struct AuthConfig {
    /// Who may connect.
    pub authenticator: Arc<dyn Authenticator>,
    /// Largest difference between the peer's clock and ours a hello may show.
    pub max_clock_skew: Duration,
    /// Most hellos remembered against replay (those within the skew window); past it, new
    /// peers are refused with `RESOURCE_EXHAUSTED` until old ones age out.
    pub replay_cache: usize,
}

impl AuthConfig {
    /// `authenticator` with the default skew and replay cache.
    pub fn new(authenticator: impl Authenticator) -> AuthConfig {
        AuthConfig {
            authenticator: Arc::new(authenticator),
            max_clock_skew: DEFAULT_MAX_CLOCK_SKEW,
            replay_cache: DEFAULT_REPLAY_CACHE,
        }
    }
}

impl fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthConfig")
            .field("max_clock_skew", &self.max_clock_skew)
            .field("replay_cache", &self.replay_cache)
            .finish_non_exhaustive()
    }
}

/// A connected peer, as handlers see it ([`crate::Request::peer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Its address, as a URL.
    pub addr: String,
    /// Who it authenticated as; `None` on a server without authentication.
    pub identity: Option<String>,
}

/// Hellos seen (key id and nonce), by the time they carry, in arrival order; and as a set.
#[derive(Default)]
struct Seen {
    order: VecDeque<(u32, [u8; 12])>,
    set: HashSet<[u8; 12]>,
}

impl Peer {
    /// A peer at `addr` that did not authenticate (a server without authentication).
    pub fn anonymous(addr: impl Into<String>) -> Peer {
        Peer {
            addr: addr.into(),
            identity: None,
        }
    }
}

/// A server's side of authentication: the authenticator and the replay cache.
pub struct Checker {
    config: AuthConfig,
    /// Hellos seen within the skew window: (time, key id and nonce), oldest first.
    seen: Mutex<Seen>,
}

impl fmt::Debug for Checker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checker")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Checker {
    /// A checker with `config`.
    pub fn new(config: AuthConfig) -> Checker {
        Checker {
            config,
            seen: Mutex::new(Seen::default()),
        }
    }

    /// Authenticates the peer at `addr` by its `hello` (`None`: it sent none): its
    /// identity and the proof to answer with (`None` if it sent no hello), or the status to
    /// reject it with.
    pub fn check(
        &self,
        addr: &str,
        hello: Option<&[u8]>,
    ) -> Result<(Peer, Option<[u8; PROOF_LEN]>), Status> {
        let hello = match hello {
            None => None,
            Some(h) => Some(<[u8; HELLO_LEN]>::try_from(h).map_err(|_| {
                Status::unauthenticated(format!(
                    "credentials of {} bytes, expected {HELLO_LEN}",
                    h.len()
                ))
            })?),
        };
        let attempt = Attempt {
            addr,
            hello,
            check: self,
            verified: Mutex::new(None),
        };
        let identity = self.config.authenticator.authenticate(&attempt)?;
        let proof = match (hello, attempt.verified.into_inner()) {
            (Some(hello), Some(secret)) => Some(mac(secret.bytes(), PROOF_LABEL, &hello)),
            _ => None,
        };
        Ok((
            Peer {
                addr: addr.to_owned(),
                identity: Some(identity),
            },
            proof,
        ))
    }

    /// The hello is recent and new.
    fn fresh(&self, hello: &[u8; HELLO_LEN]) -> Result<(), Status> {
        let now = unix_seconds();
        let time = u32::from_le_bytes([hello[4], hello[5], hello[6], hello[7]]);
        let skew = self
            .config
            .max_clock_skew
            .as_secs()
            .min(u64::from(u32::MAX / 2)) as u32;
        let age = now.wrapping_sub(time) as i32;
        if age.unsigned_abs() > skew {
            return Err(Status::unauthenticated(format!(
                "credentials dated {age} s from our clock, more than the {skew} s allowed \
                 (AuthConfig::max_clock_skew)"
            )));
        }
        let mut id = [0; 12];
        id[..4].copy_from_slice(&hello[..4]);
        id[4..].copy_from_slice(&hello[8..16]);
        let mut seen = self.seen.lock();
        let Seen { order, set } = &mut *seen;
        // Hellos older than the window can no longer be replayed: forget them.
        while let Some(&(t, old)) = order.front() {
            if (now.wrapping_sub(t) as i32) <= skew as i32 {
                break;
            }
            order.pop_front();
            set.remove(&old);
        }
        if set.contains(&id) {
            return Err(Status::unauthenticated("credentials replayed"));
        }
        if set.len() >= self.config.replay_cache {
            return Err(Status::resource_exhausted(format!(
                "{} connection attempts within {skew} s, the limit \
                 (AuthConfig::replay_cache)",
                set.len()
            )));
        }
        set.insert(id);
        // Forgotten once its own time is out of the window (it could no longer be accepted);
        // kept in arrival order, so one dated later than those after it delays them a bit.
        order.push_back((time, id));
        Ok(())
    }
}

#[cfg(test)]
mod tests;
