//! The seam between the read path and a symbolizer: frames stored as (build id,
//! address) are named when read, by whatever implements [`NameFrames`]
//! (kiln-symbolize, from uploaded and debuginfod debug files). It lives here, below both,
//! so that neither depends on the other.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// One frame of an address: a function, its file and line (0 when unknown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub name: String,
    pub file: String,
    pub line: i64,
}

pub type Names<'a> = Pin<Box<dyn Future<Output = Option<Vec<Arc<[Frame]>>>> + Send + 'a>>;

pub trait NameFrames: Send + Sync {
    /// The frames at each of `addresses`, innermost (inlined) first as pprof lists them,
    /// of a process that mapped the text of binary `build_id` at `mapping` (start,
    /// limit); empty where the binary's debug file does not name an address. `None`
    /// when no debug file of that build id is held or found now: ask again after
    /// [`NameFrames::retry_after`].
    fn names<'a>(
        &'a self,
        tenant: &'a str,
        build_id: &'a str,
        mapping: (u64, u64),
        addresses: &'a [u64],
    ) -> Names<'a>;

    /// Changes whenever a debug file arrives: names found missing before may exist now.
    fn generation(&self) -> u64;

    /// How long a build id found nowhere is not looked for again.
    fn retry_after(&self) -> Duration;
}
