//! Named threads of their own for CPU work that allocates and frees a lot: the write
//! path's parsing and staging (one thread per core) and compaction's merges (one thread).
//!
//! Not tokio's blocking pool: that one starts a thread whenever none is idle and keeps it
//! for ten seconds, so under load such work spreads over 30 to 40 threads. The allocator
//! keeps a thread's freed pages until that thread allocates again, so each of those
//! threads kept what it had freed and then sat idle: a 1,000-client server held 200 to
//! 300 MiB that way in its parses, and each compaction job handed from one blocking thread
//! to the next left its builder's pages behind, 25 MiB a job (docs/benchmarks.md). A few
//! threads that do all of one kind of work reuse their own freed memory, and the
//! allocator can hand it back from the thread that freed it.
//!
//! The queue is first in, first out, and its tasks are whole parses, builds and merge
//! steps (milliseconds to seconds), so a channel behind a mutex serves it; a
//! work-stealing pool (rayon) is made for finer tasks and would be one more dependency
//! for nothing here. The threads run at background priority ([`crate::priority`]).

use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, PoisonError};

use thiserror::Error;

/// Why work handed to a pool did not answer.
#[derive(Debug, Error)]
pub enum WorkerError {
    #[error("the task panicked")]
    Panicked,
    #[error("the worker threads are gone")]
    Stopped,
}

type Task = Box<dyn FnOnce() + Send>;

/// A fixed set of threads serving one queue.
pub struct Pool {
    /// None when no thread could be started: every task then fails with `Stopped`.
    sender: Option<Sender<Task>>,
}

impl Pool {
    /// Starts `threads` threads named `{name}-{index}`; they end when the pool is dropped.
    pub fn start(name: &str, threads: usize) -> Pool {
        let (sender, receiver) = std::sync::mpsc::channel::<Task>();
        let receiver = Arc::new(Mutex::new(receiver));
        let mut started = 0;
        for index in 0..threads.max(1) {
            let receiver = receiver.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("{name}-{index}"))
                .spawn(move || {
                    crate::priority::background_thread();
                    loop {
                        // The guard is dropped at the end of this statement, before the
                        // task runs.
                        let task = receiver
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .recv();
                        match task {
                            Ok(task) => task(),
                            Err(_) => return,
                        }
                    }
                });
            match spawned {
                Ok(_) => started += 1,
                Err(err) => tracing::warn!(error = %err, name, "cannot start a worker thread"),
            }
        }
        Pool {
            sender: (started > 0).then_some(sender),
        }
    }

    /// Queues `work` at once; await the result when needed. A panic in `work` is caught
    /// and answered as [`WorkerError::Panicked`], and the thread serves on.
    pub fn spawn<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> impl std::future::Future<Output = Result<T, WorkerError>> {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let task: Task = Box::new(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
            let _ = sender.send(result);
        });
        let queued = match &self.sender {
            Some(queue) => queue.send(task).is_ok(),
            None => false,
        };
        async move {
            if !queued {
                return Err(WorkerError::Stopped);
            }
            match receiver.await {
                Ok(Ok(value)) => Ok(value),
                Ok(Err(_)) => Err(WorkerError::Panicked),
                Err(_) => Err(WorkerError::Stopped),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tasks_run_on_the_pools_threads_and_a_panic_is_an_error() {
        let pool = Pool::start("kiln-test", 2);
        let name = pool
            .spawn(|| std::thread::current().name().map(str::to_owned))
            .await
            .expect("the task runs");
        assert!(name.is_some_and(|name| name.starts_with("kiln-test-")));
        let panicked = pool.spawn(|| -> u32 { panic!("boom") }).await;
        assert!(matches!(panicked, Err(WorkerError::Panicked)));
        // The threads serve on after a panic.
        let pending: Vec<_> = (0..4u32).map(|i| pool.spawn(move || i * i)).collect();
        let mut results = Vec::new();
        for task in pending {
            results.push(task.await.expect("the task runs"));
        }
        assert_eq!(results, vec![0, 1, 4, 9]);
    }
}
