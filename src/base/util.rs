//! Small helpers every layer may use: future combinators that fan requests out over
//! shards and partitions, the lost-wake-up-free wait, the wall clock, Kafka strings and
//! the listener bind.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::stream::{FuturesUnordered, StreamExt};

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
///
/// Each future gets its own waker, so a wake-up polls only the futures it is for, and
/// the task's own waker is held once however many futures wait. Both matter at scale:
/// glommio counts a task's waker clones in an `i16` and aborts the process past
/// 32,767, which a Produce to 10,000 partitions reached when every pending future held
/// its own clone; and re-polling all n futures on every wake-up made such a request
/// O(n²). Unlike `FuturesOrdered`, the first poll starts every future, in input order,
/// before returning: pipelined requests issue their appends in request order (a
/// handler that stopped half-way would let the next request's appends overtake it).
///
/// Takes an iterator rather than a `Vec`: each future goes straight into its own box.
/// Collected first, a Produce to thousands of partitions built one contiguous buffer of
/// their (large) handler futures per request, which the allocator served with fresh
/// pages each time: a quarter of a one-broker 10,000-partition load's CPU went to
/// zeroing them.
pub async fn join_all<T, F: Future<Output = T>>(futures: impl IntoIterator<Item = F>) -> Vec<T> {
    let mut unpolled = Some(futures.into_iter());
    let mut futures: Vec<Option<Pin<Box<F>>>> = Vec::new();
    let mut results: Vec<Option<T>> = Vec::new();
    let mut wakers: Vec<Option<Waker>> = Vec::new();
    let woken = Arc::new(Woken {
        indexes: Mutex::new(Vec::new()),
        task: Mutex::new(None),
    });
    let mut left = 0;
    std::future::poll_fn(|cx: &mut Context<'_>| {
        {
            let mut task = woken.task.lock().unwrap_or_else(|e| e.into_inner());
            if !task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        // The first poll polls each future as it is made: one that is ready at once
        // (most, when the work needs no wait) frees its box and waker straight away,
        // so the next one reuses the same, still cached, memory.
        if let Some(made) = unpolled.take() {
            let (lower, _) = made.size_hint();
            futures.reserve(lower);
            results.reserve(lower);
            wakers.reserve(lower);
            for f in made {
                let index = futures.len();
                let waker = Waker::from(Arc::new(Child {
                    index,
                    woken: woken.clone(),
                }));
                let mut f = Box::pin(f);
                match f.as_mut().poll(&mut Context::from_waker(&waker)) {
                    Poll::Ready(v) => {
                        futures.push(None);
                        results.push(Some(v));
                        wakers.push(None);
                    }
                    Poll::Pending => {
                        futures.push(Some(f));
                        results.push(None);
                        wakers.push(Some(waker));
                        left += 1;
                    }
                }
            }
        }
        let mut ready =
            std::mem::take(&mut *woken.indexes.lock().unwrap_or_else(|e| e.into_inner()));
        ready.sort_unstable();
        ready.dedup();
        for i in ready {
            if let (Some(f), Some(w)) = (futures[i].as_mut(), wakers[i].as_ref()) {
                if let Poll::Ready(v) = f.as_mut().poll(&mut Context::from_waker(w)) {
                    results[i] = Some(v);
                    futures[i] = None;
                    wakers[i] = None;
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

/// Runs `finish` on every item and returns the outputs in item order. Items whose
/// waits are met in order, or nearly (`ordered`: records that went through the
/// shard's journal, which writes and syncs in the order they were staged; high
/// watermarks that the followers' rounds move together) go last first: the last
/// ordered item's wait covers those before it, so theirs are usually over at their
/// first poll and a thousand items cost one listener and one wake-up, not a thousand
/// of each (an item its wait did not cover waits for itself after). The other items
/// (e.g. written to their own files, whose writes and syncs their waits start) begin
/// at once, beside that last one.
pub async fn last_first<T, O, F: Future<Output = O>>(
    items: Vec<T>,
    ordered: impl Fn(&T) -> bool,
    finish: impl Fn(T) -> F,
) -> Vec<O> {
    let n = items.len();
    let last_ordered = items.iter().rposition(&ordered);
    let (mut last, mut others, mut after) = (None, Vec::new(), Vec::new());
    for (i, t) in items.into_iter().enumerate() {
        if Some(i) == last_ordered {
            last = Some(t);
        } else if ordered(&t) {
            after.push((i, t));
        } else {
            others.push((i, t));
        }
    }
    let indexed = |(i, t): (usize, T)| {
        let f = finish(t);
        async move { (i, f.await) }
    };
    let last = async {
        match last {
            Some(t) => Some(finish(t).await),
            None => None,
        }
    };
    let (last, others) =
        futures_lite::future::zip(last, join_all(others.into_iter().map(&indexed))).await;
    let after = join_all(after.into_iter().map(&indexed)).await;
    let mut outs: Vec<Option<O>> = (0..n).map(|_| None).collect();
    if let (Some(i), Some(o)) = (last_ordered, last) {
        outs[i] = Some(o);
    }
    for (i, o) in others.into_iter().chain(after) {
        outs[i] = Some(o);
    }
    outs.into_iter()
        .map(|o| o.expect("every item finished"))
        .collect()
}

/// The futures of a [`join_all`] woken since its last poll, and its task's waker.
struct Woken {
    indexes: Mutex<Vec<usize>>,
    task: Mutex<Option<Waker>>,
}

/// The waker of one future of a [`join_all`].
struct Child {
    index: usize,
    woken: Arc<Woken>,
}

impl Wake for Child {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken
            .indexes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.index);
        if let Some(task) = self
            .woken
            .task
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            task.wake_by_ref();
        }
    }
}

/// Waits until one of the futures returns `true` (then drops the rest) or all return
/// `false`. Each future must end on its own (they carry their own timeouts). Each is
/// woken on its own, as in [`join_all`].
pub async fn any_true<F: Future<Output = bool>>(futures: Vec<F>) -> bool {
    let mut pending: FuturesUnordered<F> = futures.into_iter().collect();
    while let Some(done) = pending.next().await {
        if done {
            return true;
        }
    }
    false
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
    // One timer for the whole wait, and the listeners woken each on its own: a fetch
    // over thousands of partitions waits on thousands of events.
    let any = async move {
        let mut woken: FuturesUnordered<event_listener::EventListener> =
            listeners.into_iter().collect();
        woken.next().await;
        true
    };
    futures_lite::future::or(any, async {
        glommio::timer::sleep(timeout).await;
        false
    })
    .await
}

/// Keeps one connection's produce requests issuing their appends in request order,
/// as Kafka does by handling a connection's requests one at a time, while their
/// handlers still run concurrently and wait for their acks concurrently.
///
/// The connection takes a [`Turn`] for each produce request as it reads it (so turns
/// follow request order). A handler does what it likes before issuing its appends
/// (auto-create a topic, resolve partitions), then [`Turn::wait`]s until every earlier
/// turn is released, issues its appends and releases its turn ([`Turn::release`], or by
/// dropping it: a request that fails early or is cancelled with its connection
/// releases too). A turn released before the ones ahead of it lets nobody through
/// until they are released as well. Single-threaded (one connection lives on one shard).
/// Each partition replica has one too, so that the appends of produce requests reaching
/// its shard keep that order past any wait before the append
/// (`crate::partition::replica::Replica::append_turn`).
#[derive(Default)]
pub struct Sequencer {
    state: std::rc::Rc<std::cell::RefCell<SequencerState>>,
}

/// The turns not yet passed, oldest first (`first` is the ticket of `turns[0]`).
/// Bounded by the connection's in-flight limit.
#[derive(Default)]
struct SequencerState {
    first: u64,
    turns: std::collections::VecDeque<TurnSlot>,
}

#[derive(Default)]
struct TurnSlot {
    released: bool,
    waiter: Option<Waker>,
}

impl Sequencer {
    /// The next turn, behind every turn taken before.
    pub fn turn(&self) -> Turn {
        let mut st = self.state.borrow_mut();
        let ticket = st.first + st.turns.len() as u64;
        st.turns.push_back(TurnSlot::default());
        Turn {
            state: self.state.clone(),
            ticket,
        }
    }
}

/// One request's place in its connection's [`Sequencer`]; released when dropped.
pub struct Turn {
    state: std::rc::Rc<std::cell::RefCell<SequencerState>>,
    ticket: u64,
}

impl Turn {
    /// Waits until every earlier turn of the connection has been released.
    pub async fn wait(&self) {
        std::future::poll_fn(|cx| {
            let mut st = self.state.borrow_mut();
            if st.first == self.ticket {
                return Poll::Ready(());
            }
            let i = (self.ticket - st.first) as usize;
            st.turns[i].waiter = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Lets the next turn go (once the turns before this one are released too).
    pub fn release(self) {}
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut st = self.state.borrow_mut();
        let i = (self.ticket - st.first) as usize;
        st.turns[i].released = true;
        while st.turns.front().is_some_and(|t| t.released) {
            st.turns.pop_front();
            st.first += 1;
        }
        let next = st.turns.front_mut().and_then(|t| t.waiter.take());
        drop(st);
        if let Some(w) = next {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A future that wakes itself and yields once (as a cross-shard send or glommio's
    /// preemption check may), then finishes.
    struct YieldOnce(bool);

    impl Future for YieldOnce {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            if self.0 {
                return Poll::Ready(());
            }
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    /// The first poll of a join starts every future in order, even when they yield:
    /// a handler's appends are all issued before the next pipelined request's.
    /// (`FuturesOrdered` stops after two futures yield and starts the rest later.)
    #[test]
    fn join_all_starts_every_future_in_order_on_its_first_poll() {
        let started = std::cell::RefCell::new(Vec::new());
        let futs: Vec<_> = (0..10)
            .map(|i| {
                let started = &started;
                async move {
                    started.borrow_mut().push(i);
                    YieldOnce(false).await;
                    i
                }
            })
            .collect();
        let (out, seen) =
            futures_lite::future::block_on(futures_lite::future::zip(join_all(futs), async {
                started.borrow().clone()
            }));
        assert_eq!(
            seen,
            (0..10).collect::<Vec<_>>(),
            "all started by the first poll"
        );
        assert_eq!(out, (0..10).collect::<Vec<_>>());
    }

    /// Request N waits before issuing its append (as an auto-create or a full mesh
    /// channel makes it) while request N+1 of the same connection is ready: N+1's
    /// append still comes second. Without the turns N+1 would append first.
    #[test]
    fn a_waiting_request_keeps_its_place_ahead_of_the_next() {
        let seq = Sequencer::default();
        let log = std::cell::RefCell::new(Vec::new());
        let gate = event_listener::Event::new();
        let (first, second) = (seq.turn(), seq.turn());
        let (log, gate) = (&log, &gate);
        let held = gate.listen();
        let n = async move {
            first.wait().await;
            held.await;
            log.borrow_mut().push("N");
            first.release();
        };
        let n1 = async move {
            second.wait().await;
            log.borrow_mut().push("N+1");
            second.release();
        };
        let driver = async move {
            // Give N+1 every chance to overtake before N may go on.
            for _ in 0..3 {
                YieldOnce(false).await;
            }
            assert!(
                log.borrow().is_empty(),
                "request N+1 appended while request N waited"
            );
            gate.notify(1);
        };
        futures_lite::future::block_on(futures_lite::future::zip(
            futures_lite::future::zip(n, n1),
            driver,
        ));
        assert_eq!(*log.borrow(), ["N", "N+1"]);
    }

    /// A turn released early (a request that failed before appending) lets nobody past
    /// the turns still ahead of it; releasing those lets the next one through.
    #[test]
    fn a_turn_waits_for_every_earlier_turn() {
        use futures_lite::future::{block_on, poll_once};
        let seq = Sequencer::default();
        let (a, b, c) = (seq.turn(), seq.turn(), seq.turn());
        block_on(async {
            assert!(poll_once(a.wait()).await.is_some(), "the first turn goes");
            assert!(poll_once(c.wait()).await.is_none());
            drop(b);
            assert!(poll_once(c.wait()).await.is_none(), "a is not released yet");
            a.release();
            assert!(poll_once(c.wait()).await.is_some());
            c.release();
            let d = seq.turn();
            assert!(
                poll_once(d.wait()).await.is_some(),
                "nothing left ahead of d"
            );
        });
    }

    /// `last_first`: the last ordered item starts first, the unordered ones beside
    /// it, the other ordered ones only once it finished; outputs in item order.
    #[test]
    fn last_first_waits_for_the_last_ordered_item_before_the_others() {
        let started = std::cell::RefCell::new(Vec::new());
        let items = vec![(0, true), (1, false), (2, true), (3, true), (4, false)];
        let out = futures_lite::future::block_on(last_first(
            items,
            |(_, ordered)| *ordered,
            |(i, _)| {
                let started = &started;
                async move {
                    started.borrow_mut().push(i);
                    YieldOnce(false).await;
                    i * 10
                }
            },
        ));
        assert_eq!(*started.borrow(), [3, 1, 4, 0, 2]);
        assert_eq!(out, [0, 10, 20, 30, 40]);
        let none: Vec<(i32, bool)> = Vec::new();
        let out =
            futures_lite::future::block_on(last_first(none, |_| true, |(i, _)| async move { i }));
        assert!(out.is_empty());
    }

    #[test]
    fn join_all_keeps_order_and_any_true_short_circuits() {
        let out = futures_lite::future::block_on(join_all((1..=3).map(|i| async move { i })));
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
        sluice_shard::run_unpinned("util-test", 8 << 20, f)
    }

    /// More waiting futures on one task than glommio's waker count holds (an `i16`):
    /// 40,000 partitions' waits in one request must neither abort the process nor
    /// lose a wake-up.
    #[test]
    fn one_task_waits_on_more_futures_than_a_waker_count_holds() {
        const N: usize = 40_000;
        let (joined, any) = on_executor(|| {
            Box::pin(async {
                let events: Vec<event_listener::Event> =
                    (0..N).map(|_| event_listener::Event::new()).collect();
                let waits: Vec<_> = events
                    .iter()
                    .enumerate()
                    .map(|(i, e)| {
                        let l = e.listen();
                        async move {
                            l.await;
                            i
                        }
                    })
                    .collect();
                // zip polls the waits first: all pending, then every event fires.
                let fire = async {
                    for e in &events {
                        e.notify(usize::MAX);
                    }
                };
                let (joined, ()) = futures_lite::future::zip(join_all(waits), fire).await;
                let conditions: Vec<Condition<'_>> = events
                    .iter()
                    .map(|e| (e, Box::new(|| false) as Box<dyn Fn() -> bool>))
                    .collect();
                let last = &events[N - 1];
                let any = futures_lite::future::zip(
                    wait_any(conditions, Duration::from_secs(30)),
                    async {
                        last.notify(usize::MAX);
                    },
                )
                .await
                .0;
                (joined.iter().enumerate().all(|(i, v)| i == *v), any)
            })
        });
        assert!(joined, "join_all answers every future in order");
        assert!(any, "wait_any wakes on the last of 40,000 events");
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
