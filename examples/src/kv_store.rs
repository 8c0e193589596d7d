//! The key-value store behind the example microservice: values in memory, every bound
//! named ([`KvLimits`]).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::RwLock;
use rdma_rpc::{Request, Response, Status};

use crate::kv::store_server::Store;
use crate::kv::{DeleteReply, DeleteRequest, GetReply, GetRequest, PutReply, PutRequest};

/// What the store holds at most.
#[derive(Debug, Clone)]
pub struct KvLimits {
    /// Keys stored; a `Put` of a new key beyond it fails `RESOURCE_EXHAUSTED`.
    pub max_keys: usize,
    /// Bytes of one key; longer ones fail `INVALID_ARGUMENT`.
    pub max_key_len: usize,
    /// Bytes of one value; larger ones fail `INVALID_ARGUMENT` (the server's message size
    /// limit refuses even larger requests before they reach the store).
    pub max_value_len: usize,
}

impl Default for KvLimits {
    fn default() -> Self {
        KvLimits {
            max_keys: 100_000,
            max_key_len: 256,
            max_value_len: 1 << 20,
        }
    }
}

/// The store: cheap to clone, every clone the same map.
#[derive(Debug, Clone, Default)]
pub struct KvStore {
    values: Arc<RwLock<HashMap<String, Bytes>>>,
    limits: KvLimits,
}

impl KvStore {
    /// An empty store holding at most `limits`.
    pub fn new(limits: KvLimits) -> Self {
        KvStore {
            values: Arc::default(),
            limits,
        }
    }

    /// Keys stored.
    pub fn len(&self) -> usize {
        self.values.read().len()
    }

    /// Whether no key is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn check_key(&self, key: &str) -> Result<(), Status> {
        if key.is_empty() {
            return Err(Status::invalid_argument("the key is empty"));
        }
        if key.len() > self.limits.max_key_len {
            return Err(Status::invalid_argument(format!(
                "the key is {} bytes, more than the {} allowed",
                key.len(),
                self.limits.max_key_len
            )));
        }
        Ok(())
    }
}

impl Store for KvStore {
    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetReply>, Status> {
        let key = request.into_inner().key;
        self.check_key(&key)?;
        match self.values.read().get(&key) {
            Some(value) => Ok(Response::new(GetReply {
                value: value.clone(),
            })),
            None => Err(Status::not_found(format!("no key {key:?}"))),
        }
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutReply>, Status> {
        let PutRequest { key, value } = request.into_inner();
        self.check_key(&key)?;
        if value.len() > self.limits.max_value_len {
            return Err(Status::invalid_argument(format!(
                "the value is {} bytes, more than the {} allowed",
                value.len(),
                self.limits.max_value_len
            )));
        }
        let mut values = self.values.write();
        if !values.contains_key(&key) && values.len() >= self.limits.max_keys {
            return Err(Status::resource_exhausted(format!(
                "the store holds {} keys, its limit",
                self.limits.max_keys
            )));
        }
        let replaced = values.insert(key, value).is_some();
        Ok(Response::new(PutReply { replaced }))
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteReply>, Status> {
        let key = request.into_inner().key;
        self.check_key(&key)?;
        match self.values.write().remove(&key) {
            Some(_) => Ok(Response::new(DeleteReply {})),
            None => Err(Status::not_found(format!("no key {key:?}"))),
        }
    }
}
