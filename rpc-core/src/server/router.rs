//! Method id → service lookup, checked for collisions when the server is built.

use rustc_hash::FxHashMap;
use std::sync::{Arc, OnceLock};

use crate::error::Error;
use crate::observe::{MethodMetrics, Side};
use crate::server::service::{MethodDescriptor, Service};

pub(crate) struct Route {
    pub(crate) service: Arc<dyn Service>,
    pub(crate) path: &'static str,
    pub(crate) method: MethodDescriptor,
    metrics: OnceLock<&'static MethodMetrics>,
}

impl Route {
    /// The method's server-side metrics, registered at its first call.
    pub(crate) fn metrics(&self) -> &'static MethodMetrics {
        self.metrics
            .get_or_init(|| MethodMetrics::of(Side::Server, self.path))
    }
}

#[derive(Default)]
pub(crate) struct Router {
    routes: FxHashMap<u32, Route>,
}

impl Router {
    pub(crate) fn add(&mut self, service: Arc<dyn Service>) -> Result<(), Error> {
        for method in service.methods() {
            if let Some(existing) = self.routes.get(&method.id) {
                return Err(Error::MethodIdCollision {
                    first: existing.path.to_owned(),
                    second: method.path.to_owned(),
                    id: method.id,
                });
            }
            self.routes.insert(
                method.id,
                Route {
                    service: service.clone(),
                    path: method.path,
                    method: *method,
                    metrics: OnceLock::new(),
                },
            );
        }
        Ok(())
    }

    pub(crate) fn get(&self, method_id: u32) -> Option<&Route> {
        self.routes.get(&method_id)
    }

    /// The method served at `path`, if any (its id leads to it, and it has that path).
    pub(crate) fn by_path(&self, path: &str) -> Option<MethodDescriptor> {
        self.get(crate::method_id(path))
            .filter(|route| route.path == path)
            .map(|route| route.method)
    }

    pub(crate) fn paths(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.routes.values().map(|r| r.path)
    }
}
