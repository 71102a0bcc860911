//! Stopping tokio tasks at shutdown: every edge (sync, serial ports, OSDP
//! buses) waits a bounded time for each of its tasks to finish on its own, then aborts it,
//! so a wedged task can delay a stop but never prevent it.

use std::time::Duration;
use tokio::task::JoinHandle;

/// Waits up to `within` for `task` to finish; aborts it if it has not, and
/// waits for the abort to land (so nothing of it runs after this returns).
/// Returns whether the task finished by itself.
pub async fn join_or_abort<T>(mut task: JoinHandle<T>, within: Duration) -> bool {
    if tokio::time::timeout(within, &mut task).await.is_ok() {
        return true;
    }
    task.abort();
    let _ = task.await;
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_that_ends_in_time_is_joined_and_one_that_hangs_is_aborted() {
        assert!(join_or_abort(tokio::spawn(async {}), Duration::from_secs(5)).await);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let hung = tokio::spawn(async move {
            let _tx = tx;
            std::future::pending::<()>().await;
        });
        assert!(!join_or_abort(hung, Duration::from_millis(10)).await);
        // The aborted task's state (its end of the channel) is gone.
        assert!(rx.await.is_err());
    }
}
