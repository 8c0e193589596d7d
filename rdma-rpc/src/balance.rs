//! Channels over several servers, balanced by tower's power-of-two-choices
//! ([`rpc_core::client::balance`]), from URLs.

use std::convert::Infallible;
use std::hash::Hash;
use std::sync::Arc;

use futures::channel::mpsc;
use parking_lot::Mutex;
use rpc_core::tower::discover::Change;
use rpc_core::{Channel, Status};

use crate::{ClientBuilder, Error};

/// Where discovery sends its changes to the balancer.
type ChangeSender<K> = mpsc::Sender<Result<Change<K, Channel>, Infallible>>;

/// The discovery side of [`ClientBuilder::balance_channel`]: adds and removes the servers a
/// balanced channel calls, while it runs. Cheap to clone.
#[derive(Clone)]
pub struct Discovery<K> {
    changes: Arc<Mutex<ChangeSender<K>>>,
    settings: ClientBuilder,
}

impl<K> std::fmt::Debug for Discovery<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery").finish_non_exhaustive()
    }
}

impl<K: Hash + Eq + Clone + Send + 'static> Discovery<K> {
    /// Adds the server at `url` under `key` (replacing one under the same key). It connects
    /// in the background and takes calls once connected.
    ///
    /// # Errors
    ///
    /// A bad URL; [`Error::Connect`] with `RESOURCE_EXHAUSTED` when the balancer has not yet
    /// taken the changes sent before (at most the `capacity` given to
    /// [`ClientBuilder::balance_channel`]); `UNAVAILABLE` once the channel is dropped.
    pub fn insert(&self, key: K, url: &str) -> Result<(), Error> {
        let endpoint = self.settings.clone().connect_lazy(url)?;
        self.send(Change::Insert(key, endpoint))
    }

    /// Removes the server under `key`: it takes no new calls, and its connection closes
    /// once the calls in flight on it are done. Errors as [`Discovery::insert`].
    pub fn remove(&self, key: K) -> Result<(), Error> {
        self.send(Change::Remove(key))
    }

    /// Whether the balanced channel is gone (nothing takes the changes any more).
    pub(crate) fn is_closed(&self) -> bool {
        self.changes.lock().is_closed()
    }

    fn send(&self, change: Change<K, Channel>) -> Result<(), Error> {
        self.changes.lock().try_send(Ok(change)).map_err(|e| {
            Error::Connect(if e.is_full() {
                Status::resource_exhausted("the balancer has not taken the earlier changes yet")
            } else {
                Status::unavailable("the balanced channel is closed")
            })
        })
    }
}

impl ClientBuilder {
    /// A channel that balances calls over the servers at `urls` (each connects in the
    /// background and heals as [`ClientBuilder::connect_lazy`] says; calls go to connected
    /// ones, the less loaded of two drawn at random). See
    /// [`rpc_core::client::balance`] for what calls do while none is connected.
    ///
    /// # Errors
    ///
    /// A bad URL, or no thread for the balancer.
    pub fn balance_list<U: AsRef<str>>(
        self,
        urls: impl IntoIterator<Item = U>,
    ) -> Result<Channel, Error> {
        let endpoints = urls
            .into_iter()
            .enumerate()
            .map(|(i, url)| {
                let endpoint = self.clone().connect_lazy(url.as_ref())?;
                Ok(Ok::<_, Infallible>(Change::Insert(i, endpoint)))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(Channel::balance(
            futures::stream::iter(endpoints),
            &self.reconnect,
            self.channel,
        )?)
    }

    /// A balanced channel whose servers are added and removed at run time through the
    /// returned [`Discovery`]; at most `capacity` changes (at least one) wait for the balancer to take
    /// them. It starts with no server: calls wait for one (within their deadline).
    ///
    /// # Errors
    ///
    /// No thread for the balancer.
    pub fn balance_channel<K: Hash + Eq + Clone + Send + 'static>(
        self,
        capacity: usize,
    ) -> Result<(Channel, Discovery<K>), Error> {
        // The sender's own slot is the last of the `capacity`.
        let (tx, rx) = mpsc::channel(capacity.saturating_sub(1));
        let channel = Channel::balance(rx, &self.reconnect, self.channel.clone())?;
        let discovery = Discovery {
            changes: Arc::new(Mutex::new(tx)),
            settings: self,
        };
        Ok((channel, discovery))
    }
}
