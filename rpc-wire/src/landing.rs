//! [`Landing`]: memory a large message may be written into where it lies.

use std::any::Any;
use std::sync::{Arc, Mutex, PoisonError};

/// Memory the application offers for large messages, so that their bytes land in it and
/// the decoded message's `bytes` fields are views of it: over `rdma://` a registered
/// buffer (`rdma_rpc::RegisteredBuffer`), which the peer writes by RDMA WRITE. A client
/// offers one for a call's response (`Request::receive_into`), a server some for large
/// request bodies (`ServerBuilder::land_requests_in`). Transports that cannot place a
/// message (`tcp://`, `grpc://`) leave it alone and the call works as without it.
///
/// A landing holds its memory until a message takes it: the transport takes it out while
/// the peer may write it (so that no other message or handle reaches it meanwhile) and
/// puts it back once the message arrived, or the offer ended without it. A landing several
/// messages want at once serves one of them; the others go as without it. Take the memory
/// back with [`Landing::take`] to reuse it.
#[derive(Clone, Default)]
pub struct Landing(Arc<Mutex<Option<Box<dyn Any + Send>>>>);

impl std::fmt::Debug for Landing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Landing")
            .field("holds", &!self.is_empty())
            .finish()
    }
}

impl Landing {
    /// A landing holding `memory`.
    pub fn new<T: Any + Send>(memory: T) -> Landing {
        Landing(Arc::new(Mutex::new(Some(Box::new(memory)))))
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Box<dyn Any + Send>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the memory out if it is a `T`; `None` if the landing is empty (a call holds
    /// it) or holds something else, which stays.
    pub fn take<T: Any + Send>(&self) -> Option<T> {
        let mut slot = self.slot();
        match slot.take()?.downcast::<T>() {
            Ok(memory) => Some(*memory),
            Err(other) => {
                *slot = Some(other);
                None
            }
        }
    }

    /// Takes the memory out if it is a `T` that `accept` accepts (looked at under the
    /// landing's lock, so that nobody sees the landing empty meanwhile); `None` otherwise,
    /// and the landing keeps what it holds.
    pub fn take_if<T: Any + Send>(&self, accept: impl FnOnce(&T) -> bool) -> Option<T> {
        let mut slot = self.slot();
        let accepted = slot
            .as_ref()
            .and_then(|memory| memory.downcast_ref::<T>())
            .is_some_and(accept);
        if !accepted {
            return None;
        }
        slot.take()?.downcast::<T>().ok().map(|memory| *memory)
    }

    /// Puts memory (back) in, if the landing is empty; `Err` gives it back if the landing
    /// holds something already.
    pub fn put<T: Any + Send>(&self, memory: T) -> Result<(), T> {
        let mut slot = self.slot();
        if slot.is_some() {
            return Err(memory);
        }
        *slot = Some(Box::new(memory));
        Ok(())
    }

    /// Whether it holds nothing now.
    pub fn is_empty(&self) -> bool {
        self.slot().is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_taken_once_as_its_own_type_and_put_back() {
        let landing = Landing::new(vec![1u8, 2, 3]);
        assert!(landing.take::<String>().is_none(), "another type stays");
        let shared = landing.clone();
        let memory = shared.take::<Vec<u8>>().expect("the memory");
        assert!(landing.is_empty() && landing.take::<Vec<u8>>().is_none());
        landing.put(memory).expect("empty");
        assert_eq!(
            landing.put(vec![9u8]),
            Err(vec![9]),
            "a full landing keeps what it holds"
        );
        assert_eq!(shared.take_if::<Vec<u8>>(|v| v.len() > 3), None);
        assert!(!landing.is_empty(), "a refused look leaves the memory in");
        assert_eq!(shared.take::<Vec<u8>>(), Some(vec![1, 2, 3]));
    }
}
