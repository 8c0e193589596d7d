//! Running a future to its end from a blocking call.

use std::future::Future;

use tokio::runtime::RuntimeFlavor;

use crate::Status;

/// Runs `future` to its end for a blocking caller: on the current runtime if this thread
/// belongs to a multi-threaded tokio runtime (its timers and I/O keep working), on the
/// calling thread outside any runtime (the future must then need no reactor). On a
/// current-thread runtime's thread it refuses `FAILED_PRECONDITION` naming `what`: blocking
/// that thread would stop the runtime the future may wait for.
pub(crate) fn run<T>(
    what: &str,
    future: impl Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) if runtime.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| runtime.block_on(future))
        }
        Ok(_) => Err(Status::failed_precondition(format!(
            "a blocking call with {what} on a current-thread runtime's thread: use the async call"
        ))),
        Err(_) => futures::executor::block_on(future),
    }
}
