//! Which method a call invokes, as the client names it.

use std::sync::OnceLock;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use super::{MethodMetrics, Side};

/// A method as generated clients name it: its path, its id, and (once called) its client
/// metrics.
///
/// ```
/// static SAY_HELLO: rpc_core::Method = rpc_core::Method::new("/hello.Greeter/SayHello");
/// assert_eq!(SAY_HELLO.id(), rpc_core::method_id("/hello.Greeter/SayHello"));
/// ```
#[derive(Debug)]
pub struct Method {
    path: &'static str,
    id: u32,
    pub(super) metrics: OnceLock<&'static MethodMetrics>,
}

impl Method {
    /// The method at `path` (`/package.Service/Method`).
    pub const fn new(path: &'static str) -> Method {
        Method {
            path,
            id: crate::message::method_id(path),
            metrics: OnceLock::new(),
        }
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

impl MethodRef {
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

/// `/unknown/<id>`, one string per id for the life of the process.
fn unknown_path(id: u32) -> &'static str {
    static PATHS: OnceLock<Mutex<FxHashMap<u32, &'static str>>> = OnceLock::new();
    let mut paths = PATHS.get_or_init(Default::default).lock();
    paths
        .entry(id)
        .or_insert_with(|| Box::leak(format!("/unknown/{id:#010x}").into_boxed_str()))
}
