//! The one order a node's background work stops in, stage by stage: each stage is told
//! to stop and its tasks are awaited before the next is told.
//!
//! 1. [`Stage::Edge`]: stop accepting connections and finish the requests in flight.
//! 2. [`Stage::Collectors`]: the scrapers and the host agent, which write through the
//!    ingester as requests do.
//! 3. [`Stage::Writer`]: with the last ingester handle dropped, the flusher writes what
//!    is staged and stops, so every acknowledged write is in a segment (or its log).
//! 4. [`Stage::Compaction`]: after the writer, so the last segments need no merge to be
//!    read, and a merge is not cut by a write still landing.
//! 5. [`Stage::Rules`]: recording rules, their export and the regression watcher, which
//!    read what compaction and the writer left.
//! 6. [`Stage::Membership`]: last, the node leaves the `nodes` table once nothing of it is
//!    in flight, so no peer forwards to it while it still answers.
//!
//! Each stage is a [`CancellationToken`] and a [`TaskTracker`]. Components that take a
//! `watch::Receiver<bool>` to stop (they depend on tokio alone) get one bridged from
//! their stage's token ([`Stages::stop_signal`]).

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A stage of the shutdown, in its order (its discriminant is its index in [`ORDER`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Stage {
    Edge = 0,
    Collectors,
    Writer,
    Compaction,
    Rules,
    Membership,
}

const ORDER: [Stage; 6] = [
    Stage::Edge,
    Stage::Collectors,
    Stage::Writer,
    Stage::Compaction,
    Stage::Rules,
    Stage::Membership,
];

/// Every stage's token and tasks, by [`Stage`].
pub(crate) struct Stages {
    stages: [(CancellationToken, TaskTracker); ORDER.len()],
}

impl Stages {
    pub(crate) fn new() -> Self {
        Stages {
            stages: ORDER.map(|_| (CancellationToken::new(), TaskTracker::new())),
        }
    }

    fn get(&self, stage: Stage) -> &(CancellationToken, TaskTracker) {
        &self.stages[stage as usize]
    }

    /// The token cancelled when `stage` is told to stop.
    pub(crate) fn token(&self, stage: Stage) -> CancellationToken {
        self.get(stage).0.clone()
    }

    /// A stop signal for a component that takes a `watch::Receiver<bool>`: set when
    /// `stage` is told to stop.
    pub(crate) fn stop_signal(&self, stage: Stage) -> watch::Receiver<bool> {
        let (stop, stopped) = watch::channel(false);
        let token = self.token(stage);
        self.get(stage).1.spawn(async move {
            tokio::select! {
                () = token.cancelled() => {
                    let _ = stop.send(true);
                }
                // Every receiver gone: the component ended by itself.
                () = stop.closed() => {}
            }
        });
        stopped
    }

    /// Awaits `task` when `stage` stops.
    pub(crate) fn track(&self, stage: Stage, task: JoinHandle<()>) {
        self.get(stage).1.spawn(async move {
            let _ = task.await;
        });
    }

    /// Runs `stop` once `stage` is told to stop, and awaits it with the stage.
    pub(crate) fn on_stop<F>(&self, stage: Stage, stop: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let token = self.token(stage);
        self.get(stage).1.spawn(async move {
            token.cancelled().await;
            stop.await;
        });
    }

    /// Tells `stage` to stop and waits for its tasks.
    pub(crate) async fn stop(&self, stage: Stage) {
        let (token, tracker) = self.get(stage);
        token.cancel();
        tracker.close();
        tracker.wait().await;
    }
}

/// A node whose start failed part way drops its stages unstopped: whatever was started
/// is told to stop rather than left running.
impl Drop for Stages {
    fn drop(&mut self) {
        for (token, _) in &self.stages {
            token.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A stage's tasks have ended before the next stage is told to stop.
    #[tokio::test]
    async fn stages_stop_in_order_each_awaited() {
        let stages = Stages::new();
        let log = Arc::new(Mutex::new(Vec::new()));
        // An earlier stage's task takes longer to end than a later one's: were a stage
        // not awaited before the next is told, the later ones would log first.
        for (stage, millis) in [
            (Stage::Rules, 10),
            (Stage::Compaction, 80),
            (Stage::Collectors, 160),
        ] {
            let mut stopped = stages.stop_signal(stage);
            let log = log.clone();
            stages.track(
                stage,
                tokio::spawn(async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                    tokio::time::sleep(std::time::Duration::from_millis(millis)).await;
                    log.lock().unwrap().push(stage);
                }),
            );
        }
        for (index, stage) in ORDER.into_iter().enumerate() {
            assert_eq!(stage as usize, index, "{stage:?} indexes its own stage");
            stages.stop(stage).await;
        }
        assert_eq!(
            *log.lock().unwrap(),
            vec![Stage::Collectors, Stage::Compaction, Stage::Rules]
        );
    }

    /// Stages dropped unstopped (a start that failed) stop what they hold.
    #[tokio::test]
    async fn stages_dropped_unstopped_stop_their_work() {
        let stages = Stages::new();
        let mut stopped = stages.stop_signal(Stage::Compaction);
        drop(stages);
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            stopped.wait_for(|stop| *stop),
        )
        .await
        .expect("told to stop")
        .expect("the signal's sender is kept until it is sent");
    }
}
