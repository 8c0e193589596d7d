//! The read loop's one timer. A timer made for every wait costs an insertion into tokio's
//! timer wheel and a removal per frame read; this one moves only when it must fire sooner,
//! or when it fires before the deadline the loop waits for now (which moves later with
//! every read): at most once an idle period.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::task::Poll;
use std::time::Duration;

use tokio::time::{sleep_until, Instant, Sleep};

/// Where a new timer starts: past any deadline the loop waits for, so the first wait sets it.
const UNSET: Duration = Duration::from_secs(24 * 60 * 60);

/// A connection's read deadline.
pub(crate) struct ReadDeadline {
    timer: Pin<Box<Sleep>>,
}

impl ReadDeadline {
    pub(crate) fn new() -> Self {
        ReadDeadline {
            timer: Box::pin(sleep_until(Instant::now() + UNSET)),
        }
    }

    /// Waits for `ready`, at most until `deadline`: `None` once that passed first.
    pub(crate) async fn wait<F: Future>(
        &mut self,
        deadline: Instant,
        ready: F,
    ) -> Option<F::Output> {
        if self.timer.deadline() > deadline {
            self.timer.as_mut().reset(deadline);
        }
        let mut ready = pin!(ready);
        poll_fn(|cx| {
            if let Poll::Ready(output) = ready.as_mut().poll(cx) {
                return Poll::Ready(Some(output));
            }
            while self.timer.as_mut().poll(cx).is_ready() {
                if self.timer.deadline() >= deadline {
                    return Poll::Ready(None);
                }
                // Set for an earlier wait, whose deadline has moved on since.
                self.timer.as_mut().reset(deadline);
            }
            Poll::Pending
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_at_its_deadline_not_at_an_earlier_one() {
        let mut deadline = ReadDeadline::new();
        let start = Instant::now();
        // Ready at once: the timer is set, not awaited.
        assert_eq!(
            deadline
                .wait(start + Duration::from_secs(1), async { 7 })
                .await,
            Some(7)
        );
        // A later deadline: the timer set for the first fires early and is moved.
        let later = start + Duration::from_secs(5);
        assert_eq!(
            deadline.wait(later, std::future::pending::<()>()).await,
            None
        );
        assert_eq!(Instant::now(), later);
        // An earlier deadline than the timer's moves it sooner.
        let sooner = Instant::now() + Duration::from_millis(10);
        deadline
            .timer
            .as_mut()
            .reset(Instant::now() + Duration::from_secs(60));
        assert_eq!(
            deadline.wait(sooner, std::future::pending::<()>()).await,
            None
        );
        assert_eq!(Instant::now(), sooner);
    }

    #[tokio::test(start_paused = true)]
    async fn what_is_ready_before_the_deadline_wins() {
        let mut deadline = ReadDeadline::new();
        let at = Instant::now() + Duration::from_secs(1);
        let ready = tokio::time::sleep(Duration::from_millis(500));
        assert_eq!(deadline.wait(at, ready).await, Some(()));
        assert!(Instant::now() < at);
    }
}
