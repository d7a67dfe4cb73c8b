//! Small future combinators used to fan requests out over shards and partitions, and
//! the wall clock.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Wall-clock milliseconds since the epoch (0 if the clock is before it): what Kafka
/// stores in commit timestamps and what the replication timers count in.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Runs every future concurrently on the current task; results in input order.
pub async fn join_all<T, F: Future<Output = T>>(futures: Vec<F>) -> Vec<T> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut results: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    let mut left = futures.len();
    std::future::poll_fn(|cx: &mut Context<'_>| {
        for (i, f) in futures.iter_mut().enumerate() {
            if results[i].is_none() {
                if let Poll::Ready(v) = f.as_mut().poll(cx) {
                    results[i] = Some(v);
                    left -= 1;
                }
            }
        }
        if left == 0 {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    results
        .into_iter()
        .map(|r| r.expect("every future finished"))
        .collect()
}

/// Waits until one of the futures returns `true` (then drops the rest) or all return
/// `false`. Each future must end on its own (they carry their own timeouts).
pub async fn any_true<F: Future<Output = bool>>(futures: Vec<F>) -> bool {
    let mut futures: Vec<Option<Pin<Box<F>>>> =
        futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    std::future::poll_fn(|cx: &mut Context<'_>| {
        let mut pending = false;
        for slot in futures.iter_mut() {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    Poll::Ready(true) => return Poll::Ready(true),
                    Poll::Ready(false) => *slot = None,
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(false)
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_all_keeps_order_and_any_true_short_circuits() {
        let out =
            futures_lite::future::block_on(join_all((1..=3).map(|i| async move { i }).collect()));
        assert_eq!(out, vec![1, 2, 3]);
        let f: Vec<Pin<Box<dyn Future<Output = bool>>>> = vec![
            Box::pin(async { false }),
            Box::pin(async { true }),
            Box::pin(std::future::pending()),
        ];
        assert!(futures_lite::future::block_on(any_true(f)));
        let g: Vec<Pin<Box<dyn Future<Output = bool>>>> = vec![Box::pin(async { false })];
        assert!(!futures_lite::future::block_on(any_true(g)));
    }
}
