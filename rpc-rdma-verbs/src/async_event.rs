//! Asynchronous events of a device context (`ibv_get_async_event`): what the device says
//! about a queue pair, CQ, SRQ or port outside of any work completion, such as a queue pair
//! that went to the error state because a peer's RDMA access broke the rules.
//!
//! A QP on a shared receive queue has no receives of its own to flush, so once it is in
//! error no completion may ever name it again; the `QP_FATAL`, `QP_ACCESS_ERR` and
//! `QP_LAST_WQE_REACHED` events are the only word of it.

use std::fmt;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::ptr;

use crate::sys::{ibv_ack_async_event, ibv_async_event, ibv_get_async_event};

use super::comp_channel::set_nonblocking;
use super::context::Context;
use super::error::{check, Result};

/// Declares [`AsyncEventKind`] from `enum ibv_event_type`: each variant with its value and
/// C name.
macro_rules! event_kinds {
    ($($variant:ident = $raw:literal => $name:literal,)*) => {
        /// What an asynchronous event reports (`enum ibv_event_type`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum AsyncEventKind {
            $(#[doc = $name] $variant,)*
            /// A kind newer than this crate.
            Unknown(u32),
        }

        impl AsyncEventKind {
            fn from_raw(raw: u32) -> AsyncEventKind {
                match raw {
                    $($raw => AsyncEventKind::$variant,)*
                    other => AsyncEventKind::Unknown(other),
                }
            }

            /// The C name (`IBV_EVENT_...`), for a known kind.
            pub fn name(self) -> Option<&'static str> {
                match self {
                    $(AsyncEventKind::$variant => Some($name),)*
                    AsyncEventKind::Unknown(_) => None,
                }
            }
        }
    };
}

event_kinds! {
    CqErr = 0 => "IBV_EVENT_CQ_ERR",
    QpFatal = 1 => "IBV_EVENT_QP_FATAL",
    QpReqErr = 2 => "IBV_EVENT_QP_REQ_ERR",
    QpAccessErr = 3 => "IBV_EVENT_QP_ACCESS_ERR",
    CommEst = 4 => "IBV_EVENT_COMM_EST",
    SqDrained = 5 => "IBV_EVENT_SQ_DRAINED",
    PathMig = 6 => "IBV_EVENT_PATH_MIG",
    PathMigErr = 7 => "IBV_EVENT_PATH_MIG_ERR",
    DeviceFatal = 8 => "IBV_EVENT_DEVICE_FATAL",
    PortActive = 9 => "IBV_EVENT_PORT_ACTIVE",
    PortErr = 10 => "IBV_EVENT_PORT_ERR",
    LidChange = 11 => "IBV_EVENT_LID_CHANGE",
    PkeyChange = 12 => "IBV_EVENT_PKEY_CHANGE",
    SmChange = 13 => "IBV_EVENT_SM_CHANGE",
    SrqErr = 14 => "IBV_EVENT_SRQ_ERR",
    SrqLimitReached = 15 => "IBV_EVENT_SRQ_LIMIT_REACHED",
    QpLastWqeReached = 16 => "IBV_EVENT_QP_LAST_WQE_REACHED",
    ClientReregister = 17 => "IBV_EVENT_CLIENT_REREGISTER",
    GidChange = 18 => "IBV_EVENT_GID_CHANGE",
    WqFatal = 19 => "IBV_EVENT_WQ_FATAL",
}

impl AsyncEventKind {
    /// The queue pair it names went to the error state: no work request of it will
    /// complete normally again.
    pub fn is_qp_error(self) -> bool {
        matches!(
            self,
            AsyncEventKind::QpFatal
                | AsyncEventKind::QpReqErr
                | AsyncEventKind::QpAccessErr
                | AsyncEventKind::PathMigErr
                | AsyncEventKind::QpLastWqeReached
        )
    }

    /// What the element of an event of this kind is.
    fn element(self) -> Element {
        use AsyncEventKind::*;
        match self {
            CqErr => Element::Cq,
            QpFatal | QpReqErr | QpAccessErr | CommEst | SqDrained | PathMig | PathMigErr
            | QpLastWqeReached => Element::Qp,
            SrqErr | SrqLimitReached => Element::Srq,
            PortActive | PortErr | LidChange | PkeyChange | SmChange | ClientReregister
            | GidChange => Element::Port,
            DeviceFatal | WqFatal | Unknown(_) => Element::None,
        }
    }
}

impl fmt::Display for AsyncEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self, self.name()) {
            (_, Some(name)) => f.write_str(name),
            (AsyncEventKind::Unknown(raw), None) => write!(f, "async event {raw}"),
            (_, None) => f.write_str("async event"),
        }
    }
}

enum Element {
    Qp,
    Cq,
    Srq,
    Port,
    None,
}

/// Which object an event is about. CQs and SRQs are named by the address of their verbs
/// object, to compare with [`super::CompletionQueue::id`] and
/// [`super::SharedReceiveQueue::id`] (valid while that object lives).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventSubject {
    /// A queue pair, by number.
    Qp(u32),
    Cq(usize),
    Srq(usize),
    Port(u8),
    /// The device as a whole (or an object this crate does not wrap).
    Device,
}

/// One asynchronous event, copied out and acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    pub kind: AsyncEventKind,
    pub subject: EventSubject,
}

impl fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.subject {
            EventSubject::Qp(qp_num) => write!(f, "{} on queue pair {qp_num}", self.kind),
            EventSubject::Port(port) => write!(f, "{} on port {port}", self.kind),
            _ => write!(f, "{}", self.kind),
        }
    }
}

impl Context {
    /// The file descriptor that is readable when an asynchronous event is pending.
    pub fn async_fd(&self) -> RawFd {
        // SAFETY: the context is open; `async_fd` is immutable.
        unsafe { (*self.as_ptr()).async_fd }
    }

    /// Makes [`Context::get_async_event`] return `EAGAIN` instead of blocking. The fd
    /// belongs to the context, which librdmacm shares with every `cm_id` on the device: the
    /// whole process sees the change.
    pub fn set_async_nonblocking(&self, nonblocking: bool) -> Result<()> {
        set_nonblocking(self.async_fd(), nonblocking)
    }

    /// Waits for the next asynchronous event (or fails with `EAGAIN` once
    /// [`Context::set_async_nonblocking`]); it is acknowledged before returning, so
    /// destroying the object it names never waits for us.
    pub fn get_async_event(&self) -> Result<AsyncEvent> {
        let mut raw = MaybeUninit::<ibv_async_event>::uninit();
        // SAFETY: the context is open and `raw` is a valid out-pointer.
        check("ibv_get_async_event", unsafe {
            ibv_get_async_event(self.as_ptr(), raw.as_mut_ptr())
        })?;
        let event = raw.as_mut_ptr();
        // SAFETY: the call filled the event. The type is read as a plain `u32` (a value this
        // crate does not know would be undefined behaviour as the bound Rust enum).
        let kind = AsyncEventKind::from_raw(unsafe {
            ptr::addr_of!((*event).event_type).cast::<u32>().read()
        });
        // SAFETY: the element union holds the member `kind` says; the object it points to
        // lives until the event is acknowledged (destroying it waits for that), and the
        // acknowledgement comes below, after the copy.
        let subject = unsafe {
            let element = ptr::addr_of!((*event).element);
            match kind.element() {
                Element::Qp => EventSubject::Qp((*(*element).qp).qp_num),
                Element::Cq => EventSubject::Cq((*element).cq as usize),
                Element::Srq => EventSubject::Srq((*element).srq as usize),
                Element::Port => EventSubject::Port(u8::try_from((*element).port_num).unwrap_or(0)),
                Element::None => EventSubject::Device,
            }
        };
        // SAFETY: the event came from `ibv_get_async_event` and is acknowledged once.
        unsafe { ibv_ack_async_event(event) };
        Ok(AsyncEvent { kind, subject })
    }

    /// Like [`Context::get_async_event`] on a non-blocking fd: `None` when none is pending.
    pub fn try_get_async_event(&self) -> Result<Option<AsyncEvent>> {
        match self.get_async_event() {
            Ok(event) => Ok(Some(event)),
            Err(e) if e.is_would_block() => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_the_c_enum_and_unknown_ones_survive() {
        assert_eq!(AsyncEventKind::from_raw(0), AsyncEventKind::CqErr);
        assert_eq!(AsyncEventKind::from_raw(3), AsyncEventKind::QpAccessErr);
        assert_eq!(
            AsyncEventKind::from_raw(16),
            AsyncEventKind::QpLastWqeReached
        );
        assert_eq!(AsyncEventKind::from_raw(19), AsyncEventKind::WqFatal);
        assert_eq!(AsyncEventKind::from_raw(20), AsyncEventKind::Unknown(20));
        assert_eq!(
            AsyncEventKind::from_raw(crate::sys::ibv_event_type::IBV_EVENT_GID_CHANGE as u32),
            AsyncEventKind::GidChange
        );
        assert!(AsyncEventKind::QpAccessErr.is_qp_error());
        assert!(!AsyncEventKind::CommEst.is_qp_error());
        assert_eq!(
            AsyncEventKind::QpLastWqeReached.to_string(),
            "IBV_EVENT_QP_LAST_WQE_REACHED"
        );
    }
}
