//! Kiln's data model and the wire formats it reads and writes.
//!
//! Everything here is pure (no I/O, no async): the pprof protobuf messages, bounded
//! decompression, profile type ids, label sets and Prometheus-style selectors, and the
//! formats that are not pprof (collapsed stacks, speedscope, `perf script`, JFR), each
//! turned into a pprof by [`build::ProfileBuilder`]. Every parser here takes untrusted bytes, so each
//! one enforces limits and returns [`FormatError`] instead of panicking; each has a
//! `cargo fuzz` target under `fuzz/`.
//!
//! Threads, priorities and crash points are kiln-runtime's, so this crate does no I/O
//! and needs no async runtime. Two small things every layer shares live here too, so no crate reaches sideways for
//! them: Kiln's one wall clock ([`time::now_nanos`]) and the proto3 JSON mapping's serde
//! helpers ([`proto_json`]) used by the querier.v1 and OTLP messages.

pub mod build;
pub mod compress;
pub mod error;
pub mod folded;
pub mod jfr;
pub mod labels;
pub mod perf_script;
pub mod placement;
pub mod pprof;
pub mod pprof_json;
pub mod profile_type;
pub mod proto_json;
pub mod relabel;
pub mod selector;
pub mod size;
pub mod speedscope;
pub mod symbols;
pub mod time;

pub use error::{ErrorKind, FormatError};
pub use labels::{Label, Labels};
pub use profile_type::ProfileType;
