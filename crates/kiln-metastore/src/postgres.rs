//! The PostgreSQL backend, for deployments where several Kiln nodes share one index.
//!
//! Every write is one transaction at READ COMMITTED. Correctness under concurrent nodes
//! rests on row locks rather than on isolation level: a compaction swap deletes its input
//! rows first, so a second swap over the same inputs blocks on them, then finds them gone
//! and reports a conflict; leases are one upsert guarded by its `WHERE`. Migrations take
//! a transaction-scoped advisory lock, so nodes starting together migrate once. Each
//! connection prepares a statement once (deadpool's statement cache), so a repeated
//! operation costs one round trip per statement.

use std::error::Error;
use std::str::FromStr;

use bytes::BytesMut;
use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::types::{IsNull, ToSql, Type};
use tokio_postgres::NoTls;

use crate::migrations::MIGRATIONS;
use crate::now_ms;
use crate::sql::{Arg, Cell, Dialect, Row, Sql};
use crate::MetastoreError;

/// Any 64-bit key no other user of the database is likely to pick: "kilnmeta".
const MIGRATION_LOCK: i64 = 0x6b69_6c6e_6d65_7461;

const POOL_SIZE: usize = 16;

#[derive(Clone)]
pub(crate) struct PostgresMetastore {
    pool: Pool,
}

impl std::fmt::Debug for PostgresMetastore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PostgresMetastore")
    }
}

impl PostgresMetastore {
    /// Connects to `url` (`postgres://user:password@host:port/database?...`, libpq style)
    /// and brings the schema up to date.
    pub(crate) async fn open(url: &str) -> Result<Self, MetastoreError> {
        let config = tokio_postgres::Config::from_str(url).map_err(|source| {
            MetastoreError::InvalidPostgresUrl {
                url: redact(url),
                source,
            }
        })?;
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .build()
            .map_err(MetastoreError::PoolBuild)?;
        let metastore = PostgresMetastore { pool };
        metastore.migrate().await?;
        Ok(metastore)
    }

    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Object, MetastoreError> {
        self.pool.get().await.map_err(|err| match err {
            deadpool_postgres::PoolError::Backend(err) => MetastoreError::Postgres(err),
            other => MetastoreError::Pool(other),
        })
    }

    async fn migrate(&self) -> Result<(), MetastoreError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await?;
        transaction
            .execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await?;
        transaction
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, applied_at_ms BIGINT NOT NULL);",
            )
            .await?;
        let current: i64 = transaction
            .query_one(
                "SELECT COALESCE(MAX(version), 0)::BIGINT FROM schema_migrations",
                &[],
            )
            .await?
            .get(0);
        for (index, migration) in MIGRATIONS.iter().enumerate() {
            let version = index as i64 + 1;
            if version <= current {
                continue;
            }
            transaction
                .batch_execute(migration.sql(Dialect::Postgres))
                .await?;
            transaction
                .execute(
                    "INSERT INTO schema_migrations (version, applied_at_ms) VALUES ($1, $2)",
                    &[&version, &now_ms()],
                )
                .await?;
            tracing::info!(version, "applied metastore migration");
        }
        transaction.commit().await?;
        Ok(())
    }
}

/// Statements on one pooled connection, outside a transaction or inside one.
pub(crate) enum Session<'a> {
    Client(&'a deadpool_postgres::Object),
    Transaction(&'a deadpool_postgres::Transaction<'a>),
}

async fn execute_on(
    client: &impl GenericClient,
    statement: &str,
    args: &[Arg<'_>],
) -> Result<u64, MetastoreError> {
    let prepared = client.prepare_cached(statement).await?;
    let params: Vec<&(dyn ToSql + Sync)> = args.iter().map(|arg| arg as _).collect();
    Ok(client.execute(&prepared, &params).await?)
}

async fn query_on(
    client: &impl GenericClient,
    statement: &str,
    args: &[Arg<'_>],
) -> Result<Vec<Row>, MetastoreError> {
    let prepared = client.prepare_cached(statement).await?;
    let params: Vec<&(dyn ToSql + Sync)> = args.iter().map(|arg| arg as _).collect();
    client
        .query(&prepared, &params)
        .await?
        .iter()
        .map(read_row)
        .collect()
}

fn read_row(row: &tokio_postgres::Row) -> Result<Row, MetastoreError> {
    let mut cells = Vec::with_capacity(row.len());
    for (index, column) in row.columns().iter().enumerate() {
        let ty = column.type_();
        let cell = if *ty == Type::INT8 {
            row.try_get::<_, Option<i64>>(index)?.map(Cell::Int)
        } else if *ty == Type::INT4 {
            row.try_get::<_, Option<i32>>(index)?
                .map(|value| Cell::Int(value.into()))
        } else if *ty == Type::INT2 {
            row.try_get::<_, Option<i16>>(index)?
                .map(|value| Cell::Int(value.into()))
        } else if [Type::TEXT, Type::VARCHAR, Type::NAME, Type::BPCHAR].contains(ty) {
            row.try_get::<_, Option<String>>(index)?.map(Cell::Text)
        } else {
            return Err(MetastoreError::Column {
                column: index,
                expected: "an integer or text",
                found: "another PostgreSQL type",
            });
        };
        cells.push(cell.unwrap_or(Cell::Null));
    }
    Ok(Row(cells))
}

impl Sql for Session<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn execute(
        &mut self,
        statement: &'static str,
        args: &[Arg<'_>],
    ) -> impl std::future::Future<Output = Result<u64, MetastoreError>> + Send {
        let session: &Session<'_> = self;
        async move {
            match session {
                Session::Client(client) => execute_on(*client, statement, args).await,
                Session::Transaction(transaction) => {
                    execute_on(*transaction, statement, args).await
                }
            }
        }
    }

    fn query(
        &mut self,
        statement: &'static str,
        args: &[Arg<'_>],
    ) -> impl std::future::Future<Output = Result<Vec<Row>, MetastoreError>> + Send {
        let session: &Session<'_> = self;
        async move {
            match session {
                Session::Client(client) => query_on(*client, statement, args).await,
                Session::Transaction(transaction) => query_on(*transaction, statement, args).await,
            }
        }
    }
}

type BoxError = Box<dyn Error + Sync + Send>;

impl ToSql for Arg<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        match self {
            Arg::Int(value) if *ty == Type::INT4 => i32::try_from(*value)?.to_sql_checked(ty, out),
            Arg::Int(value) if *ty == Type::INT2 => i16::try_from(*value)?.to_sql_checked(ty, out),
            Arg::Int(value) => value.to_sql_checked(ty, out),
            Arg::Text(text) => text.to_sql_checked(ty, out),
            Arg::Null => Ok(IsNull::Yes),
            Arg::Texts(texts) => texts.to_sql_checked(ty, out),
            Arg::Ints(values) => values.to_sql_checked(ty, out),
        }
    }

    /// Every variant checks the column's type itself, in `to_sql`.
    fn accepts(_: &Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

/// The URL without its password, for error messages and logs.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((credentials, host)) = rest.rsplit_once('@') else {
        return url.to_string();
    };
    let user = credentials.split(':').next().unwrap_or("");
    format!("{scheme}://{user}:***@{host}")
}
