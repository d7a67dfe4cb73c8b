//! Starting the shards: one glommio executor per core, pinned to it when the shards
//! take every CPU the process may use ([`pin_shards`]).

use std::future::Future;
use std::time::Duration;

use glommio::{CpuSet, LocalExecutorBuilder, Placement};

/// How the executors are built.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Number of shards (executor threads).
    pub shard_count: usize,
    /// Memory glommio registers for its io_uring buffers, per executor. glommio needs
    /// at least 512 KiB of lockable memory; set explicitly rather than relying on its
    /// default. Storage's aligned write buffers (up to `write_bytes_max`, 8 MiB, and
    /// one prepared while another is in flight) come from it; larger or excess ones
    /// fall back to the system allocator (page faults on every write).
    pub io_memory_bytes: usize,
    /// How long a task may run before the executor yields to other task queues.
    pub preempt_timer: Duration,
    /// Pin each executor to one CPU (the broker: [`pin_shards`]; off in tests that run
    /// many brokers at once).
    pub pin: bool,
    /// How often an executor with nothing to do wakes anyway (see [`keep_awake`]).
    pub wake_period: Duration,
}

impl RuntimeConfig {
    pub fn new(shard_count: usize) -> RuntimeConfig {
        RuntimeConfig {
            shard_count,
            io_memory_bytes: 16 << 20,
            preempt_timer: Duration::from_millis(10),
            pin: true,
            wake_period: WAKE_PERIOD,
        }
    }
}

/// The default period of [`keep_awake`].
pub const WAKE_PERIOD: Duration = Duration::from_millis(5);

/// Spawns, on the current executor, a task that wakes it every `period`, so that the
/// executor never sleeps longer than that.
///
/// Why: on the kernel of the machines we run on (Linux 6.18), a glommio executor
/// sleeping in `io_uring_enter` is now and then not woken by work that is ready for
/// it, and sleeps until something else wakes it — for ever, if nothing does. Seen as a
/// storage test hanging about once in 60 runs of the recovery tier (CI timed out on
/// one): the executor thread asleep in `io_cqring_wait` with no completion queued, its
/// task waiting on an I/O; any interruption (attaching strace) and it ran on and
/// passed. Timer expiries do wake it: with this task at 20 ms the same tier ran 600
/// times without a hang. So every executor this project starts runs it; a lost
/// wake-up then costs at most `period`, and an idle executor `1 / period` wake-ups a
/// second (each a few microseconds).
pub fn keep_awake(period: Duration) {
    glommio::spawn_local(async move {
        loop {
            glommio::timer::sleep(period).await;
        }
    })
    .detach();
}

/// Runs `f` on a new unpinned executor named `name` (with [`keep_awake`] at
/// [`WAKE_PERIOD`] and `io_memory_bytes` of io_uring buffers), waits for it, and
/// returns its output: for tests and tools that need one executor.
pub fn run_unpinned<F, Fut, T>(name: &str, io_memory_bytes: usize, f: F) -> T
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
    T: Send + 'static,
{
    LocalExecutorBuilder::new(Placement::Unbound)
        .name(name)
        .io_memory(io_memory_bytes)
        .spawn(move || async move {
            keep_awake(WAKE_PERIOD);
            let out = f().await;
            drain_blocking().await;
            out
        })
        .expect("spawn executor")
        .join()
        .expect("executor thread")
}

/// How long an ending executor waits for its blocking thread (see [`drain_blocking`]).
pub const DRAIN_BLOCKING_MAX: Duration = Duration::from_secs(10);

/// Waits, on an executor whose work is done, until every operation handed to its
/// blocking thread before the call has finished (at most [`DRAIN_BLOCKING_MAX`]).
///
/// Why: glommio runs renames, removals, truncations, directory creations and
/// `spawn_blocking` closures on one blocking thread per executor, which works through
/// them in order and sends each result back. Detached tasks (a log opening, a
/// checkpoint write) may still have some queued when the executor's main future ends;
/// once the executor is dropped, the thread's send fails and glommio panics there
/// (`failed to send response`), which with `panic = "abort"` killed a broker that was
/// stopping cleanly. A no-op queued last returns only after everything before it, so
/// what was started before the stop finishes while its executor still lives. What
/// detached tasks queue after this point is covered by [`is_orphaned_blocking_result`].
pub async fn drain_blocking() {
    let barrier = glommio::executor().spawn_blocking(|| ());
    let waited = glommio::timer::timeout(DRAIN_BLOCKING_MAX, async {
        barrier.await;
        Ok(())
    })
    .await;
    if waited.is_err() {
        tracing::warn!(
            "blocking operations still running {DRAIN_BLOCKING_MAX:?} after the executor's work ended"
        );
    }
}

/// Whether a panic is glommio's blocking thread failing to hand a finished operation's
/// result to an executor that no longer exists (see [`drain_blocking`]). Nothing can
/// receive that result any more, so the panic says only that the operation outlived its
/// executor: a panic hook should let that thread end quietly (park it) instead of
/// aborting a process that is stopping cleanly. Any other panic is not this one.
pub fn is_orphaned_blocking_result(info: &std::panic::PanicHookInfo<'_>) -> bool {
    let message = info
        .payload()
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| info.payload().downcast_ref::<String>().map(String::as_str));
    let from_glommio_pool = info
        .location()
        .is_some_and(|l| l.file().contains("glommio") && l.file().ends_with("src/sys/blocking.rs"));
    from_glommio_pool
        && message == Some("failed to send response")
        && std::thread::current().name().is_none()
}

/// Whether a process running `shard_count` executors should pin them, one to a CPU:
/// only when they take every CPU it may run on ([`online_cpus`], its affinity mask).
///
/// Why: a process given fewer shards than it has CPUs shares the machine (the brokers
/// of a cluster on one host, a load generator, other programs), and pinning would put
/// shard 0 of every such process on the same first CPU: three one-core brokers on a
/// 2-core machine all ran on CPU 0 while CPU 1 served only the load generator, and
/// every replication round trip queued behind the other brokers' turns on that CPU.
/// Unpinned, the kernel spreads them. To pin a broker that does not take the whole
/// machine, start it in a CPU set of exactly its shard count (`taskset -c`, systemd's
/// `AllowedCPUs=`): its shards are then pinned inside the set.
pub fn pin_shards(shard_count: usize) -> bool {
    pins_for(shard_count, online_cpus().len())
}

fn pins_for(shard_count: usize, cpus: usize) -> bool {
    shard_count >= cpus
}

/// The CPUs this process may run on, in id order: the machine's online CPUs that are
/// in the process's affinity mask, so a broker started in a CPU set (`taskset`,
/// systemd's `AllowedCPUs=`, a container's cpuset) pins its shards inside it.
pub fn online_cpus() -> Vec<usize> {
    let allowed = affinity();
    let mut cpus: Vec<usize> = CpuSet::online()
        .map(|s| s.iter().map(|l| l.cpu).collect())
        .unwrap_or_default();
    if let Some(allowed) = &allowed {
        cpus.retain(|c| allowed.contains(c));
    }
    cpus.sort_unstable();
    cpus.dedup();
    if cpus.is_empty() {
        let n = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        cpus = (0..n).collect();
    }
    cpus
}

/// The CPUs of this process's affinity mask (`None` if it cannot be read).
fn affinity() -> Option<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set the call fills in.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a cpu_set_t of `size` bytes.
    if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
        return None;
    }
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect();
    (!cpus.is_empty()).then_some(cpus)
}

/// Spawns one executor per element of `shards` (shard `i` runs `shards[i]()`), in shard
/// order (the channel mesh numbers its peers in that order). Returns once every shard
/// has finished; the result is each shard's outcome in shard order.
pub fn spawn_shards<G, Fut, T>(config: &RuntimeConfig, shards: Vec<G>) -> Vec<std::io::Result<T>>
where
    G: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
    T: Send + 'static,
{
    assert_eq!(
        config.shard_count,
        shards.len(),
        "one start function per shard"
    );
    let cpus = online_cpus();
    let mut handles = Vec::with_capacity(config.shard_count);
    for (i, make) in shards.into_iter().enumerate() {
        let placement = if config.pin {
            Placement::Fixed(cpus[i % cpus.len()])
        } else {
            Placement::Unbound
        };
        let builder = LocalExecutorBuilder::new(placement)
            .name(&format!("shard-{i}"))
            .io_memory(config.io_memory_bytes)
            .preempt_timer(config.preempt_timer);
        let period = config.wake_period;
        let handle = builder.spawn(move || async move {
            keep_awake(period);
            let out = make().await;
            drain_blocking().await;
            out
        });
        handles.push(handle.map_err(|e| std::io::Error::other(e.to_string())));
    }
    handles
        .into_iter()
        .map(|h| h.and_then(|h| h.join().map_err(|e| std::io::Error::other(e.to_string()))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::pins_for;

    #[test]
    fn shards_are_pinned_only_when_they_take_every_allowed_cpu() {
        assert!(pins_for(2, 2), "a broker on the whole machine pins");
        assert!(pins_for(1, 1), "a broker in a one-CPU set pins inside it");
        assert!(
            pins_for(4, 2),
            "more shards than CPUs: still one CPU each, in turn"
        );
        assert!(
            !pins_for(1, 2),
            "a one-core broker on a 2-CPU machine shares it"
        );
        assert!(!pins_for(3, 8));
    }
}
