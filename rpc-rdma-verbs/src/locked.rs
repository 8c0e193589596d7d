//! [`LockedRaw`]: a raw verbs pointer reached only with its lock held.

use std::ptr::NonNull;
use std::sync::Mutex;

/// A raw pointer to a librdmacm object whose calls must not overlap. The pointer is handed
/// out only to a closure that runs with the lock held ([`LockedRaw::locked`]): no caller
/// gets the pointer without taking the lock, nor lets the lock go by accident while it
/// uses the pointer (as a `(guard, pointer)` pair allows with `let (_, raw) = …`). A closure
/// could still return the pointer; by this crate's convention none does (they return
/// values read through it), and dereferencing it elsewhere would need an `unsafe` block
/// that cannot claim the lock.
pub(crate) struct LockedRaw<T> {
    raw: NonNull<T>,
    lock: Mutex<()>,
}

impl<T> std::fmt::Debug for LockedRaw<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("LockedRaw").field(&self.raw).finish()
    }
}

impl<T> LockedRaw<T> {
    pub(crate) fn new(raw: NonNull<T>) -> Self {
        LockedRaw {
            raw,
            lock: Mutex::new(()),
        }
    }

    /// Runs `f` on the pointer with the lock held for the whole call. A panic in `f`
    /// releases the lock; the next call takes it as usual (the lock guards no Rust data).
    pub(crate) fn locked<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        let _held = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        f(self.raw.as_ptr())
    }

    /// The pointer for its owner's teardown: `&mut self` proves nobody else can call.
    pub(crate) fn get_mut(&mut self) -> *mut T {
        self.raw.as_ptr()
    }

    /// The pointer's address, as an identity (never dereferenced).
    pub(crate) fn addr(&self) -> usize {
        self.raw.as_ptr() as usize
    }

    #[cfg(test)]
    fn is_locked(&self) -> bool {
        matches!(
            self.lock.try_lock(),
            Err(std::sync::TryLockError::WouldBlock)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pointer_is_reached_only_while_the_lock_is_held() {
        let mut value = Box::new(7_u32);
        let locked = LockedRaw::new(NonNull::from(&mut *value));
        assert!(!locked.is_locked());
        let read = locked.locked(|raw| {
            assert!(locked.is_locked(), "held for the whole call");
            // SAFETY: `raw` points to the live box, and nothing else accesses it.
            unsafe { *raw }
        });
        assert_eq!(read, 7);
        assert!(!locked.is_locked(), "released when the call returns");

        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            locked.locked(|_| panic!("a call that panics"))
        }));
        assert!(panicked.is_err());
        assert!(!locked.is_locked(), "released by a panicking call");
        assert_eq!(locked.locked(|raw| raw as usize), locked.addr());
    }
}
