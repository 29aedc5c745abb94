//! Builds the agent's BPF program (src/bpf/agent.bpf.c) with clang, when there is one.
//! Without clang the agent is built without eBPF, and says so when asked for it.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let source = "src/bpf/agent.bpf.c";
    println!("cargo:rerun-if-changed={source}");
    println!("cargo:rerun-if-changed=src/bpf/interp.bpf.h");
    println!("cargo:rerun-if-changed=src/bpf/offcpu.bpf.h");
    println!("cargo:rerun-if-env-changed=CLANG");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let object = out.join("agent.bpf.o");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = match arch.as_str() {
        "x86_64" => "x86_64-linux-gnu",
        "aarch64" => "aarch64-linux-gnu",
        other => other,
    };
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let built = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg(format!("-I/usr/include/{multiarch}"))
        .args(["-c", source, "-o"])
        .arg(&object)
        .status();
    match built {
        Ok(status) if status.success() => {}
        Ok(status) => {
            println!("cargo:warning=clang failed to build {source} ({status}): the agent is built without eBPF");
            let _ = std::fs::write(&object, b"");
        }
        Err(err) => {
            println!("cargo:warning=no clang ({err}): the agent is built without eBPF (apt install clang)");
            // A path that never exists is always out of date: every build looks for clang
            // again, so installing it later is enough to get eBPF back.
            println!(
                "cargo:rerun-if-changed={}",
                out.join("clang-missing").display()
            );
            let _ = std::fs::write(&object, b"");
        }
    }
}
