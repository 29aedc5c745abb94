//! Certificates for TLS tests, made by the `openssl` command line: a CA of the test's own
//! and a server certificate it signed for `localhost` and `127.0.0.1`, as a real
//! deployment has (a self-signed CA certificate cannot also be the server's: webpki
//! refuses a CA as an end entity).

use std::path::{Path, PathBuf};
use std::process::Command;

/// PEM files in a directory: the CA's certificate, and the server's certificate and key.
#[derive(Debug, Clone)]
pub struct Certificates {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn openssl(args: &[&str], dir: &Path) -> Result<(), String> {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|err| format!("openssl is not installed ({err})"))?;
    if !output.status.success() {
        return Err(format!(
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(())
}

/// A fresh CA named `name` and a server certificate it signed, under `dir` (files named
/// after `name`), valid for two days.
pub fn certificates(dir: &Path, name: &str) -> Result<Certificates, String> {
    let file = |suffix: &str| format!("{name}-{suffix}");
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    let ca_subject = format!("/CN={name} test CA");
    openssl(
        &[
            &["req", "-x509", "-nodes", "-days", "2"][..],
            &ec,
            &[
                "-keyout",
                &file("ca.key"),
                "-out",
                &file("ca.pem"),
                "-subj",
                &ca_subject,
            ],
        ]
        .concat(),
        dir,
    )?;
    openssl(
        &[
            &["req", "-nodes"][..],
            &ec,
            &[
                "-keyout",
                &file("server.key"),
                "-out",
                &file("server.csr"),
                "-subj",
                "/CN=localhost",
            ],
        ]
        .concat(),
        dir,
    )?;
    std::fs::write(
        dir.join(file("server.ext")),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .map_err(|err| err.to_string())?;
    openssl(
        &[
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            &file("server.csr"),
            "-CA",
            &file("ca.pem"),
            "-CAkey",
            &file("ca.key"),
            "-CAcreateserial",
            "-extfile",
            &file("server.ext"),
            "-out",
            &file("server.pem"),
        ],
        dir,
    )?;
    Ok(Certificates {
        ca: dir.join(file("ca.pem")),
        cert: dir.join(file("server.pem")),
        key: dir.join(file("server.key")),
    })
}
