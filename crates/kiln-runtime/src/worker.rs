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
//! steps (milliseconds to seconds), so a deque behind a mutex serves it; a work-stealing
//! pool (rayon) is made for finer tasks and would be one more dependency for nothing
//! here. Idle threads wait on a condition variable, and a new task wakes one of them. A
//! channel's receiver behind a mutex, as before, woke two: the one waiting in the
//! receiver, then, as it let the mutex go, the one waiting for the mutex, only for that
//! one to wait again (docs/benchmarks.md counts the futex calls). The threads run at
//! background priority ([`crate::priority`]).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, PoisonError};

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

/// The tasks waiting for a thread, and whether the pool is gone.
#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

#[derive(Default)]
struct QueueState {
    tasks: VecDeque<Task>,
    closed: bool,
}

impl Queue {
    /// The next task, waiting for one; `None` once the pool is dropped and every task
    /// queued before has run.
    fn next(&self) -> Option<Task> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(task) = state.tasks.pop_front() {
                return Some(task);
            }
            if state.closed {
                return None;
            }
            state = self
                .ready
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// A fixed set of threads serving one queue.
pub struct Pool {
    /// None when no thread could be started: every task then fails with `Stopped`.
    queue: Option<Arc<Queue>>,
}

impl Pool {
    /// Starts `threads` threads named `{name}-{index}`; they end when the pool is dropped.
    pub fn start(name: &str, threads: usize) -> Pool {
        let queue = Arc::new(Queue::default());
        let mut started = 0;
        for index in 0..threads.max(1) {
            let queue = queue.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("{name}-{index}"))
                .spawn(move || {
                    crate::priority::background_thread();
                    while let Some(task) = queue.next() {
                        task();
                    }
                });
            match spawned {
                Ok(_) => started += 1,
                Err(err) => tracing::warn!(error = %err, name, "cannot start a worker thread"),
            }
        }
        Pool {
            queue: (started > 0).then_some(queue),
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
        let queued = match &self.queue {
            Some(queue) => {
                let mut state = queue.state.lock().unwrap_or_else(PoisonError::into_inner);
                state.tasks.push_back(task);
                drop(state);
                queue.ready.notify_one();
                true
            }
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

impl Drop for Pool {
    /// The threads end once they have run what is queued.
    fn drop(&mut self) {
        if let Some(queue) = &self.queue {
            queue
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .closed = true;
            queue.ready.notify_all();
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

    #[tokio::test]
    async fn tasks_queued_before_the_pool_is_dropped_still_run() {
        let pool = Pool::start("kiln-test-drop", 2);
        let pending: Vec<_> = (0..6u64)
            .map(|i| {
                pool.spawn(move || {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    i
                })
            })
            .collect();
        drop(pool);
        let mut results = Vec::new();
        for task in pending {
            results.push(task.await.expect("a queued task runs"));
        }
        assert_eq!(results, vec![0, 1, 2, 3, 4, 5]);
    }
}
