//! An executor that ends with operations still on its blocking thread: they finish
//! before it is dropped (see `runtime::drain_blocking`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_shard::runtime::run_unpinned;

/// A detached task's blocking operation, started before the executor's work ends,
/// has finished when the executor returns.
#[test]
fn an_ending_executor_waits_for_its_blocking_thread() {
    let running = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let (r, d) = (running.clone(), done.clone());
    run_unpinned("drain", 1 << 20, move || async move {
        let (r2, d2) = (r.clone(), d.clone());
        glommio::spawn_local(async move {
            glommio::executor()
                .spawn_blocking(move || {
                    r2.store(true, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(300));
                    d2.store(true, Ordering::SeqCst);
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
        // The work ends here, with the operation still sleeping on the thread.
    });
    assert!(
        done.load(Ordering::SeqCst),
        "the executor returned before its blocking thread finished"
    );
}
