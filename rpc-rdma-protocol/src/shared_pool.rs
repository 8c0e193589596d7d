//! Accounting of a shared receive queue (SRQ): how many of its posted buffers are committed
//! to connections' receive windows, and how many are spare.
//!
//! With an SRQ, a frame lands in whichever buffer the queue hands out, whatever its
//! connection, so the no-RNR invariant is counted over the whole queue: **posted buffers ≥
//! credits committed to all windows**. A connection's committed credits are its posted
//! receive slots ([`crate::Connection::recv_posted`]): credits its peer holds, frames on
//! their way, credits waiting to be returned. The pool commits buffers when a connection
//! is admitted (its initial window) and when its window grows, and gets them back when a
//! slot leaves a window or a connection's QP is gone. Buffers the upper layer holds are
//! neither posted nor committed; the driver re-posts each one when it is released, before
//! the connection commits it again.
//!
//! Every bound is named in [`PoolConfig`]:
//! * `max_buffers`: the queue never holds more; admission past it is refused.
//! * `slack`: posted buffers never committed. A peer that sends beyond its credits takes
//!   buffers committed to others until its connection is closed; the slack absorbs that
//!   overrun, so honest peers see no RNR.
//! * `chunk`: buffers are registered this many at a time, as connections need them, so the
//!   memory follows the connections admitted, not the bound.
//!
//! The pool keeps `spare = posted − committed`; it changes only on admission, growth,
//! give-back and new buffers, never per message.

use super::credits::UNLENT_SLOTS;
use super::error::ParamsError;
use super::params::in_range;

/// Bounds of a [`SharedPool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Bytes per buffer: the receive slot size of every connection on this queue.
    pub buffer_size: u32,
    /// Buffers registered and posted at a time.
    pub chunk: u32,
    /// Most buffers the queue ever holds.
    pub max_buffers: u32,
    /// Posted buffers kept uncommitted against peers that overrun their windows.
    pub slack: u32,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            buffer_size: 8192,
            chunk: 256,
            max_buffers: 16 * 1024,
            slack: 64,
        }
    }
}

impl PoolConfig {
    /// Checks the bounds: a chunk holds at least the slack and one smallest window, and
    /// the queue at least a chunk.
    pub fn validate(&self) -> Result<(), ParamsError> {
        let range = |what, value, min, max| in_range(what, value, min, max).map(drop);
        range(
            "pool.buffer_size",
            self.buffer_size,
            crate::params::MIN_SLOT_SIZE,
            crate::params::MAX_SLOT_SIZE,
        )?;
        range("pool.slack", self.slack, 0, 1 << 16)?;
        range(
            "pool.chunk",
            self.chunk,
            self.slack + UNLENT_SLOTS,
            crate::params::MAX_SLOT_COUNT,
        )?;
        range("pool.max_buffers", self.max_buffers, self.chunk, 1 << 24)?;
        let bytes = u64::from(self.max_buffers) * u64::from(self.buffer_size);
        if bytes > MAX_POOL_BYTES {
            return Err(ParamsError::RingTooLarge {
                what: "shared receive pool",
                bytes,
                max: MAX_POOL_BYTES,
            });
        }
        Ok(())
    }
}

/// Largest pool (buffers × buffer size).
pub const MAX_POOL_BYTES: u64 = 16 << 30;

/// The answer to [`SharedPool::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The window is committed: accept the connection.
    Admitted,
    /// Register and post this many more buffers, call [`SharedPool::add_buffers`], then ask
    /// again.
    NeedBuffers(u32),
    /// The pool is at its bound and has too few spare buffers: refuse the connection.
    Refused {
        /// Buffers the window needs.
        window: u32,
        /// Spare buffers above the slack.
        spare: u32,
        /// The pool's bound.
        max_buffers: u32,
    },
}

/// The commitments of one shared receive queue. Plain data: the driver keeps it under its
/// own lock and does what it answers.
#[derive(Debug, Clone)]
pub struct SharedPool {
    config: PoolConfig,
    /// Buffers registered (each posted, or held by an upper layer).
    buffers: u32,
    /// Posted buffers committed to no window (the slack included).
    spare: u32,
}

impl SharedPool {
    /// An empty pool: no buffer registered yet.
    pub fn new(config: PoolConfig) -> Result<Self, ParamsError> {
        config.validate()?;
        Ok(SharedPool {
            config,
            buffers: 0,
            spare: 0,
        })
    }

    /// The bounds.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// Buffers registered.
    pub fn buffers(&self) -> u32 {
        self.buffers
    }

    /// Posted buffers committed to no window, the slack included.
    pub fn spare(&self) -> u32 {
        self.spare
    }

    fn available(&self) -> u32 {
        self.spare.saturating_sub(self.config.slack)
    }

    /// Buffers the next registration should add (a chunk, within the bound); 0 at the bound.
    fn next_chunk(&self) -> u32 {
        self.config
            .chunk
            .min(self.config.max_buffers - self.buffers)
    }

    /// Commits the initial window of a connection about to be accepted (or connected).
    pub fn admit(&mut self, window: u32) -> Admission {
        if self.available() >= window {
            self.spare -= window;
            return Admission::Admitted;
        }
        match self.next_chunk() {
            0 => Admission::Refused {
                window,
                spare: self.available(),
                max_buffers: self.config.max_buffers,
            },
            chunk => Admission::NeedBuffers(chunk),
        }
    }

    /// `n` more buffers were registered and posted.
    pub fn add_buffers(&mut self, n: u32) {
        debug_assert!(self.buffers + n <= self.config.max_buffers);
        self.buffers += n;
        self.spare += n;
    }

    /// Commits up to `wanted` buffers to a growing window, keeping the slack and, while the
    /// pool may still register more, a chunk's worth for admissions. Returns how many.
    pub fn grow(&mut self, wanted: u32) -> u32 {
        let keep = if self.next_chunk() > 0 {
            0
        } else {
            self.config.chunk / 2
        };
        let granted = wanted.min(self.available().saturating_sub(keep));
        self.spare -= granted;
        granted
    }

    /// How many buffers to register now so that windows can keep growing: a chunk once the
    /// spare falls below one, while below the bound; 0 otherwise.
    pub fn wants_buffers(&self) -> u32 {
        if self.available() < self.config.chunk {
            self.next_chunk()
        } else {
            0
        }
    }

    /// Commitments that ended: slots that left a window, a window grown less than granted,
    /// or the posted slots of a connection whose QP can receive no more.
    pub fn give_back(&mut self, n: u32) {
        debug_assert!(
            self.spare + n <= self.buffers,
            "more given back than committed"
        );
        self.spare = (self.spare + n).min(self.buffers);
    }

    /// Whether released slots above their connection's initial window should leave it
    /// ([`crate::Connection::release_shared`]): the pool is at its bound and has less than
    /// half a chunk to spare.
    pub fn shrinking(&self) -> bool {
        self.next_chunk() == 0 && self.available() < self.config.chunk / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(chunk: u32, max_buffers: u32, slack: u32) -> SharedPool {
        SharedPool::new(PoolConfig {
            buffer_size: 256,
            chunk,
            max_buffers,
            slack,
        })
        .unwrap()
    }

    #[test]
    fn admission_registers_by_chunks_up_to_the_bound_then_refuses() {
        let mut p = pool(16, 32, 4);
        assert_eq!(p.admit(8), Admission::NeedBuffers(16));
        p.add_buffers(16);
        assert_eq!(p.admit(8), Admission::Admitted);
        assert_eq!(p.spare(), 8);
        assert_eq!(p.admit(8), Admission::NeedBuffers(16));
        p.add_buffers(16);
        assert_eq!(p.admit(8), Admission::Admitted);
        assert_eq!(p.admit(8), Admission::Admitted);
        assert_eq!(p.spare(), 8);
        assert_eq!(
            p.admit(8),
            Admission::Refused {
                window: 8,
                spare: 4,
                max_buffers: 32
            }
        );
        p.give_back(8);
        assert_eq!(p.admit(8), Admission::Admitted);
    }

    #[test]
    fn growth_keeps_the_slack_and_at_the_bound_half_a_chunk() {
        let mut p = pool(16, 32, 4);
        p.add_buffers(16);
        assert_eq!(
            p.grow(100),
            12,
            "everything above the slack while more can come"
        );
        assert_eq!(p.wants_buffers(), 16);
        p.add_buffers(16);
        assert_eq!(p.wants_buffers(), 0, "at the bound");
        assert!(!p.shrinking());
        assert_eq!(p.grow(100), 8, "at the bound, half a chunk is kept");
        assert_eq!(p.spare(), 12);
        assert!(!p.shrinking());
        assert_eq!(p.grow(1), 0, "half a chunk stays for admissions");
        assert_eq!(p.admit(8), Admission::Admitted);
        assert!(p.shrinking());
        p.give_back(8);
        assert!(!p.shrinking());
    }

    #[test]
    fn bounds_are_validated() {
        let bad = |c: PoolConfig| SharedPool::new(c).unwrap_err();
        let ok = PoolConfig::default();
        assert!(SharedPool::new(ok).is_ok());
        for c in [
            PoolConfig { chunk: 10, ..ok },
            PoolConfig {
                max_buffers: 100,
                ..ok
            },
            PoolConfig {
                buffer_size: 1,
                ..ok
            },
        ] {
            assert!(matches!(bad(c), ParamsError::PolicyOutOfRange { .. }));
        }
        assert!(matches!(
            bad(PoolConfig {
                buffer_size: 16 << 20,
                max_buffers: 1 << 12,
                ..ok
            }),
            ParamsError::RingTooLarge { .. }
        ));
    }
}
