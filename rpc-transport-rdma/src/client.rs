//! The client side of an RDMA connection.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use rpc_core::auth::{Credentials, HELLO_LEN, PROOF_LEN};
use rpc_core::client::Responses;
use rpc_core::frame::OutgoingFrame;
use rpc_core::transport::Progress;
use rpc_core::{CallTable, ClientTransport, Drive, FrameKind, FrameSender, Status, HEADER_LEN};

use crate::budget::ConnectionSlot;
use crate::config::{PollMode, RdmaConfig};
use crate::conn::Conn;
use crate::engine::Role;
use crate::events::expect_event;
use crate::protocol::{ConnectParams, Stats};
use crate::resources::{verbs_status, Resources};
use crate::response_sizes::{ResponseSizes, SizedResponses};
use crate::verbs::{CmEventKind, CmId, ConnParam, EventChannel, READS_THE_DEVICE_ALLOWS};

/// Longest a blocking call spins in one go with [`PollMode::Busy`] before it re-checks its
/// deadline.
const BUSY_SLICE: Duration = Duration::from_millis(10);

/// A connected RDMA client transport.
pub struct RdmaClient {
    conn: Arc<Conn>,
    spin: Option<Duration>,
    peer: String,
    response_sizes: Arc<ResponseSizes>,
}

impl std::fmt::Debug for RdmaClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaClient")
            .field("peer", &self.peer)
            .finish()
    }
}

pub(crate) fn resolve(addr: &str) -> Result<SocketAddr, Status> {
    addr.to_socket_addrs()
        .map_err(|e| Status::invalid_argument(format!("cannot resolve {addr}: {e}")))?
        .next()
        .ok_or_else(|| Status::invalid_argument(format!("{addr} resolved to no address")))
}

/// The server must answer our hello with proof that it holds the same secret.
fn check_server_proof(
    credentials: &Credentials,
    hello: &[u8; HELLO_LEN],
    private_data: &[u8],
    what: &str,
) -> Result<(), Status> {
    let proof = ConnectParams::auth_data(private_data, PROOF_LEN)
        .ok()
        .flatten()
        .ok_or_else(|| {
            Status::unauthenticated(format!(
                "{what}: the server did not authenticate itself (it requires no credentials, \
                 or is not the server that holds them)"
            ))
        })?;
    credentials
        .check_proof(hello, proof)
        .map_err(|status| Status::unauthenticated(format!("{what}: {}", status.message())))
}

/// "through DEVICE port N (ADDRESS)": where `id`, resolved, leaves.
fn through(id: &CmId) -> String {
    let device = id.context().map_or_else(|_| "?".to_owned(), |c| c.name());
    let from = id
        .local_addr()
        .map_or_else(|| "?".to_owned(), |a| a.ip().to_string());
    format!("through {device} port {} ({from})", id.port_num())
}

impl RdmaClient {
    /// Connects to `addr` (`host:port` of an RDMA device's IP address) and completes `calls`.
    pub fn connect(
        addr: &str,
        calls: Arc<CallTable>,
        config: &RdmaConfig,
    ) -> Result<Arc<RdmaClient>, Status> {
        let peer = format!("rdma://{addr}");
        let what = format!("cannot connect to {peer}");
        let dst = resolve(addr)?;
        let slot = ConnectionSlot::take(&peer)?;
        let deadline = Instant::now() + config.liveness.connect_timeout;
        let channel = EventChannel::new().map_err(|e| verbs_status(&what, e))?;
        channel
            .set_nonblocking(true)
            .map_err(|e| verbs_status(&what, e))?;
        let id = CmId::new(&channel).map_err(|e| verbs_status(&what, e))?;
        let nic_status =
            |status: Status| Status::new(status.code(), format!("{what}: {}", status.message()));
        let src = config.nic.local_address(&dst).map_err(nic_status)?;
        let from = |status: Status| {
            let hint = match (src, &config.nic.device) {
                (Some(src), Some(device)) => {
                    format!("from {src}, the address of device {device}: is {dst} reachable through it?")
                }
                (Some(src), None) => format!("from {src}: is it an address of an RDMA device?"),
                (None, _) => return status,
            };
            Status::new(status.code(), format!("{} ({hint})", status.message()))
        };
        id.resolve_addr(
            src.map(|ip| SocketAddr::new(ip, 0)),
            dst,
            config.liveness.connect_timeout,
        )
        .map_err(|e| from(verbs_status(&what, e)))?;
        expect_event(&channel, CmEventKind::AddrResolved, deadline, &what).map_err(from)?;
        id.resolve_route(config.liveness.connect_timeout)
            .map_err(|e| verbs_status(&what, e))?;
        expect_event(&channel, CmEventKind::RouteResolved, deadline, &what)?;
        config.nic.check(&id).map_err(nic_status)?;
        // With a NIC named, the handshake's failures name it and the source address: the
        // route was looked up on the named device's link only, and with no route there
        // covering the peer the kernel takes it to be on that link, which it may not be:
        // the handshake then only times out.
        let what = if config.nic.named() {
            format!("{what} {}", through(&id))
        } else {
            what
        };

        let res = Resources::create(&id, config, Role::Client, slot)?;
        let slot_body = u64::from(res.protocol.recv_slot_size).saturating_sub(HEADER_LEN as u64);
        let response_sizes = Arc::new(ResponseSizes::new(slot_body));
        let ours = res.protocol.connect_params();
        let hello = config.credentials.as_ref().map(Credentials::hello);
        let params = match &hello {
            Some(hello) => ours.encode_with_auth(hello),
            None => ours.encode().to_vec(),
        };
        id.connect(&ConnParam {
            private_data: &params,
            // The server READs request bodies offered to it (`LargeBodies::read_from`).
            responder_resources: READS_THE_DEVICE_ALLOWS,
            retry_count: config.liveness.retry_count,
            rnr_retry_count: config.liveness.rnr_retry,
            ..ConnParam::default()
        })
        .map_err(|e| verbs_status(&what, e))?;
        let established = expect_event(&channel, CmEventKind::Established, deadline, &what)?;
        if let (Some(credentials), Some(hello)) = (&config.credentials, &hello) {
            check_server_proof(credentials, hello, established.private_data(), &what)?;
        }
        let conn = Conn::new(res, id, established.private_data(), peer.clone(), config)?;
        let limit = usize::try_from(config.large.max_message).unwrap_or(usize::MAX);
        conn.set_inbound(Arc::new(SizedResponses {
            responses: Responses::new(calls, peer.clone(), limit),
            sizes: response_sizes.clone(),
        }));
        if let Err(status) = conn.start(true) {
            conn.close(status.clone());
            return Err(status);
        }
        Ok(Arc::new(RdmaClient {
            conn,
            spin: match config.polling.mode {
                PollMode::Busy => Some(BUSY_SLICE),
                mode => mode.spin(),
            },
            peer,
            response_sizes,
        }))
    }

    /// Counters and gauges of the connection's protocol state.
    pub fn stats(&self) -> Stats {
        self.conn.stats()
    }

    /// Largest frame (header, metadata and message) one SEND carries on this connection.
    pub fn max_frame(&self) -> usize {
        self.conn.max_frame()
    }
}

impl RdmaClient {
    /// Advertises a response buffer with a request: the application's, when the call
    /// offers one ([`rpc_core::Landing`]), else a leased one if the method answered
    /// large last time. With `waiting` (an async sender, which withdraws the offer if the
    /// request cannot go now), only when the request can go now: a withdrawn offer would
    /// hold the landing's buffer until its window is invalidated, and the next poll would
    /// go without it.
    fn advertise(&self, frame: &mut OutgoingFrame<'_>, waiting: bool) -> bool {
        let (kind, method_id) = (frame.header().kind, frame.header().method_id);
        // A streaming call's answers are stream messages: no buffer for them.
        if kind != FrameKind::Request || frame.header().flags.contains(rpc_core::Flags::STREAM) {
            return false;
        }
        let predicted = self.response_sizes.predict(method_id);
        let landing = frame.landing();
        if (landing.is_none() && predicted.is_none()) || (waiting && !self.conn.can_send_now(frame))
        {
            return false;
        }
        if let Some(landing) = landing {
            if self.conn.advertise_landing(frame, landing) {
                return true;
            }
        }
        predicted.is_some_and(|len| self.conn.advertise_response_buffer(frame, len))
    }
}

impl FrameSender for RdmaClient {
    fn send(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        let advertised = self.advertise(frame, false);
        let sent = self.conn.send(frame);
        if sent.is_err() && advertised {
            self.conn.withdraw_response_buffer(frame);
        }
        sent
    }

    fn poll_send(
        &self,
        cx: &mut Context<'_>,
        frame: &mut OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        let advertised = self.advertise(frame, true);
        let sent = self.conn.poll_send(cx, frame);
        if advertised && !matches!(sent, Poll::Ready(Ok(()))) {
            // Not sent (yet): the offer goes; a later poll starts over.
            self.conn.withdraw_response_buffer(frame);
        }
        sent
    }

    fn stage_limit(&self) -> Option<usize> {
        Some(rpc_core::frame::one_frame_stage(self.conn.max_frame()))
    }
}

impl ClientTransport for RdmaClient {
    fn send_control(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        self.conn.send_control(frame)
    }

    fn progress(&self) -> Option<&dyn Progress> {
        Some(self)
    }

    fn peer(&self) -> &str {
        &self.peer
    }

    fn close(&self) {
        self.conn.close(Status::unavailable(format!(
            "channel to {} closed",
            self.peer
        )));
    }
}

/// A waiting caller may poll the connection's completion queue itself: blocking calls spin
/// on it, async calls take the engine's drive lease.
impl Progress for RdmaClient {
    fn poll_progress(&self, until: Option<Instant>) -> bool {
        let left = until.map(|at| at.saturating_duration_since(Instant::now()));
        let budget = match (self.spin, left) {
            (Some(spin), Some(left)) => Some(spin.min(left)),
            (spin, left) => spin.or(left),
        };
        self.conn.spin_progress(budget)
    }

    fn drive(&self, cx: &mut Context<'_>, lease: &mut bool) -> Drive {
        self.conn.drive(cx, lease)
    }

    fn release(&self) {
        self.conn.stop_driving();
    }
}

impl Drop for RdmaClient {
    fn drop(&mut self) {
        ClientTransport::close(self);
    }
}
