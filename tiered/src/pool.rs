//! Threads for the object store's blocking calls, apart from the shards' reactors and
//! from glommio's one blocking thread per executor (which syncs the shard's files: a
//! slow PUT there would hold up acknowledgements).

use std::future::Future;
use std::sync::Arc;

type Job = Box<dyn FnOnce() + Send>;

/// A fixed set of threads taking jobs in order. Cloning shares the threads; they end
/// when the last clone is dropped and the queue is empty.
#[derive(Clone)]
pub struct Pool {
    jobs: flume::Sender<Job>,
    threads: Arc<usize>,
}

impl Pool {
    pub fn new(threads: usize, name: &str) -> std::io::Result<Pool> {
        let (jobs, queue) = flume::unbounded::<Job>();
        let threads = threads.max(1);
        for i in 0..threads {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    while let Ok(job) = queue.recv() {
                        job();
                    }
                })?;
        }
        Ok(Pool {
            jobs,
            threads: Arc::new(threads),
        })
    }

    pub fn threads(&self) -> usize {
        *self.threads
    }

    /// Runs `f` on one of the threads; the future is its result. If the threads are
    /// gone (a job panicked them all away), the future answers `gone()`.
    pub fn run<R, F>(&self, f: F, gone: fn() -> R) -> impl Future<Output = R> + 'static
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let (tx, rx) = flume::bounded(1);
        let sent = self.jobs.send(Box::new(move || {
            let _ = tx.send(f());
        }));
        async move {
            if sent.is_err() {
                return gone();
            }
            rx.recv_async().await.unwrap_or_else(|_| gone())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_run_off_the_caller_and_answer() {
        let pool = Pool::new(2, "test-pool").unwrap();
        let me = std::thread::current().id();
        let answers: Vec<_> = (0..8u64)
            .map(|i| {
                pool.run(
                    move || (i * 2, std::thread::current().id()),
                    || (u64::MAX, std::thread::current().id()),
                )
            })
            .collect();
        for (i, a) in answers.into_iter().enumerate() {
            let (v, thread) = futures_lite::future::block_on(a);
            assert_eq!(v, i as u64 * 2);
            assert_ne!(thread, me);
        }
    }
}
