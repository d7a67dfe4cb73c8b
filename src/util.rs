//! Small helpers every layer may use: future combinators that fan requests out over
//! shards and partitions, the lost-wake-up-free wait, the wall clock, Kafka strings and
//! the listener bind.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

pub use sluice_protocol::sb;

/// Binds a listener: SO_REUSEPORT (every shard binds the same address) as glommio's own
/// `bind` does, plus SO_REUSEADDR, so that connections a previous run left in
/// TIME_WAIT do not block a restart (accepted sockets inherit the option).
pub fn bind(addr: std::net::SocketAddr) -> std::io::Result<glommio::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::os::fd::FromRawFd;
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    sock.set_reuse_port(true)?;
    sock.set_cloexec(true)?;
    sock.bind(&addr.into())?;
    sock.listen(1024)?;
    // SAFETY: a bound, listening socket whose descriptor we hand over.
    Ok(
        unsafe {
            glommio::net::TcpListener::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(sock))
        },
    )
}

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

/// A condition to wait for: the event that signals progress, and the check.
pub type Condition<'a> = (&'a event_listener::Event, Box<dyn Fn() -> bool + 'a>);

/// Waits until one of `conditions` holds, each signalled by its event, or `timeout`
/// (then `false`). Each event's listener is registered *before* its condition is
/// read, so progress that lands between the read and the wait (a flush completing
/// right then) still wakes the waiter: no lost wake-up. The fetch long-poll uses it.
pub async fn wait_any(conditions: Vec<Condition<'_>>, timeout: std::time::Duration) -> bool {
    let mut listeners = Vec::with_capacity(conditions.len());
    for (event, holds) in &conditions {
        let listener = event.listen();
        if holds() {
            return true;
        }
        listeners.push(listener);
    }
    if listeners.is_empty() {
        glommio::timer::sleep(timeout).await;
        return false;
    }
    let futs = listeners
        .into_iter()
        .map(|listener| async move {
            futures_lite::future::or(
                async {
                    listener.await;
                    true
                },
                async {
                    glommio::timer::sleep(timeout).await;
                    false
                },
            )
            .await
        })
        .collect();
    any_true(futs).await
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

#[cfg(test)]
mod wait_tests {
    use super::*;
    use std::cell::Cell;
    use std::time::Duration;

    fn on_executor<T: Send + 'static>(
        f: impl FnOnce() -> std::pin::Pin<Box<dyn Future<Output = T>>> + Send + 'static,
    ) -> T {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .spawn(f)
            .unwrap()
            .join()
            .unwrap()
    }

    /// The lost wake-up fixed in f0e4fe4, made deterministic: the progress (a flush)
    /// lands exactly between reading the condition and waiting. The condition is read
    /// once before the wait and reports "not yet" while the event fires; a waiter that
    /// registered its listener after the read would sleep the whole timeout and
    /// answer false.
    #[test]
    fn progress_between_the_read_and_the_wait_wakes_the_waiter() {
        let woke = on_executor(|| {
            Box::pin(async {
                let event = event_listener::Event::new();
                let flushed = Cell::new(false);
                let cond = || {
                    // The read sees the state before the flush...
                    let before = flushed.get();
                    // ...and the flush completes right after it, notifying.
                    flushed.set(true);
                    event.notify(usize::MAX);
                    before
                };
                wait_any(vec![(&event, Box::new(cond))], Duration::from_secs(30)).await
            })
        });
        assert!(
            woke,
            "the notification between the read and the wait was lost"
        );
    }

    #[test]
    fn wait_any_times_out_false_and_sees_a_condition_already_true() {
        let (timed_out, already) = on_executor(|| {
            Box::pin(async {
                let event = event_listener::Event::new();
                let no =
                    wait_any(vec![(&event, Box::new(|| false))], Duration::from_millis(1)).await;
                let yes =
                    wait_any(vec![(&event, Box::new(|| true))], Duration::from_secs(30)).await;
                (no, yes)
            })
        });
        assert!(!timed_out);
        assert!(already);
    }
}

/// Turns an uncompressed v2 record batch built by the broker (no producer) into a
/// transactional batch of `producer_id` at `producer_epoch`, without a sequence (the
/// coordinator's own writes, as Kafka's TxnOffsetCommit appends), and recomputes its
/// CRC.
pub fn mark_transactional(batch: &mut [u8], producer_id: i64, producer_epoch: i16) {
    // v2 header: base offset 8, length 4, leader epoch 4, magic 1, CRC 4, attributes 2,
    // last offset delta 4, first and max timestamps 16, producer id 8, epoch 2, base
    // sequence 4, record count 4.
    const CRC: usize = 17;
    const ATTRIBUTES: usize = 21;
    const PRODUCER_ID: usize = 43;
    const EPOCH: usize = 51;
    const TRANSACTIONAL: i16 = 1 << 4;
    let attrs = i16::from_be_bytes([batch[ATTRIBUTES], batch[ATTRIBUTES + 1]]) | TRANSACTIONAL;
    batch[ATTRIBUTES..ATTRIBUTES + 2].copy_from_slice(&attrs.to_be_bytes());
    batch[PRODUCER_ID..PRODUCER_ID + 8].copy_from_slice(&producer_id.to_be_bytes());
    batch[EPOCH..EPOCH + 2].copy_from_slice(&producer_epoch.to_be_bytes());
    let crc = crc32c::crc32c(&batch[ATTRIBUTES..]);
    batch[CRC..CRC + 4].copy_from_slice(&crc.to_be_bytes());
}
