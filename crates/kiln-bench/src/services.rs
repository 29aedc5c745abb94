//! The benches that start PostgreSQL and an S3 server of their own (`kiln bench chaos`,
//! which also restarts PostgreSQL under the cluster, and `kiln bench ingest
//! --ingest-nodes`) use kiln-testkit's launchers. They are test code, so the release
//! binary leaves them out: a build with `--features bench-services` (as `cargo test`
//! builds the binary) has them, and any other says so when such a bench is asked for.

#[cfg(not(feature = "services"))]
const NO_SERVICES: &str = "this bench starts PostgreSQL and an S3 server of its own, which this build of kiln leaves out: build it with `cargo build --release --features bench-services`";

#[cfg(feature = "services")]
pub use crate::chaos::ChaosArgs;

/// `kiln bench chaos`, in a build without the bench services: whatever it was given.
#[cfg(not(feature = "services"))]
#[derive(clap::Args, Clone, Debug)]
pub struct ChaosArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    args: Vec<String>,
}

/// Runs `kiln bench chaos`.
pub fn chaos(args: ChaosArgs) -> anyhow::Result<()> {
    #[cfg(feature = "services")]
    return crate::chaos::run(args);
    #[cfg(not(feature = "services"))]
    {
        drop(args);
        anyhow::bail!("{NO_SERVICES}")
    }
}

/// A PostgreSQL server of the bench's own, stopped on drop.
#[cfg(feature = "services")]
pub type OwnPostgres = kiln_testkit::postgres::PostgresServer;
#[cfg(not(feature = "services"))]
pub type OwnPostgres = ();

/// A PostgreSQL server of the bench's own, and the URL of a fresh database in it.
pub fn own_postgres() -> anyhow::Result<(OwnPostgres, String)> {
    #[cfg(feature = "services")]
    {
        let postgres = kiln_testkit::postgres::start_own().map_err(anyhow::Error::msg)?;
        let database = postgres.fresh_database();
        Ok((postgres, database))
    }
    #[cfg(not(feature = "services"))]
    anyhow::bail!("{NO_SERVICES}")
}
