//! `kiln` as a child process, one way for the benches and the tests alike: started with
//! its flags and environment on a loopback port of its own, ready once it answers
//! `/ready`, killed (SIGKILL: a crash, nothing flushed, nothing left cleanly) or stopped
//! (SIGTERM: an operator's stop, the metastore checkpointed), and started again on the
//! same port and data directory.
//!
//! A node is a child rather than a task inside the caller when what is done to it or
//! measured of it must be its own: a signal, a crash point that kills the process, its
//! memory and CPU time apart from the load generator's.
//!
//! Readiness is asked over plain TCP (`GET /ready HTTP/1.0`, a `200` status line), not
//! through an HTTP client crate: the callers each link their own (the tests ureq, `kiln
//! bench` reqwest), and one status line is all this reads. A node behind TLS is asked by
//! the caller's own probe ([`KilnCommand::ready_when`]).

use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A free TCP port on loopback. The listener is closed before the port is used, so
/// another process may take it meanwhile: good enough for a machine running tests.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free loopback port")
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot start {binary}: {source}")]
    Spawn {
        binary: String,
        source: std::io::Error,
    },
    #[error("{binary} exited before it was ready ({status})")]
    Exited { binary: String, status: ExitStatus },
    #[error("{binary} did not answer /ready on port {port} within {seconds} s")]
    NotReady {
        binary: String,
        port: u16,
        seconds: u64,
    },
    #[error("{binary} did not exit within {seconds} s")]
    StillRunning { binary: String, seconds: u64 },
    #[error("{binary} is not running")]
    NotRunning { binary: String },
    #[error("waiting for {binary}: {source}")]
    Wait {
        binary: String,
        source: std::io::Error,
    },
}

/// Where a child's standard error goes. Standard output is always discarded.
#[derive(Debug, Clone)]
pub enum Log {
    /// The caller's standard error: a test's failure shows the node's last words.
    Inherit,
    Discard,
    /// Appended to a file: a node killed and started again keeps one log.
    File(PathBuf),
}

type Probe = Arc<dyn Fn(u16) -> bool + Send + Sync>;

/// How to start a `kiln` child. Cloned to start the same node again.
#[derive(Clone)]
pub struct KilnCommand {
    binary: PathBuf,
    args: Vec<OsString>,
    /// Whether `--listen 127.0.0.1:PORT` follows the first argument (the subcommand).
    listen: bool,
    env: Vec<(OsString, OsString)>,
    port: u16,
    cpus: Vec<usize>,
    log: Log,
    ready: Option<Probe>,
    ready_within: Duration,
}

impl KilnCommand {
    /// `BINARY server --listen 127.0.0.1:PORT --data-dir DATA_DIR`, on a free port, with
    /// `KILN_LOG_LEVEL=warn`.
    pub fn server(binary: impl Into<PathBuf>, data_dir: &Path) -> KilnCommand {
        let mut command = KilnCommand::new(binary, free_port());
        command.args = vec!["server".into(), "--data-dir".into(), data_dir.into()];
        command.listen = true;
        command
    }

    /// `BINARY` with no arguments, for a node that is told where to listen (`port`) some
    /// other way: its configuration file, `KILN_LISTEN`.
    pub fn new(binary: impl Into<PathBuf>, port: u16) -> KilnCommand {
        KilnCommand {
            binary: binary.into(),
            args: Vec::new(),
            listen: false,
            env: vec![("KILN_LOG_LEVEL".into(), "warn".into())],
            port,
            cpus: Vec::new(),
            log: Log::Inherit,
            ready: None,
            ready_within: Duration::from_secs(60),
        }
    }

    /// On this port instead of a free one (a node started again where it was).
    pub fn port(mut self, port: u16) -> KilnCommand {
        self.port = port;
        self
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> KilnCommand {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(mut self, args: I) -> KilnCommand {
        self.args
            .extend(args.into_iter().map(|arg| arg.as_ref().to_os_string()));
        self
    }

    /// An environment variable; a later one of the same name wins.
    pub fn env(mut self, name: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> KilnCommand {
        self.env
            .push((name.as_ref().to_os_string(), value.as_ref().to_os_string()));
        self
    }

    pub fn envs<I, K, V>(mut self, vars: I) -> KilnCommand
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        for (name, value) in vars {
            self = self.env(name, value);
        }
        self
    }

    /// Runs only on these CPUs (`taskset -c`), when not empty: one process standing for a
    /// machine of its own.
    pub fn cpus(mut self, cpus: &[usize]) -> KilnCommand {
        self.cpus = cpus.to_vec();
        self
    }

    pub fn log(mut self, log: Log) -> KilnCommand {
        self.log = log;
        self
    }

    /// Ready when `probe(port)` says so, instead of when `/ready` answers 200 over plain
    /// HTTP.
    pub fn ready_when(mut self, probe: impl Fn(u16) -> bool + Send + Sync + 'static) -> Self {
        self.ready = Some(Arc::new(probe));
        self
    }

    pub fn ready_within(mut self, timeout: Duration) -> KilnCommand {
        self.ready_within = timeout;
        self
    }

    pub fn port_number(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn name(&self) -> String {
        self.binary.display().to_string()
    }

    /// Starts the child and returns at once: for a node that is to crash, or whose
    /// readiness the caller judges.
    pub fn spawn(&self) -> Result<KilnChild, Error> {
        let child = self.spawn_child()?;
        Ok(KilnChild {
            command: self.clone(),
            child: Some(child),
        })
    }

    /// Starts the child and waits until it is ready. One that exits first, or is not
    /// ready in time, is an error (and is killed).
    pub fn start(&self) -> Result<KilnChild, Error> {
        let mut child = self.spawn()?;
        child.wait_ready()?;
        Ok(child)
    }

    fn spawn_child(&self) -> Result<Child, Error> {
        let mut command = if self.cpus.is_empty() {
            Command::new(&self.binary)
        } else {
            let list: Vec<String> = self.cpus.iter().map(usize::to_string).collect();
            let mut command = Command::new("taskset");
            command.args(["-c", &list.join(",")]).arg(&self.binary);
            command
        };
        let mut args = self.args.iter();
        // The subcommand first, then where it listens, then the rest.
        if self.listen {
            if let Some(subcommand) = args.next() {
                command.arg(subcommand);
            }
            command
                .arg("--listen")
                .arg(format!("127.0.0.1:{}", self.port));
        }
        command
            .args(args)
            .envs(self.env.iter().map(|(name, value)| (name, value)))
            .stdout(Stdio::null());
        let spawn_error = |source| Error::Spawn {
            binary: self.name(),
            source,
        };
        match &self.log {
            Log::Inherit => {
                command.stderr(Stdio::inherit());
            }
            Log::Discard => {
                command.stderr(Stdio::null());
            }
            Log::File(path) => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(spawn_error)?;
                command.stderr(file);
            }
        }
        command.spawn().map_err(spawn_error)
    }
}

/// A running (or killed) `kiln` child; killed when dropped.
pub struct KilnChild {
    command: KilnCommand,
    child: Option<Child>,
}

impl KilnChild {
    pub fn url(&self) -> String {
        self.command.url()
    }

    pub fn port(&self) -> u16 {
        self.command.port
    }

    /// The process id; 0 once killed and not started again.
    pub fn id(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Waits until the child answers, as [`KilnCommand::start`] does.
    pub fn wait_ready(&mut self) -> Result<(), Error> {
        let deadline = Instant::now() + self.command.ready_within;
        let port = self.command.port;
        loop {
            if let Some(status) = self.try_wait().map_err(|source| Error::Wait {
                binary: self.command.name(),
                source,
            })? {
                self.child = None;
                return Err(Error::Exited {
                    binary: self.command.name(),
                    status,
                });
            }
            let ready = match &self.command.ready {
                Some(probe) => probe(port),
                None => answers_ready(port),
            };
            if ready {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let _ = self.kill();
                return Err(Error::NotReady {
                    binary: self.command.name(),
                    port,
                    seconds: self.command.ready_within.as_secs(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL, and reaps it: a crash.
    pub fn kill(&mut self) -> std::io::Result<()> {
        match self.child.take() {
            Some(mut child) => {
                child.kill()?;
                child.wait().map(|_| ())
            }
            None => Ok(()),
        }
    }

    /// SIGTERM, as an operator stops a node (the metastore checkpointed, the membership
    /// left), and up to 30 s for it to exit; SIGKILL after.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            // SAFETY: a plain syscall on the pid of a child this process has not reaped.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Kills the child if it runs, and starts the same command again: same port, same
    /// data directory.
    pub fn restart(&mut self) -> Result<(), Error> {
        let _ = self.kill();
        *self = self.command.start()?;
        Ok(())
    }

    /// Waits for the child to exit by itself (a crash point), up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            let waited = self.try_wait().map_err(|source| Error::Wait {
                binary: self.command.name(),
                source,
            })?;
            if let Some(status) = waited {
                self.child = None;
                return Ok(status);
            }
            if self.child.is_none() {
                return Err(Error::NotRunning {
                    binary: self.command.name(),
                });
            }
            if Instant::now() >= deadline {
                return Err(Error::StillRunning {
                    binary: self.command.name(),
                    seconds: timeout.as_secs(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// As [`std::process::Child::try_wait`]; `None` once killed, too.
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        match &mut self.child {
            Some(child) => child.try_wait(),
            None => Ok(None),
        }
    }

    /// As [`std::process::Child::wait`].
    pub fn wait(&mut self) -> std::io::Result<ExitStatus> {
        match self.child.take() {
            Some(mut child) => child.wait(),
            None => Err(std::io::Error::other("the child is not running")),
        }
    }
}

impl Drop for KilnChild {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// Whether a server on loopback `port` answers `GET /ready` with 200.
fn answers_ready(port: u16) -> bool {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut stream) = TcpStream::connect_timeout(&address, Duration::from_secs(1)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /ready HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    // "HTTP/1.x 200": the status line's first twelve bytes.
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.") && &head[9..12] == b"200"
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that answers one status line per connection, as kiln's `/ready` does.
    fn answering(status: &'static str) -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut stream = stream;
                let mut request = [0u8; 256];
                let _ = stream.read(&mut request);
                let _ = write!(stream, "HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
            }
        });
        port
    }

    #[test]
    fn ready_is_a_200_and_nothing_else() {
        assert!(answers_ready(answering("200 OK")));
        assert!(!answers_ready(answering("503 Service Unavailable")));
        assert!(!answers_ready(free_port()));
    }

    #[test]
    fn a_child_that_exits_before_it_is_ready_says_so() {
        // `true` ignores its arguments and exits 0 at once.
        let command = KilnCommand::server("true", Path::new("/nonexistent"));
        match command.start() {
            Err(Error::Exited { status, .. }) => assert!(status.success()),
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("`true` was taken for a ready server"),
        }
        let missing = KilnCommand::server("/nonexistent/kiln", Path::new("/tmp"));
        assert!(matches!(missing.start(), Err(Error::Spawn { .. })));
    }

    #[test]
    fn killed_children_are_reaped_and_start_again_on_their_port() {
        // `sleep` stands for a server: spawned, never ready, killed, spawned again.
        let args = KilnCommand::new("sleep", free_port()).arg("30");
        let mut child = args.spawn().expect("sleep starts");
        let first = child.id();
        assert!(first > 0);
        assert!(matches!(child.try_wait(), Ok(None)));
        child.kill().expect("killed");
        assert_eq!(child.id(), 0);
        assert!(child.wait().is_err());
        let mut again = args.clone().port(child.port()).spawn().expect("again");
        assert_eq!(again.port(), child.port());
        assert_ne!(again.id(), first);
        assert!(matches!(
            again.wait_exit(Duration::from_millis(100)),
            Err(Error::StillRunning { .. })
        ));
    }
}
