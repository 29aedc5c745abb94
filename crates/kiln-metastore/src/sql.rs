//! The seam between the metastore's operations and its two databases.
//!
//! Every operation (the modules `datasets`, `compaction`, `rules`, `insight`, `nodes`) is
//! written once, against [`Sql`]: run a statement, read its rows. SQLite and PostgreSQL
//! each implement it (`sqlite::Session`, `postgres::Session`). The statements are written
//! in the SQL both speak, with PostgreSQL's `$1` placeholders (SQLite's session turns them
//! into `?1`, which binds by number as `$1` does there). Where the dialects part (arrays,
//! advisory locks, `FOR UPDATE`), an operation asks [`Sql::dialect`] and keeps both
//! statements side by side, so a reader sees the difference in one place.
//!
//! A session is bound to a connection, inside a transaction or not, by the backend; the
//! operation decides nothing about either. SQLite's statements run on the thread that
//! holds its connection, so its futures never wait: [`complete`] polls one once.

use std::future::Future;
use std::task::{Context, Poll, Waker};

use crate::MetastoreError;

/// Which SQL a statement may use where the two differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Sqlite,
    Postgres,
}

/// What an operation needs from a database.
pub(crate) trait Sql {
    fn dialect(&self) -> Dialect;

    /// Runs `statement` (prepared once per connection) and returns the rows it changed.
    fn execute(
        &mut self,
        statement: &'static str,
        args: &[Arg<'_>],
    ) -> impl Future<Output = Result<u64, MetastoreError>> + Send;

    /// Runs `statement` and returns its rows.
    fn query(
        &mut self,
        statement: &'static str,
        args: &[Arg<'_>],
    ) -> impl Future<Output = Result<Vec<Row>, MetastoreError>> + Send;
}

/// A statement's parameter. One integer kind: PostgreSQL's session writes it as the
/// column's own width (`INTEGER` or `BIGINT`), refusing a value that does not fit, so no
/// operation casts by hand.
#[derive(Debug, Clone)]
pub(crate) enum Arg<'a> {
    Int(i64),
    Text(&'a str),
    Null,
    /// PostgreSQL only, for `= ANY($1)` and `UNNEST`.
    Texts(Vec<&'a str>),
    /// PostgreSQL only.
    Ints(Vec<i64>),
}

impl From<i64> for Arg<'_> {
    fn from(value: i64) -> Self {
        Arg::Int(value)
    }
}

impl From<i32> for Arg<'_> {
    fn from(value: i32) -> Self {
        Arg::Int(value.into())
    }
}

impl From<u32> for Arg<'_> {
    fn from(value: u32) -> Self {
        Arg::Int(value.into())
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(value: &'a str) -> Self {
        Arg::Text(value)
    }
}

impl<'a> From<&'a String> for Arg<'a> {
    fn from(value: &'a String) -> Self {
        Arg::Text(value)
    }
}

impl<'a> From<&'a Option<String>> for Arg<'a> {
    fn from(value: &'a Option<String>) -> Self {
        value.as_deref().map_or(Arg::Null, Arg::Text)
    }
}

/// `args![a, b]`: a statement's parameters, `$1` first.
macro_rules! args {
    ($($arg:expr),* $(,)?) => {
        &[$($crate::sql::Arg::from($arg)),*]
    };
}
pub(crate) use args;

/// One value read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cell {
    Null,
    Int(i64),
    Text(String),
}

impl Cell {
    fn kind(&self) -> &'static str {
        match self {
            Cell::Null => "NULL",
            Cell::Int(_) => "an integer",
            Cell::Text(_) => "text",
        }
    }
}

/// One row read back, its columns in the statement's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row(pub(crate) Vec<Cell>);

impl Row {
    fn cell(&self, column: usize) -> Result<&Cell, MetastoreError> {
        self.0.get(column).ok_or(MetastoreError::Column {
            column,
            expected: "a column",
            found: "no such column",
        })
    }

    fn mismatch(column: usize, expected: &'static str, found: &Cell) -> MetastoreError {
        MetastoreError::Column {
            column,
            expected,
            found: found.kind(),
        }
    }

    pub(crate) fn opt_int(&self, column: usize) -> Result<Option<i64>, MetastoreError> {
        match self.cell(column)? {
            Cell::Int(value) => Ok(Some(*value)),
            Cell::Null => Ok(None),
            other => Err(Self::mismatch(column, "an integer", other)),
        }
    }

    pub(crate) fn int(&self, column: usize) -> Result<i64, MetastoreError> {
        match self.cell(column)? {
            Cell::Int(value) => Ok(*value),
            other => Err(Self::mismatch(column, "an integer", other)),
        }
    }

    /// An integer column that holds a count, a level or a row group.
    pub(crate) fn unsigned<T: TryFrom<i64>>(&self, column: usize) -> Result<T, MetastoreError> {
        let value = self.int(column)?;
        T::try_from(value).map_err(|_| MetastoreError::Column {
            column,
            expected: "a non-negative integer in range",
            found: "an integer out of range",
        })
    }

    /// Takes a text column out of the row (each is read once).
    pub(crate) fn text(&mut self, column: usize) -> Result<String, MetastoreError> {
        let cell = self.0.get_mut(column).ok_or(MetastoreError::Column {
            column,
            expected: "a column",
            found: "no such column",
        })?;
        match std::mem::replace(cell, Cell::Null) {
            Cell::Text(text) => Ok(text),
            other => Err(Self::mismatch(column, "text", &other)),
        }
    }
}

/// Runs a future that never waits (an operation over SQLite's session) to its end.
pub(crate) fn complete<T>(
    future: impl Future<Output = Result<T, MetastoreError>>,
) -> Result<T, MetastoreError> {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(outcome) => outcome,
        Poll::Pending => Err(MetastoreError::Suspended),
    }
}

/// The rows of a query that returns one column of text.
pub(crate) fn texts(rows: Vec<Row>) -> Result<Vec<String>, MetastoreError> {
    rows.into_iter().map(|mut row| row.text(0)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_refuses_the_wrong_kind_and_a_missing_column() {
        let mut row = Row(vec![Cell::Int(-1), Cell::Text("a".into()), Cell::Null]);
        assert_eq!(row.int(0).ok(), Some(-1));
        assert!(row.unsigned::<u32>(0).is_err());
        assert!(matches!(
            row.int(1),
            Err(MetastoreError::Column { column: 1, .. })
        ));
        assert_eq!(row.opt_int(2).ok(), Some(None));
        assert!(row.int(2).is_err());
        assert!(row.int(3).is_err());
        assert_eq!(row.text(1).ok().as_deref(), Some("a"));
    }

    #[test]
    fn a_future_that_waits_is_an_error_not_a_hang() {
        let outcome: Result<(), _> = complete(async {
            std::future::pending::<()>().await;
            Ok(())
        });
        assert!(matches!(outcome, Err(MetastoreError::Suspended)));
    }
}
