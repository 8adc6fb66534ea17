//! Waiting for a state the test cannot be told about: one bounded poll loop
//! for every test.
//!
//! It runs on `tokio::time`, so under paused time
//! (`#[tokio::test(start_paused = true)]`) each wait between looks is a
//! jump of the clock, not a real sleep.

use std::time::Duration;

use tokio::time::{Instant, sleep};

/// How long [`poll`] waits between two looks.
pub const EVERY: Duration = Duration::from_millis(50);

/// Calls `probe` every [`EVERY`] until `done` holds of its answer, for at
/// most `within`: `Ok` with the answer that was done, or `Err` with the last
/// answer once `within` has passed (for the assertion's message:
/// `poll(...).await.expect("what was awaited")`).
pub async fn poll<T>(
    within: Duration,
    mut probe: impl AsyncFnMut() -> T,
    mut done: impl FnMut(&T) -> bool,
) -> Result<T, T> {
    let deadline = Instant::now() + within;
    loop {
        let answer = probe().await;
        if done(&answer) {
            return Ok(answer);
        }
        if Instant::now() >= deadline {
            return Err(answer);
        }
        sleep(EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn gives_the_answer_that_was_done_or_the_last_one_at_the_deadline() {
        let mut n = 0;
        let got = poll(
            Duration::from_secs(1),
            async || {
                n += 1;
                n
            },
            |&n| n == 3,
        )
        .await;
        assert_eq!(got, Ok(3));
        let start = Instant::now();
        let got = poll(Duration::from_secs(1), async || 0, |&n| n == 1).await;
        assert_eq!(got, Err(0));
        assert!(start.elapsed() >= Duration::from_secs(1));
    }
}
