//! Authentication on TCP: a preface before the first frame (see `rpc_core::auth`).
//!
//! Only a server configured with authentication reads a preface, and only a client with
//! credentials sends one:
//!
//! * client → server, [`PREFACE_LEN`] bytes: `"RRAU"`, version `1`, three zero bytes, the
//!   client's hello ([`HELLO_LEN`]);
//! * server → client on success, [`ANSWER_LEN`] bytes: `"RRAU"`, status `0`, three zero
//!   bytes, the server's proof ([`PROOF_LEN`]); frames follow in both directions;
//! * on refusal, the connection-level status (a `Response` frame for call id 0, as a server
//!   at its connection limit sends) with `UNAUTHENTICATED` and the reason, then the server
//!   closes. A client without credentials reaching such a server gets the same refusal in
//!   place of its first answer.
//!
//! The frame magic is `"RR"` followed by version 3, so a preface never reads as a frame: a
//! server without authentication closes a connection that starts with one as a bad header,
//! and the client, which expects a proof, fails with `UNAUTHENTICATED`.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use rpc_core::auth::{Checker, Credentials, Peer, HELLO_LEN, PROOF_LEN};
use rpc_core::{Code, Header, Status};
use tokio::io::{AsyncRead, AsyncReadExt};

/// First four bytes of a preface and of its answer.
pub const AUTH_MAGIC: [u8; 4] = *b"RRAU";
/// Version of the preface.
pub const AUTH_VERSION: u8 = 1;
/// Bytes of the client's preface.
pub const PREFACE_LEN: usize = 8 + HELLO_LEN;
/// Bytes of the server's answer.
pub const ANSWER_LEN: usize = 8 + PROOF_LEN;
/// Most bytes of a refusal the client reads (a header and a status message).
const MAX_REFUSAL: usize = 64 + 4096;

/// A blocking stream over a TCP socket (the socket, or TLS on it), whose read timeout is
/// the socket's.
pub(crate) trait OnTcp: Read + Write {
    /// The socket.
    fn tcp(&self) -> &TcpStream;
}

impl OnTcp for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl OnTcp for rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    fn tcp(&self) -> &TcpStream {
        &self.sock
    }
}

/// The client's side, on the blocking socket before it joins the event loop: sends the
/// preface, reads the server's proof (or refusal) within `timeout`.
pub(crate) fn client(
    stream: &mut impl OnTcp,
    credentials: &Credentials,
    peer: &str,
    timeout: Duration,
) -> Result<(), Status> {
    let io_error = |e: io::Error| Status::unavailable(format!("authenticating to {peer}: {e}"));
    let hello = credentials.hello();
    let mut preface = [0u8; PREFACE_LEN];
    preface[..4].copy_from_slice(&AUTH_MAGIC);
    preface[4] = AUTH_VERSION;
    preface[8..].copy_from_slice(&hello);
    stream.write_all(&preface).map_err(io_error)?;
    let deadline = Instant::now() + timeout;
    let mut answer = Vec::with_capacity(ANSWER_LEN);
    // The answer, or as much of a refusal as the server sends before it closes.
    while answer.len() < ANSWER_LEN || !answer.starts_with(&AUTH_MAGIC) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || answer.len() >= MAX_REFUSAL {
            break;
        }
        stream
            .tcp()
            .set_read_timeout(Some(left))
            .map_err(io_error)?;
        let mut buf = [0u8; 1024];
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // A server that refused us over TLS may close without TLS's close_notify.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                break
            }
            Err(e) => return Err(io_error(e)),
        }
        if answer.starts_with(&AUTH_MAGIC) && answer.len() >= ANSWER_LEN {
            break;
        }
    }
    stream.tcp().set_read_timeout(None).map_err(io_error)?;
    check_answer(&answer, credentials, &hello, peer)
}

/// The client's reading of what the server at `peer` answered its `hello` with: its proof,
/// or the status of its refusal. Any bytes give one or the other.
pub fn check_answer(
    answer: &[u8],
    credentials: &Credentials,
    hello: &[u8; HELLO_LEN],
    peer: &str,
) -> Result<(), Status> {
    if answer.starts_with(&AUTH_MAGIC) && answer.len() >= ANSWER_LEN && answer[4] == 0 {
        if answer.len() > ANSWER_LEN {
            return Err(Status::unavailable(format!(
                "{peer} sent frames before its authentication answer"
            )));
        }
        return credentials
            .check_proof(hello, &answer[8..ANSWER_LEN])
            .map_err(|s| Status::unauthenticated(format!("{peer}: {}", s.message())));
    }
    Err(refusal(answer, peer))
}

/// What a server that did not answer with a proof said instead.
fn refusal(answer: &[u8], peer: &str) -> Status {
    if let Ok(header) = Header::decode(answer) {
        if header.call_id == 0 && header.status != Code::Ok {
            let start = header.encoded_len() + header.metadata_len as usize;
            let end = (start + header.payload_len as usize).min(answer.len());
            let reason = answer.get(start..end).unwrap_or_default();
            return Status::new(
                header.status,
                format!(
                    "{peer} refused the connection: {}",
                    String::from_utf8_lossy(reason)
                ),
            );
        }
    }
    Status::unauthenticated(format!(
        "{peer} did not authenticate itself (it requires no credentials, or is not an \
         rdma-rpc server)"
    ))
}

/// What the server's side of the handshake found.
pub(crate) struct Admitted {
    /// Who the peer is.
    pub(crate) who: Peer,
    /// The answer to send: to a preface only (a client without credentials expects none).
    pub(crate) answer: Option<[u8; ANSWER_LEN]>,
    /// The bytes read that were no preface: a client without credentials sends frames
    /// straight away, so they are the start of its first frame.
    pub(crate) first: Vec<u8>,
}

/// The server's side: reads the preface within `timeout` and authenticates the peer, or
/// returns the status to refuse it with. On plain TCP or inside TLS alike.
pub(crate) async fn server<S: AsyncRead + Unpin>(
    stream: &mut S,
    checker: &Checker,
    peer: &str,
    timeout: Duration,
) -> Result<Admitted, Status> {
    let mut preface = [0u8; PREFACE_LEN];
    let read = async {
        // A frame is longer than the magic, so these bytes come either way.
        stream.read_exact(&mut preface[..AUTH_MAGIC.len()]).await?;
        if preface[..AUTH_MAGIC.len()] != AUTH_MAGIC {
            return Ok(false);
        }
        stream
            .read_exact(&mut preface[AUTH_MAGIC.len()..])
            .await
            .map(|_| true)
    };
    let has_preface = match tokio::time::timeout(timeout, read).await {
        Ok(Ok(has)) => has,
        Ok(Err(e)) => {
            return Err(Status::unauthenticated(format!(
                "{peer} left before authenticating: {e}"
            )))
        }
        Err(_) => {
            return Err(Status::unauthenticated(format!(
                "{peer} sent no credentials within {timeout:?} \
                 (TcpServerConfig::handshake_timeout)"
            )))
        }
    };
    if !has_preface {
        let (who, _) = check_preface(None, checker, peer)?;
        let first = preface[..AUTH_MAGIC.len()].to_vec();
        return Ok(Admitted {
            who,
            answer: None,
            first,
        });
    }
    let (who, answer) = check_preface(Some(&preface), checker, peer)?;
    Ok(Admitted {
        who,
        answer: Some(answer),
        first: Vec::new(),
    })
}

/// The server's reading of the `preface` the client at `peer` sent (`None`: it started with
/// frames instead): who it is and the answer to send, or the status to refuse it with. Any
/// bytes give one or the other.
pub fn check_preface(
    preface: Option<&[u8; PREFACE_LEN]>,
    checker: &Checker,
    peer: &str,
) -> Result<(Peer, [u8; ANSWER_LEN]), Status> {
    let hello = match preface {
        None => None,
        Some(preface) if preface[4] == AUTH_VERSION => Some(&preface[8..]),
        Some(preface) => {
            return Err(Status::unauthenticated(format!(
                "authentication preface version {}; this server speaks {AUTH_VERSION}",
                preface[4]
            )))
        }
    };
    let (who, proof) = checker.check(peer, hello)?;
    let mut answer = [0u8; ANSWER_LEN];
    answer[..4].copy_from_slice(&AUTH_MAGIC);
    if let Some(proof) = proof {
        answer[8..].copy_from_slice(&proof);
    }
    Ok((who, answer))
}
