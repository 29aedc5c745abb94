//! The write-ahead log: a write is acknowledged once its profiles are in the log and the
//! log is on disk (`fdatasync`), not once they are in a registered segment. Segments are
//! then written per interval or per size ([`crate::writer`]), for many services at once,
//! and a query first asks for what is staged to be flushed (`Ingester::sync`), so every
//! acknowledged profile is still visible to the next read.
//!
//! Why: with many services at a low rate, every write was alone in its segment, and paid
//! a file, three `fsync`s (the segment, its directory, SQLite's log) and a metastore
//! transaction for one profile (docs/benchmarks.md, session 34). With the log such a
//! write pays one append and one `fdatasync`. Writes that arrive together share one
//! [`WalFile::sync_to`]: it syncs every byte appended so far, and the writes waiting
//! behind it find theirs on disk. The syncs run on a thread of their own, never on the
//! write path's threads: there, a sync held a core's parsing for the disk's round trip,
//! which is why only lone writes were logged at first, and under load the batches were
//! then group commits of a few profiles each (docs/benchmarks.md, "Every write logged").
//!
//! One log file per batch (`Generation`), named by the block id its segment will have:
//! `<block id>.wal` in the log directory. A record is one request, whole:
//! `[u32 length][u32 CRC-32 of the payload][payload]`, little-endian, the payload a
//! protobuf [`WalRecord`] (the tenant, and each profile as its pprof encoding plus what
//! parsing decided: id, time, series labels, profile types). Records are appended under
//! the staging lock that also takes the request's profiles into the batch, so a batch's
//! file holds exactly its requests. The file is deleted once its segment is registered.
//!
//! Recovery ([`Wal::leftovers`]): a file left in the directory is a batch whose segment
//! may not be registered. If the metastore knows a block of the file's name the segment
//! was registered and the file is deleted; otherwise its records are staged again and
//! written as a segment of that same block id, so recovering twice writes it once. A
//! record cut short by a crash, or whose CRC does not match, ends the file: it was never
//! acknowledged, since acknowledgement waits for its `fdatasync`.
//!
//! The log is used when the segments' store is a local directory and the metastore
//! SQLite, one process owning both: a log on one node's disk is no safer than that
//! node, and a cluster's ingesters write segments to shared object storage instead.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use kiln_metastore::WriteIdentity;
use kiln_model::labels::Labels;
use kiln_model::pprof::{self, ProfileLimits};
use kiln_model::ProfileType;
use kiln_storage::builder::TypePlan;
use prost::Message;

use crate::ParsedProfile;

/// A request as logged.
#[derive(Clone, PartialEq, Message)]
pub struct WalRecord {
    #[prost(string, tag = "1")]
    pub tenant: String,
    #[prost(message, repeated, tag = "2")]
    pub profiles: Vec<WalProfile>,
}

/// A parsed profile as logged: its pprof, and what parsing decided about it.
#[derive(Clone, PartialEq, Message)]
pub struct WalProfile {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(int64, tag = "2")]
    pub time_nanos: i64,
    #[prost(int64, tag = "3")]
    pub duration_nanos: i64,
    /// Series labels as name, value, name, value...
    #[prost(string, repeated, tag = "4")]
    pub labels: Vec<String>,
    #[prost(message, repeated, tag = "5")]
    pub types: Vec<WalType>,
    #[prost(bool, tag = "6")]
    pub sample_labels_per_sample: bool,
    #[prost(uint64, tag = "7")]
    pub received_bytes: u64,
    /// The profile as received, or the decoded profile encoded as pprof when it was
    /// converted from another format (gzip or plain).
    #[prost(bytes = "vec", tag = "8")]
    pub pprof: Vec<u8>,
    /// Its identity ([`crate::dedup`]), so a retry after a restart is known; empty when
    /// it was not deduplicated.
    #[prost(string, tag = "9")]
    pub identity: String,
    #[prost(int64, tag = "10")]
    pub identity_expires_at_ms: i64,
    #[prost(bool, tag = "11")]
    pub id_given: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct WalType {
    #[prost(uint32, tag = "1")]
    pub value_index: u32,
    /// The profile type's five parts, kept apart: a client's sample type may hold a colon.
    #[prost(string, repeated, tag = "2")]
    pub profile_type: Vec<String>,
    #[prost(double, optional, tag = "3")]
    pub scale: Option<f64>,
}

/// Errors reading a log file back.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    #[error("write-ahead log {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("write-ahead log {path}: record {record}: {message}")]
    Corrupt {
        path: PathBuf,
        record: usize,
        message: String,
    },
}

const HEADER: usize = 8;
/// Larger than any request the limits admit; a length beyond it is damage, not a record.
const MAX_RECORD: usize = 1 << 30;

/// The log directory.
#[derive(Debug, Clone)]
pub struct Wal {
    dir: PathBuf,
}

impl Wal {
    pub fn open(dir: impl Into<PathBuf>) -> io::Result<Wal> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        if let Some(parent) = dir.parent() {
            sync_dir(parent)?;
        }
        Ok(Wal { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A new, empty log file for the batch whose segment will be `block_id`. Its
    /// directory entry is on disk before it returns, so a record synced later is found.
    pub fn create(&self, block_id: &str) -> io::Result<WalFile> {
        let path = self.dir.join(format!("{block_id}.wal"));
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)?;
        sync_dir(&self.dir)?;
        Ok(WalFile {
            path,
            file,
            written: Mutex::new(0),
            synced: Mutex::new(0),
            broken: AtomicBool::new(false),
        })
    }

    /// Log files left by an earlier run, or by a failed flush, oldest first (block ids
    /// are ULIDs): each with the block id its segment is to have.
    pub fn leftovers(&self) -> io::Result<Vec<(String, PathBuf)>> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let block_id = match (path.file_stem(), path.extension()) {
                (Some(stem), Some(ext)) if ext == "wal" => stem.to_string_lossy().into_owned(),
                _ => continue,
            };
            found.push((block_id, path));
        }
        found.sort();
        Ok(found)
    }
}

/// One batch's log file. Appends are serialized; `fdatasync`s are shared: a writer whose
/// record an earlier sync covered does not sync again (group commit).
#[derive(Debug)]
pub struct WalFile {
    path: PathBuf,
    file: File,
    /// Bytes appended.
    written: Mutex<u64>,
    /// Bytes known on disk; held through each `fdatasync`.
    synced: Mutex<u64>,
    /// A failed append could not be cut back, or an `fdatasync` failed (after which
    /// Linux may have dropped the unsynced pages and a later sync would not say so):
    /// nothing more is appended to, or acknowledged from, this file.
    broken: AtomicBool,
}

impl WalFile {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one record ([`encode`]); returns the file's length after it, for
    /// [`WalFile::sync_to`].
    pub fn append(&self, record: &Record) -> io::Result<u64> {
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        self.usable()?;
        if let Err(err) = (&self.file).write_all(&record.0) {
            // A record cut short would end the file for recovery, and with it every
            // record appended after it: the file is cut back to its last whole record.
            if self.file.set_len(*written).is_err() {
                self.broken.store(true, Ordering::SeqCst);
            }
            return Err(err);
        }
        *written += record.0.len() as u64;
        Ok(*written)
    }

    fn usable(&self) -> io::Result<()> {
        match self.broken.load(Ordering::SeqCst) {
            true => Err(io::Error::other(
                "an earlier write or sync of this log file failed; its batch takes no more writes",
            )),
            false => Ok(()),
        }
    }

    /// Whether the first `end` bytes are on disk already, without waiting for a sync in
    /// progress.
    pub fn synced_through(&self, end: u64) -> bool {
        match self.synced.try_lock() {
            Ok(synced) => *synced >= end,
            Err(_) => false,
        }
    }

    /// Returns once the first `end` bytes are on disk.
    pub fn sync_to(&self, end: u64) -> io::Result<bool> {
        let mut synced = self.synced.lock().unwrap_or_else(PoisonError::into_inner);
        if *synced >= end {
            return Ok(false);
        }
        self.usable()?;
        let target = *self.written.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(err) = self.file.sync_data() {
            self.broken.store(true, Ordering::SeqCst);
            return Err(err);
        }
        *synced = target;
        Ok(true)
    }
}

/// A framed record, header and payload, ready to append.
pub struct Record(Vec<u8>);

/// Encodes a request's profiles as one framed record. Run before the staging lock is
/// taken. Fails only for a request beyond [`MAX_RECORD`], which no limit admits.
pub fn encode(tenant: &str, profiles: &[ParsedProfile]) -> io::Result<Record> {
    let message = WalRecord {
        tenant: tenant.to_string(),
        profiles: profiles
            .iter()
            .map(|parsed| WalProfile {
                id: parsed.id.clone(),
                time_nanos: parsed.time_nanos,
                duration_nanos: parsed.duration_nanos,
                labels: parsed
                    .labels
                    .iter()
                    .flat_map(|label| [label.name.clone(), label.value.clone()])
                    .collect(),
                types: parsed
                    .types
                    .iter()
                    .map(|plan| WalType {
                        value_index: plan.value_index as u32,
                        profile_type: {
                            let t = &plan.profile_type;
                            [
                                &t.name,
                                &t.sample_type,
                                &t.sample_unit,
                                &t.period_type,
                                &t.period_unit,
                            ]
                            .map(String::clone)
                            .to_vec()
                        },
                        scale: plan.scale,
                    })
                    .collect(),
                sample_labels_per_sample: parsed.sample_labels_per_sample,
                received_bytes: parsed.received_bytes as u64,
                pprof: match &parsed.source {
                    Some(source) => source.clone(),
                    None => parsed.profile.encode_to_vec(),
                },
                identity: parsed
                    .identity
                    .as_ref()
                    .map(|identity| identity.identity.clone())
                    .unwrap_or_default(),
                identity_expires_at_ms: parsed
                    .identity
                    .as_ref()
                    .map_or(0, |identity| identity.expires_at_ms),
                id_given: parsed.id_given,
            })
            .collect(),
    };
    let length = message.encoded_len();
    if length > MAX_RECORD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a request of {length} bytes is beyond the log's record limit"),
        ));
    }
    let mut frame = Vec::with_capacity(HEADER + length);
    frame.extend_from_slice(&(length as u32).to_le_bytes());
    frame.extend_from_slice(&[0; 4]);
    message
        .encode(&mut frame)
        .map_err(|err| io::Error::new(io::ErrorKind::InvalidInput, err.to_string()))?;
    let crc = crc32fast::hash(&frame[HEADER..]);
    frame[4..HEADER].copy_from_slice(&crc.to_le_bytes());
    Ok(Record(frame))
}

/// Reads a log file's records back as the requests they were: the tenant and its
/// profiles. Stops at a record cut short or damaged (never acknowledged).
pub fn read(path: &Path) -> Result<Vec<(String, Vec<ParsedProfile>)>, WalError> {
    let io = |source| WalError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut file| file.read_to_end(&mut bytes))
        .map_err(io)?;
    records(&bytes, path)
}

/// The identities of the profiles logged in a file ([`crate::dedup`]), read without
/// decoding the profiles: what a restart must know before it takes a write.
pub fn identities(path: &Path) -> Result<Vec<WriteIdentity>, WalError> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut file| file.read_to_end(&mut bytes))
        .map_err(|source| WalError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    let mut identities = Vec::new();
    for payload in payloads(&bytes) {
        let record = WalRecord::decode(payload).map_err(|err| WalError::Corrupt {
            path: path.to_path_buf(),
            record: identities.len(),
            message: err.to_string(),
        })?;
        identities.extend(
            record
                .profiles
                .into_iter()
                .filter(|logged| !logged.identity.is_empty())
                .map(|logged| WriteIdentity {
                    identity: logged.identity,
                    expires_at_ms: logged.identity_expires_at_ms,
                }),
        );
    }
    Ok(identities)
}

/// The payloads of a file's whole, undamaged records, up to the first that is not.
fn payloads(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = bytes;
    std::iter::from_fn(move || {
        if rest.len() < HEADER {
            return None;
        }
        let length = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        let payload = rest.get(HEADER..HEADER + length)?;
        if length > MAX_RECORD || crc32fast::hash(payload) != crc {
            return None;
        }
        rest = &rest[HEADER + length..];
        Some(payload)
    })
}

/// [`read`] of a file's bytes (`path` names it in errors).
pub fn records(bytes: &[u8], path: &Path) -> Result<Vec<(String, Vec<ParsedProfile>)>, WalError> {
    let mut requests = Vec::new();
    for payload in payloads(bytes) {
        let corrupt = |message: String| WalError::Corrupt {
            path: path.to_path_buf(),
            record: requests.len(),
            message,
        };
        let record = WalRecord::decode(payload).map_err(|err| corrupt(err.to_string()))?;
        let profiles = record
            .profiles
            .into_iter()
            .map(|logged| parsed(logged).map_err(&corrupt))
            .collect::<Result<Vec<_>, _>>()?;
        requests.push((record.tenant, profiles));
    }
    Ok(requests)
}

/// A logged profile as the writer stages it. Its checks passed when it was received; the
/// decoded form is validated again because staging indexes by its references.
fn parsed(logged: WalProfile) -> Result<ParsedProfile, String> {
    let profile = pprof::decode(&logged.pprof, MAX_RECORD).map_err(|err| err.to_string())?;
    let limits = ProfileLimits {
        max_samples: usize::MAX,
        ..ProfileLimits::default()
    };
    let index = pprof::validate(&profile, &limits).map_err(|err| err.to_string())?;
    if !logged.labels.len().is_multiple_of(2) {
        return Err("series labels are not name, value pairs".into());
    }
    let mut labels = Labels::new();
    for pair in logged.labels.chunks(2) {
        if let [name, value] = pair {
            labels.set(name.clone(), value.clone());
        }
    }
    if let Some(logged) = logged
        .types
        .iter()
        .find(|logged| logged.value_index as usize >= profile.sample_type.len())
    {
        return Err(format!(
            "profile type of value {} in a profile of {} sample types",
            logged.value_index,
            profile.sample_type.len()
        ));
    }
    let types = logged
        .types
        .into_iter()
        .map(|logged| match &logged.profile_type[..] {
            [name, sample_type, sample_unit, period_type, period_unit] => Ok(TypePlan {
                value_index: logged.value_index as usize,
                profile_type: ProfileType::new(
                    name,
                    sample_type,
                    sample_unit,
                    period_type,
                    period_unit,
                ),
                scale: logged.scale,
            }),
            parts => Err(format!("a profile type of {} parts", parts.len())),
        })
        .collect::<Result<Vec<_>, String>>()?;
    let identity = (!logged.identity.is_empty()).then_some(WriteIdentity {
        identity: logged.identity,
        expires_at_ms: logged.identity_expires_at_ms,
    });
    Ok(ParsedProfile {
        id: logged.id,
        id_given: logged.id_given,
        identity,
        time_nanos: logged.time_nanos,
        duration_nanos: logged.duration_nanos,
        labels,
        profile,
        index,
        types,
        received_bytes: usize::try_from(logged.received_bytes).unwrap_or(usize::MAX),
        sample_labels_per_sample: logged.sample_labels_per_sample,
        warnings: Vec::new(),
        cuts: Default::default(),
        source: None,
    })
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}
