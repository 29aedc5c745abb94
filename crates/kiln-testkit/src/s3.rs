//! An S3-compatible server: moto's standalone server (`pip install 'moto[server]'`).
//! It speaks the S3 REST API that `object_store` uses (path-style requests, SigV4
//! headers accepted), keeping objects in memory.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub struct S3Server {
    port: u16,
    next_bucket: AtomicU32,
}

/// The process's S3 server, started on first use.
pub fn s3() -> Result<&'static S3Server, String> {
    static SERVER: OnceLock<Result<S3Server, String>> = OnceLock::new();
    SERVER
        .get_or_init(|| start().map_err(|err| format!("cannot start the S3 server: {err}")))
        .as_ref()
        .map_err(Clone::clone)
}

impl S3Server {
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The environment that points `object_store` (and so Kiln) at this server.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT_URL", self.endpoint().as_str()),
            ("AWS_ACCESS_KEY_ID", "kiln-test"),
            ("AWS_SECRET_ACCESS_KEY", "kiln-test-secret"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ALLOW_HTTP", "true"),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
    }

    /// Creates an empty bucket and returns an `s3://bucket/prefix` URL into it.
    pub fn fresh_bucket(&self) -> String {
        let bucket = format!(
            "kiln-{}-{}",
            std::process::id(),
            self.next_bucket.fetch_add(1, Ordering::Relaxed)
        );
        ureq::put(&format!("{}/{bucket}", self.endpoint()))
            .call()
            .expect("CreateBucket succeeds");
        format!("s3://{bucket}/kiln")
    }
}

fn start() -> Result<S3Server, String> {
    let port = crate::free_port();
    let mut command = if which("moto_server") {
        Command::new("moto_server")
    } else {
        let mut python = Command::new("python3");
        python.args(["-m", "moto.server"]);
        python
    };
    command
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    crate::process::spawn_for_process_lifetime(command, libc::SIGTERM, None)
        .map_err(|err| format!("moto_server: {err} (pip install 'moto[server]')"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(2))
        .build();
    while Instant::now() < deadline {
        if agent
            .get(&format!("http://127.0.0.1:{port}/moto-api/"))
            .call()
            .is_ok()
        {
            return Ok(S3Server {
                port,
                next_bucket: AtomicU32::new(0),
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err("moto_server did not answer within 60 s (pip install 'moto[server]')".to_string())
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}
