//! The benchmark's clock: the CPU's time-stamp counter where there is one, as perftest's
//! `get_cycles()`, calibrated once against the OS clock.
//!
//! Why not the OS clock: every sample brackets one call with two reads, and the interval
//! between them carries the cost of (about) one read. Where the kernel's clocksource is
//! cheap (the TSC through the vDSO) that is ~20 ns, but a guest whose kernel marked the TSC
//! unstable falls back to the HPET: `clock_gettime` becomes a system call plus an emulated
//! device read, about a microsecond under the soft-RoCE VM, i.e. a few percent of every
//! sample and an unfair handicap next to perftest, which reads the TSC. `quanta` refuses the
//! TSC there (no `constant_tsc` flag) and falls back to the same slow clock.
//!
//! What is measured does not change: the same two points bracket the same call; only the
//! cost of reading the time goes down (`rdtsc` is tens of cycles, even emulated). The TSC is
//! converted to nanoseconds with a rate measured against [`std::time::Instant`] on first
//! use; a rate outside any plausible range, or another architecture, falls back to
//! `std::time::Instant`. Like perftest, this assumes the TSCs of all cores agree (true of
//! modern hardware and of qemu's TCG, whose vCPUs all read the host's counter); a reading
//! that goes backwards counts as zero elapsed time rather than wrapping.

use std::ops::{Add, Sub};
use std::sync::OnceLock;
use std::time::Duration;

/// How long the TSC rate is measured for: long enough that the two OS clock reads around it
/// (microseconds at worst) put the rate off by well under 0.1 %.
const CALIBRATION: Duration = Duration::from_millis(20);

/// The clock's source, fixed at first use.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// Time-stamp counter ticks per nanosecond.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Tsc { ticks_per_ns: f64 },
    /// The OS clock, in nanoseconds since `base`.
    Os { base: std::time::Instant },
}

fn source() -> &'static Source {
    static SOURCE: OnceLock<Source> = OnceLock::new();
    SOURCE.get_or_init(calibrate)
}

#[cfg(target_arch = "x86_64")]
fn calibrate() -> Source {
    let os_start = std::time::Instant::now();
    let tsc_start = tsc();
    std::thread::sleep(CALIBRATION);
    let tsc_end = tsc();
    let ns = os_start.elapsed().as_nanos() as f64;
    let ticks_per_ns = tsc_end.wrapping_sub(tsc_start) as f64 / ns;
    // 100 MHz to 20 GHz: anything else is a counter that does not tick at a fixed rate.
    if (0.1..20.0).contains(&ticks_per_ns) {
        Source::Tsc { ticks_per_ns }
    } else {
        Source::Os { base: os_start }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn calibrate() -> Source {
    Source::Os {
        base: std::time::Instant::now(),
    }
}

#[cfg(target_arch = "x86_64")]
fn tsc() -> u64 {
    // SAFETY: `rdtsc` has no preconditions and is available on every x86_64 CPU.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// A point in time of the benchmark clock, in the clock's own ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Instant(u64);

impl Instant {
    /// Now.
    #[inline]
    pub fn now() -> Instant {
        match *source() {
            #[cfg(target_arch = "x86_64")]
            Source::Tsc { .. } => Instant(tsc()),
            #[cfg(not(target_arch = "x86_64"))]
            Source::Tsc { .. } => unreachable!("only x86_64 calibrates the TSC"),
            Source::Os { base } => Instant(base.elapsed().as_nanos() as u64),
        }
    }

    /// Time since `self`.
    pub fn elapsed(&self) -> Duration {
        Instant::now() - *self
    }

    /// Time from `earlier` to `self`; zero if `earlier` is later.
    pub fn saturating_duration_since(&self, earlier: Instant) -> Duration {
        let ticks = self.0.saturating_sub(earlier.0);
        match *source() {
            Source::Tsc { ticks_per_ns } => {
                Duration::from_nanos((ticks as f64 / ticks_per_ns) as u64)
            }
            Source::Os { .. } => Duration::from_nanos(ticks),
        }
    }
}

impl Sub for Instant {
    type Output = Duration;

    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;

    fn add(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(ticks_in(d)))
    }
}

/// Clock ticks in `d`.
fn ticks_in(d: Duration) -> u64 {
    let ns = d.as_nanos() as f64;
    match *source() {
        Source::Tsc { ticks_per_ns } => (ns * ticks_per_ns) as u64,
        Source::Os { .. } => ns as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_the_os_clock() {
        // Calibrated on first use: not inside the interval compared.
        Instant::now();
        let os = std::time::Instant::now();
        let ours = Instant::now();
        std::thread::sleep(Duration::from_millis(30));
        let ours = ours.elapsed();
        let os = os.elapsed();
        // Within 10 % (and the OS reads bracket ours, so ours is not longer than theirs
        // by more than the error of the rate).
        let (a, b) = (ours.as_secs_f64(), os.as_secs_f64());
        assert!((a - b).abs() < 0.1 * b, "ours {ours:?}, os {os:?}");
    }

    #[test]
    fn never_goes_backwards_and_adds_durations() {
        let a = Instant::now();
        let b = Instant::now();
        assert!(b >= a);
        assert_eq!(
            a - b,
            Duration::ZERO,
            "an earlier minus a later point is zero"
        );
        let later = a + Duration::from_millis(5);
        let d = later - a;
        assert!(
            d >= Duration::from_micros(4_990) && d <= Duration::from_micros(5_010),
            "{d:?}"
        );
    }
}
