//! A PostgreSQL server from Debian's `postgresql` package, in a temporary directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub struct PostgresServer {
    bin: PathBuf,
    port: u16,
    next_database: AtomicU32,
    root: PathBuf,
    account: Option<(u32, u32)>,
    /// The postmaster now running.
    pid: std::sync::Mutex<u32>,
}

/// The process's PostgreSQL server, started on first use.
pub fn postgres() -> Result<&'static PostgresServer, String> {
    static SERVER: OnceLock<Result<PostgresServer, String>> = OnceLock::new();
    SERVER
        .get_or_init(|| start().map_err(|err| format!("cannot start PostgreSQL: {err}")))
        .as_ref()
        .map_err(Clone::clone)
}

/// A server of the caller's own, which it may restart ([`PostgresServer::restart`])
/// without disturbing the tests that share [`postgres`].
pub fn start_own() -> Result<PostgresServer, String> {
    start().map_err(|err| format!("cannot start PostgreSQL: {err}"))
}

impl PostgresServer {
    /// Stops the server with a fast shutdown (sessions cut, as an operator's restart or
    /// a failover does), keeps it down for `down`, and starts it again on the same data
    /// directory and port.
    pub fn restart(&self, down: Duration) -> Result<(), String> {
        let mut pid = self.pid.lock().map_err(|_| "poisoned".to_string())?;
        crate::process::stop(*pid, libc::SIGINT);
        std::thread::sleep(down);
        *pid = spawn_postmaster(&self.bin, &self.root, self.port, self.account)?;
        wait_ready(&self.bin, self.port, &self.root.join("postgres.log"))
    }

    /// Creates an empty database and returns its URL.
    pub fn fresh_database(&self) -> String {
        let name = format!(
            "kiln_{}_{}",
            std::process::id(),
            self.next_database.fetch_add(1, Ordering::Relaxed)
        );
        let output = Command::new(self.bin.join("psql"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-v", "ON_ERROR_STOP=1", "-q", "-c"])
            .arg(format!("CREATE DATABASE {name}"))
            .output()
            .expect("psql runs");
        assert!(
            output.status.success(),
            "CREATE DATABASE failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

fn binaries() -> Result<PathBuf, String> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|err| format!("/usr/lib/postgresql: {err} (apt-get install postgresql)"))?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| "no server binaries under /usr/lib/postgresql".to_string())
}

/// The `postgres` account's uid and gid when running as root: the server refuses root.
fn server_account() -> Result<Option<(u32, u32)>, String> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let id = |flag: &str| -> Result<u32, String> {
        let output = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .map_err(|err| err.to_string())?;
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .map_err(|_| "no postgres account (apt-get install postgresql)".to_string())
    };
    Ok(Some((id("-u")?, id("-g")?)))
}

fn as_account(command: &mut Command, account: Option<(u32, u32)>) {
    use std::os::unix::process::CommandExt;
    if let Some((uid, gid)) = account {
        command.gid(gid).uid(uid);
    }
}

fn start() -> Result<PostgresServer, String> {
    let bin = binaries()?;
    let account = server_account()?;
    let root = tempfile::Builder::new()
        .prefix("kiln-pg-")
        .tempdir()
        .map_err(|err| err.to_string())?
        .keep();
    if let Some((uid, gid)) = account {
        std::os::unix::fs::chown(&root, Some(uid), Some(gid)).map_err(|err| err.to_string())?;
    }
    let data = root.join("data");
    let log = root.join("postgres.log");
    let mut initdb = Command::new(bin.join("initdb"));
    initdb
        .arg("-D")
        .arg(&data)
        .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    as_account(&mut initdb, account);
    let output = initdb.output().map_err(|err| format!("initdb: {err}"))?;
    if !output.status.success() {
        return Err(format!(
            "initdb failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let port = crate::free_port();
    let pid = spawn_postmaster(&bin, &root, port, account)?;
    wait_ready(&bin, port, &log)?;
    Ok(PostgresServer {
        bin,
        port,
        next_database: AtomicU32::new(0),
        root,
        account,
        pid: std::sync::Mutex::new(pid),
    })
}

fn spawn_postmaster(
    bin: &Path,
    root: &Path,
    port: u16,
    account: Option<(u32, u32)>,
) -> Result<u32, String> {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join("postgres.log"))
        .map_err(|err| err.to_string())?;
    let mut server = Command::new(bin.join("postgres"));
    server
        .arg("-D")
        .arg(root.join("data"))
        .args(["-p", &port.to_string(), "-k"])
        .arg(root)
        // Test databases need no crash safety of their own; Kiln's is tested elsewhere.
        .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
        .args(["-c", "synchronous_commit=off", "-c", "full_page_writes=off"])
        .args(["-c", "max_connections=400"])
        .stdout(Stdio::null())
        .stderr(log_file);
    as_account(&mut server, account);
    // SIGINT is PostgreSQL's fast shutdown.
    crate::process::spawn_for_process_lifetime(server, libc::SIGINT, Some(root.to_path_buf()))
        .map_err(|err| format!("postgres: {err}"))
}

fn wait_ready(bin: &Path, port: u16, log: &Path) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let ready = Command::new(bin.join("pg_isready"))
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q"])
            .status()
            .is_ok_and(|status| status.success());
        if ready {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!(
        "not ready after 30 s: {}",
        std::fs::read_to_string(log).unwrap_or_default()
    ))
}
