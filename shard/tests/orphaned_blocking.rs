//! glommio's complaint about a blocking operation's result with no executor to go to
//! is recognised, and nothing else is (see `runtime::is_orphaned_blocking_result`).
//! Its own test binary: it installs a panic hook for the whole process.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use glommio::{LocalExecutorBuilder, Placement};
use sluice_shard::runtime::is_orphaned_blocking_result;

/// Waits until `cond` holds, for at most 10 s.
fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// 0: nothing seen yet; 1: glommio's orphaned result, recognised; 2: a panic not
/// recognised as that.
static SEEN: AtomicU8 = AtomicU8::new(0);

/// Without the drain, glommio's blocking thread panics once its executor is gone; the
/// classifier recognises exactly that panic, and not another one with the same text.
#[test]
fn an_orphaned_blocking_result_is_recognised_and_nothing_else_is() {
    std::panic::set_hook(Box::new(|info| {
        let kind = if is_orphaned_blocking_result(info) {
            1
        } else {
            2
        };
        SEEN.store(kind, Ordering::SeqCst);
    }));
    // The same message from somewhere else is not glommio's.
    let other = std::thread::spawn(|| panic!("failed to send response"));
    assert!(other.join().is_err());
    assert_eq!(SEEN.swap(0, Ordering::SeqCst), 2);

    let running = Arc::new(AtomicBool::new(false));
    let r = running.clone();
    LocalExecutorBuilder::new(Placement::Unbound)
        .name("no-drain")
        .spawn(move || async move {
            let r2 = r.clone();
            glommio::spawn_local(async move {
                glommio::executor()
                    .spawn_blocking(move || {
                        r2.store(true, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(200));
                    })
                    .await;
            })
            .detach();
            let deadline = Instant::now() + Duration::from_secs(10);
            while !r.load(Ordering::SeqCst) {
                assert!(
                    Instant::now() < deadline,
                    "the blocking operation never started"
                );
                glommio::timer::sleep(Duration::from_millis(1)).await;
            }
        })
        .expect("spawn executor")
        .join()
        .expect("executor thread");
    wait_until("the blocking thread's panic", || {
        SEEN.load(Ordering::SeqCst) != 0
    });
    assert_eq!(
        SEEN.load(Ordering::SeqCst),
        1,
        "glommio's orphaned-result panic was not recognised"
    );
}
