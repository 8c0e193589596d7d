//! The receiving side of large bodies: memory for a body the peer sends, a landing the
//! application offered or a lease from the pool, lent through a window for its WRITEs or
//! read into by this side's READs; and the limit on how long a peer may hold it.

use std::time::Instant;

use rpc_core::{Code, Status};

use super::{Granted, State};
use crate::app_memory::Claim;
use crate::conn::grant::GrantBuffer;
use crate::conn::Conn;
use crate::large_pool::PoolError;
use crate::protocol::{BodyId, LocalBuffer};
use crate::verbs::MemoryWindow;

impl Conn {
    /// A landing the upper side offers for a request's body of `len` bytes (a server's):
    /// the first whose buffer is free and large enough, cleared first if another peer's
    /// bytes are in it; first among those for the body's method, if its request named it
    /// already ([`rpc_core::ServerBuilder::land_method_requests_in`]), then among those
    /// for any ([`rpc_core::ServerBuilder::land_requests_in`]).
    fn claim_landing(&self, state: &State, body: BodyId, len: u64) -> Option<Claim> {
        let len = usize::try_from(len).ok()?;
        // Stream messages land in the pool (a server receives no response body).
        if body.seq != 0 {
            return None;
        }
        let pd = &self.res.attachment.engine.pd;
        let method = state.proto.offered_method(body);
        let for_method = state
            .method_landings
            .iter()
            .filter(|(id, _)| Some(*id) == method)
            .map(|(_, landing)| landing);
        for_method
            .chain(state.landings.iter())
            .find_map(|landing| Claim::take(landing, pd, len, Some(self.serial)))
    }

    /// Answers the peer's buffer request: a landing, or a lease; a window; a grant. Or
    /// refuses.
    pub(in crate::conn) fn lend_buffer(&self, state: &mut State, body: BodyId, len: u64) {
        match self.lease_for(state, body, len) {
            Ok(GrantBuffer::Pool(buffer)) => {
                let len = buffer.len();
                self.grant(state, body, GrantBuffer::Pool(buffer), len);
            }
            Ok(landing) => self.grant(state, body, landing, len as usize),
            Err((reason, limit)) => self.refuse(state, body, len, &reason, limit),
        }
    }

    /// Answers the peer's offer of a body to read: a landing, or a lease, the READs' way
    /// in. Or refuses.
    pub(in crate::conn) fn lend_for_read(&self, state: &mut State, body: BodyId, len: u64) {
        match self.lease_for(state, body, len) {
            Ok(buffer) => {
                let local = LocalBuffer {
                    addr: buffer.addr(),
                    lkey: buffer.lkey(),
                };
                if let Some(grant) = state.proto.read_into(body, local, len) {
                    // Timed from when the body is in, if its notice has not come
                    // ([`super::LargeState::read_awaits_notice`]): the READs are ours.
                    let granted = Granted {
                        window: None,
                        len: len as usize,
                        buffer,
                        asked: None,
                        still_bound: false,
                    };
                    state.large.grants.insert(grant, granted);
                }
            }
            Err((reason, limit)) => self.refuse(state, body, len, &reason, limit),
        }
    }

    /// Memory for the peer's body of `len` bytes: a landing, or a lease. Or why not, and
    /// the connection's budget when that is what was short (another cause, the process's
    /// limit or the device, has no size to tell the peer).
    fn lease_for(
        &self,
        state: &State,
        body: BodyId,
        len: u64,
    ) -> Result<GrantBuffer, (String, u64)> {
        if let Some(claim) = self.claim_landing(state, body, len) {
            return Ok(GrantBuffer::App(claim));
        }
        let budget = self.res.large.budget();
        let len = usize::try_from(len).map_err(|_| {
            (
                format!("{len} bytes do not fit this machine's address space"),
                0,
            )
        })?;
        self.res
            .large
            .lease(len)
            .map(GrantBuffer::Pool)
            .map_err(|e| {
                let limit = if matches!(e, PoolError::Budget { .. }) {
                    budget
                } else {
                    0
                };
                (e.to_string(), limit)
            })
    }

    fn refuse(&self, state: &mut State, body: BodyId, len: u64, reason: &str, limit: u64) {
        tracing::warn!(peer = %self.peer, %body, len, %reason, "refusing a large body");
        state.proto.refuse(body, Code::ResourceExhausted, limit);
    }

    /// Grants `len` bytes of `buffer` for `body`, through a window of the pool; refuses if
    /// no window can be had.
    fn grant(&self, state: &mut State, body: BodyId, buffer: GrantBuffer, len: usize) {
        match self.res.large.window() {
            Ok(window) => self.grant_with(state, body, buffer, len, window),
            Err(e) => self.refuse(state, body, len as u64, &e.to_string(), 0),
        }
    }

    fn grant_with(
        &self,
        state: &mut State,
        body: BodyId,
        buffer: GrantBuffer,
        len: usize,
        window: MemoryWindow,
    ) {
        let rkey = window.next_rkey();
        match state.proto.grant(body, buffer.addr(), rkey, len as u64) {
            Some(grant) => {
                let granted = Granted {
                    window: Some(window),
                    len,
                    buffer,
                    asked: Some(Instant::now()),
                    still_bound: false,
                };
                state.large.grants.insert(grant, granted);
            }
            None => self.res.large.put_window(window),
        }
    }
}

impl Conn {
    /// Why the connection must close, if its peer has held a buffer it asked for longer
    /// than its [`GrantLimit`] allows without announcing the body, or a body read for it
    /// without sending the notice: it is hoarding registered memory. Checked by the
    /// poller's ticks.
    pub(in crate::conn) fn overdue_grant(&self, state: &State) -> Option<Status> {
        let limit = self.limits.grant;
        let (granted, age, allowed) = state.large.overdue(Instant::now(), limit)?;
        let len = granted.len;
        let what = match granted.window {
            Some(_) => format!("asked for a buffer of {len} bytes {age:?} ago and wrote no body"),
            None => format!(
                "offered a body of {len} bytes, read {age:?} ago, and sent no notice for it"
            ),
        };
        Some(Status::resource_exhausted(format!(
            "{} {what} (allowed {allowed:?}: large_grant_timeout {:?} plus the body at \
             large_grant_min_rate {} B/s); the connection is closed to free its buffer",
            self.peer, limit.timeout, limit.min_rate
        )))
    }
}
