//! Which method a call invokes, as the client names it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap;

use super::{MethodMetrics, Side};

/// A method as generated clients name it: its path, its id, which sides stream, and (once
/// called) its client metrics.
///
/// ```
/// static SAY_HELLO: rpc_core::Method = rpc_core::Method::new("/hello.Greeter/SayHello");
/// assert_eq!(SAY_HELLO.id(), rpc_core::method_id("/hello.Greeter/SayHello"));
/// ```
#[derive(Debug)]
pub struct Method {
    path: &'static str,
    id: u32,
    kind: MethodKind,
    pub(super) metrics: OnceLock<&'static MethodMetrics>,
    /// Whether [`called`] knows it.
    noted: AtomicBool,
}

impl Method {
    /// The unary method at `path` (`/package.Service/Method`).
    pub const fn new(path: &'static str) -> Method {
        Method::of_kind(path, MethodKind::Unary)
    }

    /// The method at `path`, of `kind` (generated code says which sides of a streaming
    /// method stream).
    pub const fn of_kind(path: &'static str, kind: MethodKind) -> Method {
        Method {
            path,
            id: crate::message::method_id(path),
            kind,
            metrics: OnceLock::new(),
            noted: AtomicBool::new(false),
        }
    }

    /// Which sides stream.
    pub const fn kind(&self) -> MethodKind {
        self.kind
    }

    /// Its path.
    pub const fn path(&self) -> &'static str {
        self.path
    }

    /// Its id on the wire ([`crate::method_id`] of its path).
    pub const fn id(&self) -> u32 {
        self.id
    }
}

/// The method of a call: a [`Method`] (what generated clients pass), or a bare method id
/// (its metrics and spans then name it `/unknown/<id>`).
#[derive(Debug, Clone, Copy)]
pub enum MethodRef {
    /// A named method.
    Named(&'static Method),
    /// A bare method id.
    Id(u32),
}

impl From<&'static Method> for MethodRef {
    fn from(method: &'static Method) -> Self {
        MethodRef::Named(method)
    }
}

impl From<u32> for MethodRef {
    fn from(id: u32) -> Self {
        MethodRef::Id(id)
    }
}

/// The [`Method`]s this process called, by id (`None`: two paths of the same id).
static CALLED: OnceLock<RwLock<FxHashMap<u32, Option<&'static Method>>>> = OnceLock::new();

/// The method of id `id`, if this process called it as a [`Method`] (generated clients
/// do), and no other path with the same id: how a transport that names methods by path
/// (gRPC's) finds the path of a request. The table holds each method at most once: it is
/// bounded by the methods the program names.
pub fn called(id: u32) -> Option<&'static Method> {
    CALLED.get()?.read().get(&id).copied().flatten()
}

impl MethodRef {
    /// Makes the method known to [`called`] (once per method: later calls cost one load).
    pub(crate) fn note(self) {
        if let MethodRef::Named(method) = self {
            if !method.noted.load(Ordering::Acquire) {
                let table = CALLED.get_or_init(Default::default);
                let mut table = table.write();
                let entry = table.entry(method.id).or_insert(Some(method));
                if entry.is_some_and(|known| known.path != method.path) {
                    tracing::warn!(
                        first = entry.map_or("", |m| m.path),
                        second = method.path,
                        "two methods share an id: neither can be called by path"
                    );
                    *entry = None;
                }
                method.noted.store(true, Ordering::Release);
            }
        }
    }

    /// The id on the wire.
    pub fn id(self) -> u32 {
        match self {
            MethodRef::Named(method) => method.id,
            MethodRef::Id(id) => id,
        }
    }

    /// The path, or `/unknown/<id>` for a bare id.
    pub fn path(self) -> &'static str {
        match self {
            MethodRef::Named(method) => method.path,
            MethodRef::Id(id) => unknown_path(id),
        }
    }

    /// Its client-side metrics.
    pub(crate) fn client_metrics(self) -> &'static MethodMetrics {
        match self {
            MethodRef::Named(method) => method
                .metrics
                .get_or_init(|| MethodMetrics::of(Side::Client, method.path)),
            MethodRef::Id(id) => MethodMetrics::of(Side::Client, unknown_path(id)),
        }
    }
}

/// Which sides of a method stream, as its `.proto` declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MethodKind {
    /// One request, one response.
    #[default]
    Unary,
    /// One request, a stream of responses.
    ServerStreaming,
    /// A stream of requests, one response.
    ClientStreaming,
    /// Streams both ways.
    Streaming,
}

impl MethodKind {
    /// Whether the client opens the call as a stream (every kind but unary).
    pub fn is_streaming(self) -> bool {
        self != MethodKind::Unary
    }

    /// Whether the client sends a stream of requests.
    pub fn streams_requests(self) -> bool {
        matches!(self, MethodKind::ClientStreaming | MethodKind::Streaming)
    }

    /// Whether the server answers with a stream of responses.
    pub fn streams_responses(self) -> bool {
        matches!(self, MethodKind::ServerStreaming | MethodKind::Streaming)
    }
}

/// `/unknown/<id>`, one string per id for the life of the process.
fn unknown_path(id: u32) -> &'static str {
    static PATHS: OnceLock<Mutex<FxHashMap<u32, &'static str>>> = OnceLock::new();
    let mut paths = PATHS.get_or_init(Default::default).lock();
    paths
        .entry(id)
        .or_insert_with(|| Box::leak(format!("/unknown/{id:#010x}").into_boxed_str()))
}
