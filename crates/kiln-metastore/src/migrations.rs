//! The schema, as versioned migrations applied at open by both backends.

use crate::sql::Dialect;

/// One step of the schema: the SQL both backends speak, or a statement for each where
/// they part (a SQLite table without rowid, PostgreSQL's bit casts).
pub(crate) enum Migration {
    Shared(&'static str),
    Split {
        sqlite: &'static str,
        postgres: &'static str,
    },
}

impl Migration {
    pub(crate) fn sql(&self, dialect: Dialect) -> &'static str {
        match (self, dialect) {
            (Migration::Shared(sql), _) => sql,
            (Migration::Split { sqlite, .. }, Dialect::Sqlite) => sqlite,
            (Migration::Split { postgres, .. }, Dialect::Postgres) => postgres,
        }
    }
}

/// Versioned schema migrations, applied by both backends; entry `i` brings the schema to
/// version `i + 1`. Written in the SQL both speak where they can: SQLite gives `BIGINT`
/// columns integer affinity (64-bit), PostgreSQL needs it for nanosecond times.
pub(crate) const MIGRATIONS: &[Migration] = &[
    // 1: blocks and the datasets inside them.
    Migration::Shared("CREATE TABLE blocks (
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
     CREATE INDEX datasets_by_time ON datasets (tenant, service, max_time_nanos, min_time_nanos);"),
    // 2: compaction and retention. A block whose datasets were all replaced or expired is
    // tombstoned (deleted_at_ms) and its object deleted after a grace period; leases let
    // several compactors share the work.
    Migration::Shared("ALTER TABLE blocks ADD COLUMN deleted_at_ms BIGINT;
     CREATE INDEX datasets_by_block ON datasets (block_id);
     CREATE TABLE compaction_leases (
        tenant TEXT NOT NULL,
        service TEXT NOT NULL,
        level INTEGER NOT NULL,
        owner TEXT NOT NULL,
        expires_at_ms BIGINT NOT NULL,
        PRIMARY KEY (tenant, service, level)
     );"),
    // 3: recording rules, their outbox per remote-write target, and backfilled ranges.
    Migration::Shared("CREATE TABLE recording_rules (
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
     );"),
    // 4: the regression watcher: each (service, type, version) compared once, and what
    // the comparison found.
    Migration::Shared("CREATE TABLE version_checks (
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
     CREATE INDEX regressions_by_time ON regressions (tenant, detected_at_ms);"),
    // 5: membership of a scaled-out deployment: each node's roles and address, kept
    // alive by its heartbeat. No consensus: a node is live while its lease is unexpired.
    Migration::Shared("CREATE TABLE nodes (
        id TEXT PRIMARY KEY,
        roles TEXT NOT NULL,
        address TEXT NOT NULL,
        started_at_ms BIGINT NOT NULL,
        heartbeat_at_ms BIGINT NOT NULL,
        lease_expires_at_ms BIGINT NOT NULL,
        left_at_ms BIGINT
     );"),
    // 6: the write path polls how far compaction is behind (`level_backlog`), and the
    // compactor lists a level's blocks, without scanning every block of the retention.
    Migration::Shared("CREATE INDEX blocks_by_level ON blocks (level, deleted_at_ms, created_at_ms);"),
    // 7: identities of acknowledged writes, so a retry within the dedup window is not
    // stored twice after a restart (kiln_ingest::dedup). Written in the transaction that
    // registers the segment holding the write.
    Migration::Shared("CREATE TABLE write_identities (
        identity TEXT PRIMARY KEY,
        expires_at_ms BIGINT NOT NULL
     );
     CREATE INDEX write_identities_by_expiry ON write_identities (expires_at_ms);"),
    // 8: a segment's profiles are counted by the recording rules in the transaction that
    // registers it (kiln_ingest's sink); level-0 compaction counts only the datasets of
    // segments registered without (before this version, or by a node without rules).
    Migration::Shared("ALTER TABLE datasets ADD COLUMN rules_counted INTEGER NOT NULL DEFAULT 0;"),
    // 9: write identities as two integers, keyed by expiry first: the dedup window's
    // identities were most of a settled metastore (issue 61), as 32 hex characters held
    // three times (row, primary key, expiry index). Now one b-tree holds each once in
    // about a third of that, and expiry deletes a range of it. An identity written again
    // is a second row; the later expiry is the one read. Existing identities are kept.
    Migration::Split {
        sqlite: "ALTER TABLE write_identities RENAME TO write_identities_hex;
         DROP INDEX write_identities_by_expiry;
         CREATE TABLE write_identities (
            expires_at_ms BIGINT NOT NULL,
            high BIGINT NOT NULL,
            low BIGINT NOT NULL,
            PRIMARY KEY (expires_at_ms, high, low)
         ) WITHOUT ROWID;
         INSERT OR IGNORE INTO write_identities (expires_at_ms, high, low)
            WITH RECURSIVE walk (identity, expires_at_ms, position, high, low) AS (
                SELECT lower(identity), expires_at_ms, 1, 0, 0 FROM write_identities_hex
                WHERE length(identity) = 32 AND lower(identity) NOT GLOB '*[^0-9a-f]*'
              UNION ALL
                SELECT identity, expires_at_ms, position + 1,
                    CASE WHEN position <= 16
                        THEN (high << 4) | (instr('0123456789abcdef', substr(identity, position, 1)) - 1)
                        ELSE high END,
                    CASE WHEN position > 16
                        THEN (low << 4) | (instr('0123456789abcdef', substr(identity, position, 1)) - 1)
                        ELSE low END
                FROM walk WHERE position <= 32
            )
            SELECT expires_at_ms, high, low FROM walk WHERE position = 33;
         DROP TABLE write_identities_hex;",
        postgres: "ALTER TABLE write_identities RENAME TO write_identities_hex;
         ALTER INDEX write_identities_pkey RENAME TO write_identities_hex_pkey;
         DROP INDEX write_identities_by_expiry;
         CREATE TABLE write_identities (
            expires_at_ms BIGINT NOT NULL,
            high BIGINT NOT NULL,
            low BIGINT NOT NULL,
            PRIMARY KEY (expires_at_ms, high, low)
         );
         INSERT INTO write_identities (expires_at_ms, high, low)
            SELECT expires_at_ms,
                ('x' || substr(lower(identity), 1, 16))::BIT(64)::BIGINT,
                ('x' || substr(lower(identity), 17, 16))::BIT(64)::BIGINT
            FROM write_identities_hex WHERE lower(identity) ~ '^[0-9a-f]{32}$'
            ON CONFLICT DO NOTHING;
         DROP TABLE write_identities_hex;",
    },
];
