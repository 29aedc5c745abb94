//! Idempotent writes: a retried upload is acknowledged and not stored again.
//!
//! An SDK whose upload timed out sends it again; the first copy may well have been
//! stored. Stored twice, the CPU of that minute doubles. So every profile a client writes
//! has an identity, and a second profile with an identity stored within the tenant's
//! `limits.dedup_window_ms` (an hour by default; 0 turns this off) is acknowledged 200 and
//! dropped.
//!
//! The identity is the first 128 bits of a SHA-256 over the tenant, the series labels, the
//! profile types, the time range and the SHA-256 of the decoded profile (its canonical
//! pprof encoding, so a retry sent gzip-compressed where the first was not, or by another
//! encoder, is still the same profile). Two different profiles with the same labels and
//! time differ in that digest and are both stored. A request with an `Idempotency-Key`
//! header is identified by the key instead (with the tenant and the profile's place in
//! the request): the client then says what a retry is, whatever its bytes.
//!
//! A profile's id, when the client gave none, is derived from its identity (a UUIDv7 of
//! the profile's time, random bits from the identity), so the retry of a profefe upload
//! answers the id of the first copy without storing a map from identities to ids.
//!
//! The table ([`Dedup`]) is in memory, bounded ([`MAX_ENTRIES`], oldest dropped first).
//! An identity is *pending* from the moment its profile is staged until the batch holding
//! it is durable: a duplicate arriving meanwhile is not staged, and waits for the first
//! copy's outcome. Should that copy fail, the duplicate fails too with a 503 and the
//! client retries: it is never acknowledged on the strength of a copy that was lost. The
//! outcome is the batch's, not the first request's: a client that gave up waiting does
//! not take its identity with it.
//!
//! Across restarts the identities come back from where the profiles are: the metastore
//! registers a segment's identities in the transaction that registers the segment
//! (`write_identities`), and the write-ahead log keeps each profile's identity with it, so
//! a write acknowledged from the log and a retry after a `kill -9` meet again. The table
//! is filled from both before the first write is taken ([`Dedup::ready`]). The table is
//! per node: with placement on, a service's writes, and so its retries, go to one owner.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use kiln_metastore::WriteIdentity;
use kiln_model::pprof::Profile;
use prost::Message;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::ParsedProfile;

/// The identities the table holds at most, the oldest dropped first: about 80 MB. At a
/// thousand writes a second that is the last quarter of an hour, longer than any SDK's
/// retries.
pub const MAX_ENTRIES: usize = 1 << 20;

/// An identity: the first half of its SHA-256.
pub type Key = [u8; 16];

/// How a request asks to be deduplicated.
#[derive(Debug, Clone, Default)]
pub struct Idempotence {
    /// The tenant's `dedup_window_ms`; 0 stores every copy.
    pub window_ms: u64,
    /// The request's `Idempotency-Key` header.
    pub key: Option<String>,
}

/// A profile's outcome as its duplicates wait for it: `Some(true)` once durable,
/// `Some(false)` when its batch failed; a sender dropped unresolved means the profile
/// was never staged.
type Outcome = watch::Receiver<Option<bool>>;

/// Resolves the outcome of the profiles one request staged. Shared by the request and the
/// batch it joined: the first to know decides, and a durable profile stays durable.
#[derive(Debug, Clone)]
pub struct Resolver(Arc<watch::Sender<Option<bool>>>);

impl Resolver {
    pub fn resolve(&self, durable: bool) {
        self.0.send_if_modified(|outcome| match outcome {
            None => {
                *outcome = Some(durable);
                true
            }
            Some(_) => false,
        });
    }
}

enum State {
    Stored,
    Pending(Outcome),
}

struct Entry {
    expires_at_ms: i64,
    state: State,
}

#[derive(Default)]
struct Table {
    entries: HashMap<Key, Entry>,
    /// Keys in the order they were added, with the expiry they had, for expiring and
    /// evicting the oldest.
    order: VecDeque<(i64, Key)>,
}

impl Table {
    fn insert(&mut self, key: Key, expires_at_ms: i64, state: State) {
        self.entries.insert(
            key,
            Entry {
                expires_at_ms,
                state,
            },
        );
        self.order.push_back((expires_at_ms, key));
        while self.entries.len() > MAX_ENTRIES {
            let Some((_, oldest)) = self.order.pop_front() else {
                break;
            };
            self.entries.remove(&oldest);
        }
    }

    /// Drops entries expired by `now_ms` from the front of the order. Windows differ by
    /// tenant, so an expired entry behind a live one waits for it; lookups check expiry.
    fn expire(&mut self, now_ms: i64) {
        while let Some(&(expires_at_ms, key)) = self.order.front() {
            if expires_at_ms >= now_ms {
                break;
            }
            self.order.pop_front();
            if self
                .entries
                .get(&key)
                .is_some_and(|entry| entry.expires_at_ms <= expires_at_ms)
            {
                self.entries.remove(&key);
            }
        }
    }
}

/// The identities of recent writes, stored and pending. See the module doc.
pub struct Dedup {
    table: Mutex<Table>,
    ready: watch::Sender<bool>,
}

impl Default for Dedup {
    fn default() -> Self {
        Dedup {
            table: Mutex::default(),
            ready: watch::channel(false).0,
        }
    }
}

/// What [`Dedup::claim`] decided about a request's profiles.
pub struct Claim {
    /// The profiles to store: those whose identity was not seen.
    pub kept: Vec<ParsedProfile>,
    /// Every profile's id, in the request's order, duplicates included.
    pub ids: Vec<String>,
    /// Profiles dropped as copies of stored or pending ones.
    pub duplicates: usize,
    /// Resolves the kept profiles' outcome; `None` when nothing is deduplicated.
    pub resolver: Option<Resolver>,
    /// Outcomes of earlier copies still pending, to wait for before answering.
    pub waits: Vec<Outcome>,
}

impl Dedup {
    /// Adds identities of stored writes (from the metastore and the write-ahead log).
    pub fn remember(&self, identities: impl IntoIterator<Item = WriteIdentity>, now_ms: i64) {
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let mut remembered: Vec<(Key, i64)> = identities
            .into_iter()
            .filter(|identity| identity.expires_at_ms >= now_ms)
            .filter_map(|identity| Some((parse_key(&identity.identity)?, identity.expires_at_ms)))
            .collect();
        remembered.sort_by_key(|(_, expires_at_ms)| *expires_at_ms);
        for (key, expires_at_ms) in remembered {
            table.insert(key, expires_at_ms, State::Stored);
        }
    }

    /// Lets writes through: the table holds what was stored before this start.
    pub fn open(&self) {
        self.ready.send_replace(true);
    }

    /// Waits until [`Dedup::open`].
    pub async fn ready(&self) {
        let mut ready = self.ready.subscribe();
        let _ = ready.wait_for(|ready| *ready).await;
    }

    /// Identifies a request's profiles, drops the copies of stored or pending ones, and
    /// marks the rest pending. CPU work (a SHA-256 of each profile), on the write path's
    /// threads.
    pub fn claim(
        &self,
        tenant: &str,
        mut profiles: Vec<ParsedProfile>,
        idempotence: &Idempotence,
        now_ms: i64,
    ) -> Claim {
        if idempotence.window_ms == 0 {
            let ids = profiles.iter().map(|profile| profile.id.clone()).collect();
            return Claim {
                kept: profiles,
                ids,
                duplicates: 0,
                resolver: None,
                waits: Vec::new(),
            };
        }
        let expires_at_ms =
            now_ms.saturating_add(i64::try_from(idempotence.window_ms).unwrap_or(i64::MAX));
        let keys: Vec<Key> = profiles
            .iter()
            .enumerate()
            .map(|(index, profile)| match &idempotence.key {
                Some(key) => keyed_identity(tenant, key, index),
                None => identity(tenant, profile, &profile_digest(&profile.profile)),
            })
            .collect();
        for (profile, key) in profiles.iter_mut().zip(&keys) {
            if !profile.id_given {
                profile.id = derived_id(profile.time_nanos, key);
            }
        }
        let ids = profiles.iter().map(|profile| profile.id.clone()).collect();
        let (sender, own) = watch::channel(None);
        let mut kept = Vec::with_capacity(profiles.len());
        let mut waits: Vec<Outcome> = Vec::new();
        let mut duplicates = 0;
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        table.expire(now_ms);
        for (mut profile, key) in profiles.into_iter().zip(keys) {
            let seen = match table.entries.get_mut(&key) {
                Some(entry) if entry.expires_at_ms >= now_ms => match &entry.state {
                    State::Stored => true,
                    State::Pending(outcome) if outcome.same_channel(&own) => true,
                    State::Pending(outcome) => {
                        let resolved = *outcome.borrow();
                        match resolved {
                            Some(true) => {
                                entry.state = State::Stored;
                                true
                            }
                            Some(false) => false,
                            // Still on its way, unless its request dropped it unstaged.
                            None if outcome.has_changed().is_err() => false,
                            None => {
                                waits.push(outcome.clone());
                                true
                            }
                        }
                    }
                },
                _ => false,
            };
            if seen {
                duplicates += 1;
                continue;
            }
            table.insert(key, expires_at_ms, State::Pending(own.clone()));
            profile.identity = Some(WriteIdentity {
                identity: hex(&key),
                expires_at_ms,
            });
            kept.push(profile);
        }
        drop(table);
        Claim {
            kept,
            ids,
            duplicates,
            resolver: Some(Resolver(Arc::new(sender))),
            waits,
        }
    }
}

/// Waits for earlier copies a request's duplicates stood for; false if one was lost.
pub async fn earlier_copies_stored(waits: Vec<Outcome>) -> bool {
    for mut outcome in waits {
        match outcome.wait_for(Option::is_some).await {
            Ok(durable) if *durable == Some(true) => {}
            _ => return false,
        }
    }
    true
}

/// The identity of a profile as received (see the module doc).
pub fn identity(tenant: &str, parsed: &ParsedProfile, digest: &[u8; 32]) -> Key {
    let mut hasher = Sha256::new();
    hasher.update(b"kiln write identity 1\0");
    field(&mut hasher, tenant.as_bytes());
    for label in parsed.labels.iter() {
        field(&mut hasher, label.name.as_bytes());
        field(&mut hasher, label.value.as_bytes());
    }
    hasher.update([0xff]);
    for plan in &parsed.types {
        field(&mut hasher, plan.profile_type.to_string().as_bytes());
    }
    hasher.update(parsed.time_nanos.to_le_bytes());
    hasher.update(parsed.duration_nanos.to_le_bytes());
    hasher.update(digest);
    first_half(hasher.finalize().into())
}

/// The identity of the `index`th profile of a request sent with an `Idempotency-Key`.
pub fn keyed_identity(tenant: &str, key: &str, index: usize) -> Key {
    let mut hasher = Sha256::new();
    hasher.update(b"kiln idempotency key 1\0");
    field(&mut hasher, tenant.as_bytes());
    field(&mut hasher, key.as_bytes());
    hasher.update((index as u64).to_le_bytes());
    first_half(hasher.finalize().into())
}

/// A length before each variable field, so no two field lists hash alike.
fn field(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
}

fn first_half(digest: [u8; 32]) -> Key {
    let mut key = [0; 16];
    key.copy_from_slice(&digest[..16]);
    key
}

/// SHA-256 of the profile's pprof encoding, streamed into the hash as it is encoded.
pub fn profile_digest(profile: &Profile) -> [u8; 32] {
    let mut sink = HashSink::default();
    profile.encode_raw(&mut sink);
    sink.finish()
}

/// A UUIDv7 of the profile's time whose random bits are the identity's.
pub fn derived_id(time_nanos: i64, key: &Key) -> String {
    let millis = u64::try_from(time_nanos.div_euclid(1_000_000)).unwrap_or(0);
    let mut random = [0; 10];
    random.copy_from_slice(&key[..10]);
    uuid::Builder::from_unix_timestamp_millis(millis, &random)
        .into_uuid()
        .to_string()
}

pub fn hex(key: &Key) -> String {
    key.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn parse_key(text: &str) -> Option<Key> {
    if text.len() != 32 {
        return None;
    }
    let mut key = [0; 16];
    for (index, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(index * 2..index * 2 + 2)?, 16).ok()?;
    }
    Some(key)
}

/// A `BufMut` that hashes what is written into it, through a fixed buffer: the profile's
/// encoding is never held whole.
struct HashSink {
    hasher: Sha256,
    buffer: Vec<u8>,
    filled: usize,
}

const SINK_BYTES: usize = 64 << 10;

impl Default for HashSink {
    fn default() -> Self {
        HashSink {
            hasher: Sha256::new(),
            buffer: vec![0; SINK_BYTES],
            filled: 0,
        }
    }
}

impl HashSink {
    fn drain(&mut self) {
        self.hasher.update(&self.buffer[..self.filled]);
        self.filled = 0;
    }

    fn finish(mut self) -> [u8; 32] {
        self.drain();
        self.hasher.finalize().into()
    }
}

// SAFETY: `chunk_mut` hands out the initialised, unfilled part of `buffer`, and
// `advance_mut` only moves `filled` within it.
unsafe impl bytes::BufMut for HashSink {
    fn remaining_mut(&self) -> usize {
        usize::MAX
    }

    unsafe fn advance_mut(&mut self, count: usize) {
        self.filled = (self.filled + count).min(SINK_BYTES);
        if self.filled == SINK_BYTES {
            self.drain();
        }
    }

    fn chunk_mut(&mut self) -> &mut bytes::buf::UninitSlice {
        if self.filled == SINK_BYTES {
            self.drain();
        }
        bytes::buf::UninitSlice::new(&mut self.buffer[self.filled..])
    }

    // prost writes a varint a byte at a time: the default, through `put_slice`, made
    // the digest cost as much as building the dataset (`kiln bench stages`, session 40).
    fn put_u8(&mut self, byte: u8) {
        if self.filled == SINK_BYTES {
            self.drain();
        }
        self.buffer[self.filled] = byte;
        self.filled += 1;
    }

    fn put_slice(&mut self, mut src: &[u8]) {
        while !src.is_empty() {
            let room = SINK_BYTES - self.filled;
            if src.len() >= room && self.filled == 0 {
                // Large slices (strings, packed values) go to the hash directly.
                self.hasher.update(src);
                return;
            }
            let take = room.min(src.len());
            self.buffer[self.filled..self.filled + take].copy_from_slice(&src[..take]);
            self.filled += take;
            src = &src[take..];
            if self.filled == SINK_BYTES {
                self.drain();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_that_of_the_encoding() {
        let mut profile = Profile::default();
        for index in 0..20_000 {
            profile
                .string_table
                .push(format!("function number {index}").as_bytes());
        }
        let encoded = profile.encode_to_vec();
        assert!(encoded.len() > 3 * SINK_BYTES);
        let expected: [u8; 32] = Sha256::digest(&encoded).into();
        assert_eq!(profile_digest(&profile), expected);
    }

    #[test]
    fn keys_round_trip_as_hex_and_ids_carry_the_time() {
        let key = keyed_identity("t", "retry-1", 0);
        assert_eq!(parse_key(&hex(&key)), Some(key));
        assert_ne!(key, keyed_identity("t", "retry-1", 1));
        assert_ne!(key, keyed_identity("u", "retry-1", 0));
        let id = derived_id(1_700_000_000_123_000_000, &key);
        assert_eq!(id, derived_id(1_700_000_000_123_000_000, &key));
        let uuid = uuid::Uuid::parse_str(&id).unwrap();
        assert_eq!(uuid.get_version_num(), 7);
        let (seconds, nanos) = uuid.get_timestamp().unwrap().to_unix();
        assert_eq!((seconds, nanos), (1_700_000_000, 123_000_000));
    }
}
