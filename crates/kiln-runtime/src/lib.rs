//! How Kiln's processes run their work, apart from what the work is: kiln-model stays
//! pure data and formats, and what touches threads, the scheduler or signals lives here.
//!
//! [`worker`] is a small pool of threads for CPU-bound work that must not starve the
//! async runtime or grow without bound; [`priority`] lowers background threads' nice
//! value and counts the CPU of the work done in a task; [`crash`] is the named crash
//! points the kill -9 tests use to stop a process at a chosen instant.

pub mod crash;
pub mod priority;
pub mod worker;
