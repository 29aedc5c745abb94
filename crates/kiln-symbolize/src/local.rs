//! The node's disk copies of debug files, least recently used first out past
//! `cache_bytes`. blazesym reads files by path (it maps them), so a debug file held in
//! the object store is copied here before it is read; the object store keeps every file,
//! so a copy dropped here costs a download, never a name.
//!
//! The directory is emptied at start: what it held is in the object store, and starting
//! empty means no file half-written by a crash is ever read.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub(crate) struct LocalFiles {
    dir: PathBuf,
    capacity: u64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// File name → (bytes, last use).
    files: HashMap<String, (u64, u64)>,
    total: u64,
    clock: u64,
    /// Names of temporary files handed out.
    temporary: u64,
}

impl LocalFiles {
    pub(crate) fn open(dir: PathBuf, capacity: u64) -> std::io::Result<LocalFiles> {
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(err),
        }
        std::fs::create_dir_all(&dir)?;
        Ok(LocalFiles {
            dir,
            capacity,
            state: Mutex::default(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The path of `name` when it is here, marked used.
    pub(crate) fn get(&self, name: &str) -> Option<PathBuf> {
        let mut state = self.state();
        state.clock += 1;
        let clock = state.clock;
        let entry = state.files.get_mut(name)?;
        entry.1 = clock;
        Some(self.dir.join(name))
    }

    /// A path for a file on its way in (a download, an upload), in the same directory so
    /// that [`LocalFiles::insert`] is a rename.
    pub(crate) fn temporary(&self) -> PathBuf {
        let mut state = self.state();
        state.temporary += 1;
        self.dir.join(format!(
            ".incoming-{}-{}",
            std::process::id(),
            state.temporary
        ))
    }

    /// Moves the file at `from` in as `name`, and returns the paths evicted to make room
    /// (their files are deleted; the resolver should forget them).
    pub(crate) fn insert(&self, name: &str, from: &Path) -> std::io::Result<Vec<PathBuf>> {
        let bytes = std::fs::metadata(from)?.len();
        let to = self.dir.join(name);
        std::fs::rename(from, &to)?;
        let mut state = self.state();
        state.clock += 1;
        let clock = state.clock;
        if let Some((old, _)) = state.files.insert(name.to_string(), (bytes, clock)) {
            state.total -= old;
        }
        state.total += bytes;
        let mut evicted = Vec::new();
        while state.total > self.capacity {
            let oldest = state
                .files
                .iter()
                .filter(|(other, _)| other.as_str() != name)
                .min_by_key(|(_, (_, used))| *used)
                .map(|(other, _)| other.clone());
            let Some(oldest) = oldest else { break };
            if let Some((bytes, _)) = state.files.remove(&oldest) {
                state.total -= bytes;
            }
            let path = self.dir.join(&oldest);
            if let Err(err) = std::fs::remove_file(&path) {
                tracing::warn!(error = %err, path = %path.display(), "removing a cached debug file");
            }
            evicted.push(path);
        }
        Ok(evicted)
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.state().total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_leave_first_never_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let files = LocalFiles::open(dir.path().join("cache"), 250).unwrap();
        let put = |name: &str, bytes: usize| {
            let from = files.temporary();
            std::fs::write(&from, vec![0u8; bytes]).unwrap();
            files.insert(name, &from).unwrap()
        };
        assert!(put("a", 100).is_empty());
        assert!(put("b", 100).is_empty());
        assert!(files.get("a").is_some()); // b is now the older
        let evicted = put("c", 100);
        assert_eq!(evicted.len(), 1);
        assert!(evicted[0].ends_with("b"));
        assert!(files.get("b").is_none());
        assert!(files.get("a").is_some() && files.get("c").is_some());
        assert_eq!(files.bytes(), 200);
        // One file larger than everything stays: it is being read right now.
        let evicted = put("huge", 1000);
        assert_eq!(evicted.len(), 2);
        assert!(files.get("huge").is_some());
        // A new start begins empty.
        drop(files);
        let files = LocalFiles::open(dir.path().join("cache"), 250).unwrap();
        assert!(files.get("huge").is_none());
        assert_eq!(
            std::fs::read_dir(dir.path().join("cache")).unwrap().count(),
            0
        );
    }
}
