//! A shared receive queue (SRQ) with its registered buffers and the pool's books: what the
//! connections of one engine with one slot size receive into (see docs/PROTOCOL.md,
//! "Shared receive queue").
//!
//! Buffers are registered a chunk at a time, as the pool asks, and never deregistered while
//! the queue lives: chunk `c` holds buffers `c × chunk ..`, so finding a buffer's memory
//! takes no lock. The pool ([`SharedPool`]) sits under a leaf lock: nothing is called while
//! it is held but registration and posts to the SRQ, which never wait.
//!
//! The `wr_id` of an SRQ receive carries the queue's own tag and the buffer's index; the
//! connection a completion belongs to is found by its `qp_num`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use rpc_core::Status;

use crate::config::SharedRecvConfig;
use crate::protocol::{Admission, PoolConfig, SharedPool, WorkId};
use crate::resources::verbs_status;
use crate::verbs::{
    AccessFlags, MemoryRegion, ProtectionDomain, RecvRequest, Sge, SharedReceiveQueue, VerbsError,
    WorkCompletion,
};

/// Field order is teardown order: the SRQ is destroyed before its buffers are deregistered.
pub(crate) struct SharedRecv {
    srq: Arc<SharedReceiveQueue>,
    chunks: Box<[OnceLock<MemoryRegion>]>,
    pool: Mutex<SharedPool>,
    /// The pool is short of buffers: released slots above their initial window leave it.
    /// Kept outside the lock, which every release would take otherwise.
    shrinking: AtomicBool,
    /// The tag in the `wr_id` of this queue's receives.
    tag: u32,
    buffer_size: u32,
    chunk: u32,
    /// The bounds it was made with: connections with other bounds get a queue of their own.
    bounds: SharedRecvConfig,
}

impl std::fmt::Debug for SharedRecv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pool = self.pool.lock();
        f.debug_struct("SharedRecv")
            .field("buffer_size", &self.buffer_size)
            .field("buffers", &pool.buffers())
            .field("spare", &pool.spare())
            .finish()
    }
}

impl SharedRecv {
    /// An SRQ on `pd` for buffers of `buffer_size` bytes, bounded by `config` and by the
    /// device's `max_srq_wr`. No buffer is registered before the first admission.
    pub(crate) fn new(
        pd: &Arc<ProtectionDomain>,
        buffer_size: u32,
        config: &SharedRecvConfig,
        max_srq_wr: u32,
        tag: u32,
    ) -> Result<SharedRecv, Status> {
        let max_buffers = config.max_buffers.min(max_srq_wr);
        let pool = SharedPool::new(PoolConfig {
            buffer_size,
            chunk: config.chunk.min(max_buffers),
            max_buffers,
            slack: config.slack,
        })
        .map_err(|e| Status::invalid_argument(format!("shared receive queue: {e}")))?;
        let chunk = pool.config().chunk;
        let srq = SharedReceiveQueue::new(pd, max_buffers, 1)
            .map_err(|e| verbs_status("ibv_create_srq", e))?;
        let chunks = (0..max_buffers.div_ceil(chunk))
            .map(|_| OnceLock::new())
            .collect();
        Ok(SharedRecv {
            srq,
            chunks,
            pool: Mutex::new(pool),
            shrinking: AtomicBool::new(false),
            tag,
            buffer_size,
            chunk,
            bounds: *config,
        })
    }

    pub(crate) fn srq(&self) -> &Arc<SharedReceiveQueue> {
        &self.srq
    }

    /// Whether connections with slots of `buffer_size` bytes and these bounds use this queue.
    pub(crate) fn serves(&self, buffer_size: u32, bounds: &SharedRecvConfig) -> bool {
        self.buffer_size == buffer_size && self.bounds == *bounds
    }

    /// The buffer a completion of this queue's receive names.
    pub(crate) fn buffer_of(&self, wc: &WorkCompletion) -> Option<u32> {
        match WorkId::from_wr_id(wc.wr_id()) {
            Some((tag, WorkId::Recv(buf))) if tag == self.tag && buf < self.posted_bound() => {
                Some(buf)
            }
            _ => None,
        }
    }

    fn posted_bound(&self) -> u32 {
        self.chunks.len() as u32 * self.chunk
    }

    /// Receives that landed for queue pairs that are gone: their buffers go back on the
    /// queue (the connections gave their commitments back when their QPs were destroyed).
    pub(crate) fn reclaim(&self, completions: &[WorkCompletion]) {
        for buf in completions.iter().filter_map(|wc| self.buffer_of(wc)) {
            self.repost(buf);
        }
    }

    /// Commits the initial window of a connection about to connect or be accepted,
    /// registering buffers while the pool asks for them. At the pool's bound the connection
    /// is refused with `RESOURCE_EXHAUSTED` naming the numbers.
    pub(crate) fn admit(&self, window: u32) -> Result<(), Status> {
        let mut pool = self.pool.lock();
        loop {
            match pool.admit(window) {
                Admission::Admitted => break,
                Admission::NeedBuffers(n) => self.register(&mut pool, n)?,
                Admission::Refused {
                    window,
                    spare,
                    max_buffers,
                } => {
                    return Err(Status::resource_exhausted(format!(
                        "the shared receive queue is full: a window of {window} receives, \
                         {spare} spare of its bound of {max_buffers} buffers"
                    )))
                }
            }
        }
        self.update(&pool);
        Ok(())
    }

    /// Commits up to `wanted` buffers to a growing window; returns how many. Registers a
    /// chunk if the pool runs low.
    pub(crate) fn grow(&self, wanted: u32) -> u32 {
        let mut pool = self.pool.lock();
        let granted = pool.grow(wanted);
        let more = pool.wants_buffers();
        if more > 0 {
            if let Err(status) = self.register(&mut pool, more) {
                tracing::warn!(%status, "growing the shared receive queue");
            }
        }
        self.update(&pool);
        granted
    }

    /// Commitments that ended (see [`SharedPool::give_back`]).
    pub(crate) fn give_back(&self, n: u32) {
        if n == 0 {
            return;
        }
        let mut pool = self.pool.lock();
        pool.give_back(n);
        self.update(&pool);
    }

    /// Whether released slots above their initial window should leave it.
    pub(crate) fn shrinking(&self) -> bool {
        self.shrinking.load(Ordering::Relaxed)
    }

    fn update(&self, pool: &SharedPool) {
        self.shrinking.store(pool.shrinking(), Ordering::Relaxed);
    }

    /// Registers and posts `n` more buffers (one chunk).
    fn register(&self, pool: &mut SharedPool, n: u32) -> Result<(), Status> {
        let first = pool.buffers();
        let index = (first / self.chunk) as usize;
        let len = n as usize * self.buffer_size as usize;
        let mr = MemoryRegion::alloc(self.srq.pd(), len, AccessFlags::LOCAL_WRITE)
            .map_err(|e| verbs_status("registering shared receive buffers", e))?;
        if self.chunks[index].set(mr).is_err() {
            return Err(Status::internal("shared receive chunk registered twice"));
        }
        let bufs: Vec<u32> = (first..first + n).collect();
        self.post(&bufs)
            .map_err(|e| verbs_status("posting shared receive buffers", e))?;
        pool.add_buffers(n);
        Ok(())
    }

    /// Puts a buffer back on the queue: its frame was consumed, refused, or released by the
    /// upper layer.
    pub(crate) fn repost(&self, buf: u32) {
        // One buffer per message: no allocation on this path.
        let sge = [self.sge(buf)];
        let request = [self.request(buf, &sge)];
        // SAFETY: as in `post`.
        if let Err(e) = unsafe { self.srq.post_recv_list(&request) } {
            // Only a queue in error (the device is gone) refuses a post.
            tracing::warn!(buf, %e, "re-posting a shared receive buffer");
        }
    }

    fn post(&self, bufs: &[u32]) -> Result<(), VerbsError> {
        let sges: Vec<[Sge; 1]> = bufs.iter().map(|&buf| [self.sge(buf)]).collect();
        let requests: Vec<RecvRequest<'_>> = bufs
            .iter()
            .zip(&sges)
            .map(|(&buf, sge)| self.request(buf, sge))
            .collect();
        // SAFETY: each SGE names a whole buffer of a registered chunk, which lives as long as
        // the SRQ (a field of this struct, after the SRQ). The buffer is not read by anyone:
        // it was just registered, or its frame was consumed, or the upper layer released it.
        unsafe { self.srq.post_recv_list(&requests) }
    }

    fn request<'a>(&self, buf: u32, sge: &'a [Sge; 1]) -> RecvRequest<'a> {
        RecvRequest {
            wr_id: WorkId::Recv(buf).to_wr_id(self.tag),
            sges: sge,
        }
    }

    fn chunk_of(&self, buf: u32) -> (&MemoryRegion, usize) {
        let mr = self.chunks[(buf / self.chunk) as usize]
            .get()
            .expect("a buffer of a registered chunk");
        (mr, (buf % self.chunk) as usize * self.buffer_size as usize)
    }

    fn sge(&self, buf: u32) -> Sge {
        let (mr, offset) = self.chunk_of(buf);
        Sge::new(mr.addr() + offset as u64, self.buffer_size, mr.lkey())
    }

    /// The bytes of buffer `buf`.
    ///
    /// # Safety
    /// The buffer must not be posted: its receive completed and it was not re-posted since.
    pub(crate) unsafe fn buffer(&self, buf: u32) -> &[u8] {
        let (mr, offset) = self.chunk_of(buf);
        let size = self.buffer_size as usize;
        assert!(offset + size <= mr.len(), "shared buffer out of range");
        // SAFETY: in bounds (checked above) of the registered, live chunk; the caller
        // guarantees the device does not write this buffer while the slice lives.
        unsafe { std::slice::from_raw_parts((mr.addr() as usize + offset) as *const u8, size) }
    }
}
