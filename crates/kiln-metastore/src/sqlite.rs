//! The embedded SQLite backend: WAL mode with `synchronous=FULL`, so a committed
//! registration survives power loss, the WAL kept to about a megabyte, the pages commits
//! free given back (so a settled file is the size of what it holds), and one connection
//! behind a mutex (SQLite serialises writers anyway; reads are short index lookups). Work
//! runs on a blocking thread, charged to the role that asked for it, and never on the
//! runtime's own threads: a commit waits for an fsync.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{params, Connection};

use crate::migrations::MIGRATIONS;
use crate::now_ms;
use crate::sql::{Arg, Cell, Dialect, Row, Sql};
use crate::MetastoreError;

/// Pages of WAL written before a checkpoint copies them into the database (SQLite's
/// default is 1,000: 4 MB).
const WAL_CHECKPOINT_PAGES: i64 = 256;
/// Bytes a WAL file keeps once a checkpoint has emptied it.
const WAL_SIZE_LIMIT: i64 = 1 << 20;

#[derive(Clone)]
pub(crate) struct SqliteMetastore {
    connection: Arc<Mutex<Connection>>,
}

impl std::fmt::Debug for SqliteMetastore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SqliteMetastore")
    }
}

fn migrate(connection: &mut Connection) -> Result<(), MetastoreError> {
    connection.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at_ms INTEGER NOT NULL);",
    )?;
    let current: i64 = connection.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
        [],
        |row| row.get(0),
    )?;
    for (index, migration) in MIGRATIONS.iter().enumerate() {
        let version = index as i64 + 1;
        if version <= current {
            continue;
        }
        let transaction = connection.transaction()?;
        transaction.execute_batch(migration.sql(Dialect::Sqlite))?;
        transaction.execute(
            "INSERT INTO schema_migrations (version, applied_at_ms) VALUES (?1, ?2)",
            params![version, now_ms()],
        )?;
        transaction.commit()?;
        tracing::info!(version, "applied metastore migration");
    }
    Ok(())
}

impl SqliteMetastore {
    pub(crate) async fn open(path: &str) -> Result<Self, MetastoreError> {
        let path = path.to_string();
        let connection =
            tokio::task::spawn_blocking(move || -> Result<Connection, MetastoreError> {
                if let Some(parent) = Path::new(&path).parent() {
                    if !parent.as_os_str().is_empty() {
                        std::fs::create_dir_all(parent)?;
                    }
                }
                let mut connection = Connection::open(&path)?;
                connection.busy_timeout(std::time::Duration::from_secs(10))?;
                // First: a new file takes its vacuum mode from its first write.
                incremental_vacuum(&connection)?;
                connection.pragma_update(None, "journal_mode", "WAL")?;
                connection.pragma_update(None, "synchronous", "FULL")?;
                connection.pragma_update(None, "foreign_keys", "ON")?;
                // The WAL is checkpointed every WAL_CHECKPOINT_PAGES and, once reset, cut
                // back to WAL_SIZE_LIMIT: SQLite keeps a WAL file at its largest size
                // otherwise, and a node's 4 MB of WAL was a fifth of a day of compacted
                // data (issue 61).
                connection.pragma_update(None, "wal_autocheckpoint", WAL_CHECKPOINT_PAGES)?;
                connection.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)?;
                // Room for every statement the metastore runs (rusqlite keeps 16).
                connection.set_prepared_statement_cache_capacity(64);
                migrate(&mut connection)?;
                Ok(connection)
            })
            .await
            .map_err(MetastoreError::Task)??;
        Ok(SqliteMetastore {
            connection: Arc::new(Mutex::new(connection)),
        })
    }

    async fn with<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection) -> Result<T, MetastoreError> + Send + 'static,
    ) -> Result<T, MetastoreError> {
        let connection = self.connection.clone();
        // A transaction is charged to the role that asked for it (compaction's commits).
        let account = kiln_runtime::priority::current_account();
        tokio::task::spawn_blocking(move || {
            let mut guard = connection.lock().map_err(|_| MetastoreError::Poisoned)?;
            kiln_runtime::priority::charge_blocking(account.as_ref(), || work(&mut guard))
        })
        .await
        .map_err(MetastoreError::Task)?
    }

    /// `work` outside a transaction: one statement, or reads.
    pub(crate) async fn read<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Session<'_>) -> Result<T, MetastoreError> + Send + 'static,
    ) -> Result<T, MetastoreError> {
        self.with(move |connection| work(&mut Session { connection }))
            .await
    }

    /// `work` in one transaction, committed when it succeeds and rolled back otherwise.
    pub(crate) async fn write<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Session<'_>) -> Result<T, MetastoreError> + Send + 'static,
    ) -> Result<T, MetastoreError> {
        self.with(move |connection| {
            let outcome = transact(connection, work)?;
            reclaim(connection);
            Ok(outcome)
        })
        .await
    }

    /// [`SqliteMetastore::write`] on the calling thread, which it blocks; for a thread
    /// off the runtime.
    pub(crate) fn write_blocking<T>(
        &self,
        work: impl FnOnce(&mut Session<'_>) -> Result<T, MetastoreError>,
    ) -> Result<T, MetastoreError> {
        let mut guard = self
            .connection
            .lock()
            .map_err(|_| MetastoreError::Poisoned)?;
        let outcome = transact(&mut guard, work)?;
        reclaim(&guard);
        Ok(outcome)
    }
}

/// Pages a database keeps free before they are given back: an eighth of it, and at least
/// this many.
const FREE_PAGES_KEPT: i64 = 16;

/// Makes the database one whose free pages can be given back ([`reclaim`]). A new file is
/// made so before its first table; an older one (SQLite's default keeps every page it
/// ever used) is rewritten once by `VACUUM`, which takes about as long as copying it.
fn incremental_vacuum(connection: &Connection) -> Result<(), MetastoreError> {
    let mode: i64 = connection.query_row("PRAGMA auto_vacuum", [], |row| row.get(0))?;
    if mode == 2 {
        return Ok(());
    }
    connection.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
    let tables: i64 =
        connection.query_row("SELECT COUNT(*) FROM sqlite_schema", [], |row| row.get(0))?;
    if tables > 0 {
        tracing::info!("rewriting the metastore once so that its free pages can be given back");
        connection.execute_batch("VACUUM")?;
    }
    Ok(())
}

/// Gives free pages back to the file system once they are more than an eighth of the
/// database. Compaction's swaps and the expiry of write identities free pages that later
/// writes would reuse only slowly, and a settled metastore would otherwise stay at its
/// largest (issue 61). Runs after a commit, whose outcome it cannot change: a failure is
/// logged and the pages wait for the next commit.
fn reclaim(connection: &Connection) {
    let pages = || -> rusqlite::Result<(i64, i64)> {
        let free = connection
            .prepare_cached("PRAGMA freelist_count")?
            .query_row([], |row| row.get(0))?;
        let all = connection
            .prepare_cached("PRAGMA page_count")?
            .query_row([], |row| row.get(0))?;
        Ok((free, all))
    };
    let outcome = pages().and_then(|(free, all)| {
        if free > FREE_PAGES_KEPT && free > all / 8 {
            // Each step gives back one page and yields an empty row: step to the end.
            let mut statement = connection.prepare_cached("PRAGMA incremental_vacuum")?;
            let mut rows = statement.query([])?;
            while rows.next()?.is_some() {}
        }
        Ok(())
    });
    if let Err(error) = outcome {
        tracing::warn!(%error, "metastore: free pages not given back");
    }
}

fn transact<T>(
    connection: &mut Connection,
    work: impl FnOnce(&mut Session<'_>) -> Result<T, MetastoreError>,
) -> Result<T, MetastoreError> {
    // Dropping the transaction on an error rolls it back.
    let transaction = connection.transaction()?;
    let outcome = work(&mut Session {
        connection: &transaction,
    })?;
    transaction.commit()?;
    Ok(outcome)
}

/// Statements on SQLite's one connection, prepared once each (rusqlite's cache).
pub(crate) struct Session<'a> {
    connection: &'a Connection,
}

/// `$1` to `?1`: SQLite takes `$1` as a name, numbered in order of first use, where
/// PostgreSQL's `$1` (and SQLite's `?1`) is the first parameter whatever the order.
fn numbered(statement: &str) -> String {
    statement.replace('$', "?")
}

impl Session<'_> {
    fn execute_now(&mut self, statement: &str, args: &[Arg<'_>]) -> Result<u64, MetastoreError> {
        let mut prepared = self.connection.prepare_cached(&numbered(statement))?;
        Ok(prepared.execute(rusqlite::params_from_iter(args))? as u64)
    }

    fn query_now(&mut self, statement: &str, args: &[Arg<'_>]) -> Result<Vec<Row>, MetastoreError> {
        let mut prepared = self.connection.prepare_cached(&numbered(statement))?;
        let columns = prepared.column_count();
        let mut rows = prepared.query(rusqlite::params_from_iter(args))?;
        let mut read = Vec::new();
        while let Some(row) = rows.next()? {
            let mut cells = Vec::with_capacity(columns);
            for column in 0..columns {
                cells.push(match row.get_ref(column)? {
                    ValueRef::Null => Cell::Null,
                    ValueRef::Integer(value) => Cell::Int(value),
                    ValueRef::Text(text) => Cell::Text(
                        std::str::from_utf8(text)
                            .map_err(|_| MetastoreError::Column {
                                column,
                                expected: "UTF-8 text",
                                found: "invalid UTF-8",
                            })?
                            .to_string(),
                    ),
                    ValueRef::Real(_) | ValueRef::Blob(_) => {
                        return Err(MetastoreError::Column {
                            column,
                            expected: "an integer or text",
                            found: "a real or a blob",
                        })
                    }
                });
            }
            read.push(Row(cells));
        }
        Ok(read)
    }
}

impl Sql for Session<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn execute(
        &mut self,
        statement: &'static str,
        args: &[Arg<'_>],
    ) -> impl std::future::Future<Output = Result<u64, MetastoreError>> + Send {
        std::future::ready(self.execute_now(statement, args))
    }

    fn query(
        &mut self,
        statement: &'static str,
        args: &[Arg<'_>],
    ) -> impl std::future::Future<Output = Result<Vec<Row>, MetastoreError>> + Send {
        std::future::ready(self.query_now(statement, args))
    }
}

impl rusqlite::ToSql for Arg<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Arg::Int(value) => ToSqlOutput::Owned(rusqlite::types::Value::Integer(*value)),
            Arg::Text(text) => ToSqlOutput::Borrowed(ValueRef::Text(text.as_bytes())),
            Arg::Null => ToSqlOutput::Owned(rusqlite::types::Value::Null),
            Arg::Texts(_) | Arg::Ints(_) => {
                return Err(rusqlite::Error::ToSqlConversionFailure(
                    "SQLite has no array parameters".into(),
                ))
            }
        })
    }
}
