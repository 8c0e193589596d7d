//! [`ServerConfig`]: the server's settings and their defaults.

use crate::auth::AuthConfig;
use crate::stream::{Window, DEFAULT_STREAM_WINDOW, INITIAL_WINDOW};

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Largest encoded request accepted and response sent.
    pub max_message_size: usize,
    /// Poll each handler once on the thread that received its request; a handler that
    /// completes without waiting answers with no thread hand-off. Turn off for handlers that
    /// do heavy synchronous work before their first `.await`.
    pub inline_handlers: bool,
    /// Worker threads of the runtime the server creates when it is not given one.
    pub worker_threads: usize,
    /// Calls one connection may have in progress at once (handlers running, answers waiting
    /// for room to be sent), in the spirit of HTTP/2's `MAX_CONCURRENT_STREAMS`. Requests
    /// beyond it are answered `RESOURCE_EXHAUSTED` without running.
    pub max_calls_per_connection: usize,
    /// Calls all connections of the server may have in progress at once; requests beyond it
    /// are answered `RESOURCE_EXHAUSTED` without running.
    pub max_calls: usize,
    /// Who may connect ([`crate::auth`]); `None`: anyone who reaches the port.
    pub auth: Option<AuthConfig>,
    /// What a client may send on one stream before its handler reads it (never less than
    /// [`crate::stream::INITIAL_WINDOW`]): per stream, at most `bytes` plus
    /// `max_message_size` are buffered.
    pub stream_window: Window,
    /// Stream frames (messages, half-closes, window updates) one connection holds for calls
    /// whose `Request` has not arrived yet: a transport that hands frames up from two
    /// threads may deliver them first. Counted in frames and payload bytes; past it the
    /// frames of the call that began holding first are dropped (that call's stream then
    /// stalls until its deadline). The default, [`INITIAL_WINDOW`], is what one client may
    /// send on a stream before the server grants more.
    pub early_stream_frames: Window,
    /// Memory large request bodies land in where the transport can place them (over
    /// `rdma://`, registered buffers): a body goes into the first landing whose buffer is
    /// free (nothing views it any more) and large enough, else into the transport's own
    /// memory. The handler's `bytes` fields are then views of the application's buffer.
    pub request_landings: Vec<crate::Landing>,
    /// Landings for the large request bodies of one method each (by
    /// [`crate::method_id`] of its path), tried before [`ServerConfig::request_landings`].
    /// Over `rdma://` the server then reads an offered body only once the request naming
    /// its method arrived, right behind the offer; a body written by the rendezvous (its
    /// method unknown until it is in) lands as if no method had landings.
    pub method_landings: Vec<(u32, crate::Landing)>,
}

/// Calls one connection may have in progress, unless [`ServerConfig::max_calls_per_connection`]
/// says otherwise.
pub const DEFAULT_MAX_CALLS_PER_CONNECTION: usize = 1024;
/// Calls a server may have in progress, unless [`ServerConfig::max_calls`] says otherwise.
pub const DEFAULT_MAX_CALLS: usize = 16 * 1024;

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_message_size: crate::message::DEFAULT_MAX_MESSAGE_SIZE,
            inline_handlers: true,
            worker_threads: 2,
            max_calls_per_connection: DEFAULT_MAX_CALLS_PER_CONNECTION,
            max_calls: DEFAULT_MAX_CALLS,
            auth: None,
            stream_window: DEFAULT_STREAM_WINDOW,
            early_stream_frames: INITIAL_WINDOW,
            request_landings: Vec::new(),
            method_landings: Vec::new(),
        }
    }
}
