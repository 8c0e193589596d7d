//! W3C trace context (`traceparent`) carried in call metadata, so a trace crosses calls.
//!
//! A server reads the caller's `traceparent`; its handler runs with that context
//! ([`TraceContext::current`]), and calls the handler makes carry it on (same trace, the
//! handler's span as their parent). A call made outside any traced handler starts a trace
//! when its span is recorded by a `tracing` subscriber; otherwise no header is added. A
//! `traceparent` already in the request's metadata (set by the application or an
//! interceptor, from OpenTelemetry say) is left as it is.

use std::fmt;

use crate::MetadataMap;

/// The metadata key.
pub const TRACEPARENT: &str = "traceparent";

/// A W3C trace context: which trace a call belongs to and which span is its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    trace_id: u128,
    span_id: u64,
    flags: u8,
}

tokio::task_local! {
    static CURRENT: Option<TraceContext>;
}

impl TraceContext {
    /// A new trace (random ids), sampled.
    pub fn new_root() -> TraceContext {
        TraceContext {
            trace_id: nonzero(|| fastrand::u128(..)),
            span_id: nonzero(|| fastrand::u64(..)),
            flags: 1,
        }
    }

    /// A new span in this trace, this context's span its parent.
    #[must_use]
    pub fn child(&self) -> TraceContext {
        TraceContext {
            span_id: nonzero(|| fastrand::u64(..)),
            ..*self
        }
    }

    /// The trace context of the handler running on this task, if its caller sent one.
    pub fn current() -> Option<TraceContext> {
        CURRENT.try_with(|c| *c).ok().flatten()
    }

    /// Runs `f` with `context` as [`TraceContext::current`]. Untraced, outside any traced
    /// handler (the usual case), it is one lookup, not a scope entered and left.
    pub(crate) fn scope_sync<R>(context: Option<TraceContext>, f: impl FnOnce() -> R) -> R {
        if context.is_none() && TraceContext::current().is_none() {
            return f();
        }
        CURRENT.sync_scope(context, f)
    }

    /// `future` with `context` as [`TraceContext::current`] while it runs.
    pub(crate) fn scope<F: std::future::Future>(
        context: Option<TraceContext>,
        future: F,
    ) -> impl std::future::Future<Output = F::Output> {
        CURRENT.scope(context, future)
    }

    /// The 128-bit trace id.
    pub fn trace_id(&self) -> u128 {
        self.trace_id
    }

    /// The 64-bit id of the parent span.
    pub fn span_id(&self) -> u64 {
        self.span_id
    }

    /// Whether the caller records this trace (flag `01`).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// Parses a `traceparent` value (version `00`, or a later one read as `00` as the
    /// spec says); `None` for anything malformed, or all-zero ids.
    pub fn parse(value: &[u8]) -> Option<TraceContext> {
        let value = std::str::from_utf8(value).ok()?;
        let mut parts = value.split('-');
        let version = parts.next().filter(|v| v.len() == 2)?;
        let version = u8::from_str_radix(version, 16).ok()?;
        let trace_id = parts.next().filter(|t| t.len() == 32)?;
        let span_id = parts.next().filter(|s| s.len() == 16)?;
        let flags = parts.next().filter(|f| f.len() == 2)?;
        // Version 00 has exactly four parts; later versions may add more; ff is invalid.
        if version == 0xff || (version == 0 && parts.next().is_some()) {
            return None;
        }
        let hex = |s: &str| {
            s.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        };
        if !(hex(trace_id) && hex(span_id) && hex(flags)) {
            return None;
        }
        let context = TraceContext {
            trace_id: u128::from_str_radix(trace_id, 16).ok()?,
            span_id: u64::from_str_radix(span_id, 16).ok()?,
            flags: u8::from_str_radix(flags, 16).ok()?,
        };
        (context.trace_id != 0 && context.span_id != 0).then_some(context)
    }

    /// The context a request carries, if it carries a valid one.
    pub fn from_metadata(metadata: &MetadataMap) -> Option<TraceContext> {
        metadata.get(TRACEPARENT).and_then(TraceContext::parse)
    }
}

/// The `traceparent` header value.
impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id, self.span_id, self.flags
        )
    }
}

fn nonzero<T: PartialEq + Default>(mut draw: impl FnMut() -> T) -> T {
    loop {
        let value = draw();
        if value != T::default() {
            return value;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TraceContext;

    #[test]
    fn the_spec_example_round_trips() {
        let header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = TraceContext::parse(header.as_bytes()).unwrap();
        assert_eq!(context.trace_id(), 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(context.span_id(), 0x00f067aa0ba902b7);
        assert!(context.sampled());
        assert_eq!(context.to_string(), header);
        let child = context.child();
        assert_eq!(child.trace_id(), context.trace_id());
        assert_ne!(child.span_id(), context.span_id());
    }

    #[test]
    fn malformed_values_are_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::parse(bad.as_bytes()), None, "{bad:?}");
        }
        // A later version is read as 00, extra fields ignored.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-more";
        assert!(!TraceContext::parse(later.as_bytes()).unwrap().sampled());
    }
}
