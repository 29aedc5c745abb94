//! The schema, as versioned migrations applied at open by both backends.

/// Versioned schema migrations, shared by both backends; entry `i` brings the schema to
/// version `i + 1`. Written in the SQL both speak: SQLite gives `BIGINT` columns integer
/// affinity (64-bit), PostgreSQL needs it for nanosecond times.
pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: blocks and the datasets inside them.
    "CREATE TABLE blocks (
        id TEXT PRIMARY KEY,
        object_key TEXT NOT NULL,
        level INTEGER NOT NULL,
        size_bytes BIGINT NOT NULL,
        created_at_ms BIGINT NOT NULL
     );
     CREATE TABLE datasets (
        block_id TEXT NOT NULL REFERENCES blocks(id) ON DELETE CASCADE,
        tenant TEXT NOT NULL,
        service TEXT NOT NULL,
        row_group INTEGER NOT NULL,
        min_time_nanos BIGINT NOT NULL,
        max_time_nanos BIGINT NOT NULL,
        profile_types TEXT NOT NULL,
        profile_count BIGINT NOT NULL,
        PRIMARY KEY (block_id, row_group)
     );
     CREATE INDEX datasets_by_time ON datasets (tenant, service, max_time_nanos, min_time_nanos);",
    // 2: compaction and retention. A block whose datasets were all replaced or expired is
    // tombstoned (deleted_at_ms) and its object deleted after a grace period; leases let
    // several compactors share the work.
    "ALTER TABLE blocks ADD COLUMN deleted_at_ms BIGINT;
     CREATE INDEX datasets_by_block ON datasets (block_id);
     CREATE TABLE compaction_leases (
        tenant TEXT NOT NULL,
        service TEXT NOT NULL,
        level INTEGER NOT NULL,
        owner TEXT NOT NULL,
        expires_at_ms BIGINT NOT NULL,
        PRIMARY KEY (tenant, service, level)
     );",
    // 3: recording rules, their outbox per remote-write target, and backfilled ranges.
    "CREATE TABLE recording_rules (
        tenant TEXT NOT NULL,
        name TEXT NOT NULL,
        spec TEXT NOT NULL,
        source TEXT NOT NULL,
        live_from_ms BIGINT NOT NULL,
        updated_at_ms BIGINT NOT NULL,
        PRIMARY KEY (tenant, name)
     );
     CREATE TABLE rule_samples (
        target TEXT NOT NULL,
        tenant TEXT NOT NULL,
        rule TEXT NOT NULL,
        series TEXT NOT NULL,
        ts_ms BIGINT NOT NULL,
        value BIGINT NOT NULL,
        state INTEGER NOT NULL,
        PRIMARY KEY (target, tenant, rule, series, ts_ms)
     );
     CREATE INDEX rule_samples_by_state ON rule_samples (target, state, ts_ms);
     CREATE TABLE rule_backfills (
        tenant TEXT NOT NULL,
        rule TEXT NOT NULL,
        from_ms BIGINT NOT NULL,
        until_ms BIGINT NOT NULL,
        done_at_ms BIGINT NOT NULL,
        PRIMARY KEY (tenant, rule, from_ms)
     );",
    // 4: the regression watcher: each (service, type, version) compared once, and what
    // the comparison found.
    "CREATE TABLE version_checks (
        tenant TEXT NOT NULL,
        service TEXT NOT NULL,
        profile_type TEXT NOT NULL,
        version_label TEXT NOT NULL,
        new_version TEXT NOT NULL,
        old_version TEXT NOT NULL,
        checked_at_ms BIGINT NOT NULL,
        outcome TEXT NOT NULL,
        PRIMARY KEY (tenant, service, profile_type, version_label, new_version)
     );
     CREATE TABLE regressions (
        tenant TEXT NOT NULL,
        service TEXT NOT NULL,
        profile_type TEXT NOT NULL,
        version_label TEXT NOT NULL,
        new_version TEXT NOT NULL,
        function TEXT NOT NULL,
        detected_at_ms BIGINT NOT NULL,
        finding TEXT NOT NULL,
        PRIMARY KEY (tenant, service, profile_type, version_label, new_version, function)
     );
     CREATE INDEX regressions_by_time ON regressions (tenant, detected_at_ms);",
    // 5: membership of a scaled-out deployment: each node's roles and address, kept
    // alive by its heartbeat. No consensus: a node is live while its lease is unexpired.
    "CREATE TABLE nodes (
        id TEXT PRIMARY KEY,
        roles TEXT NOT NULL,
        address TEXT NOT NULL,
        started_at_ms BIGINT NOT NULL,
        heartbeat_at_ms BIGINT NOT NULL,
        lease_expires_at_ms BIGINT NOT NULL,
        left_at_ms BIGINT
     );",
    // 6: the write path polls how far compaction is behind (`level_backlog`), and the
    // compactor lists a level's blocks, without scanning every block of the retention.
    "CREATE INDEX blocks_by_level ON blocks (level, deleted_at_ms, created_at_ms);",
    // 7: identities of acknowledged writes, so a retry within the dedup window is not
    // stored twice after a restart (kiln_ingest::dedup). Written in the transaction that
    // registers the segment holding the write.
    "CREATE TABLE write_identities (
        identity TEXT PRIMARY KEY,
        expires_at_ms BIGINT NOT NULL
     );
     CREATE INDEX write_identities_by_expiry ON write_identities (expires_at_ms);",
    // 8: a segment's profiles are counted by the recording rules in the transaction that
    // registers it (kiln_ingest's sink); level-0 compaction counts only the datasets of
    // segments registered without (before this version, or by a node without rules).
    "ALTER TABLE datasets ADD COLUMN rules_counted INTEGER NOT NULL DEFAULT 0;",
];
