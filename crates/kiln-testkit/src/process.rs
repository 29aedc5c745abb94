//! Long-lived child processes that die with the test process.

use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::Mutex;

/// Children to stop at exit: (pid, signal, directory to remove afterwards).
static CHILDREN: Mutex<Vec<(i32, i32, Option<std::path::PathBuf>)>> = Mutex::new(Vec::new());

extern "C" fn stop_children() {
    let Ok(mut children) = CHILDREN.lock() else {
        return;
    };
    for (pid, signal, directory) in children.drain(..) {
        // SAFETY: plain syscalls on a pid this process started.
        unsafe {
            libc::kill(pid, signal);
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
        }
        if let Some(directory) = directory {
            let _ = std::fs::remove_dir_all(directory);
        }
    }
}

/// Stops a child [`spawn_for_process_lifetime`] started, now, with `signal`, and waits for
/// it; the exit hook forgets it (its directory is left for a successor).
pub fn stop(pid: u32, signal: i32) {
    if let Ok(mut children) = CHILDREN.lock() {
        children.retain(|(child, _, _)| *child != pid as i32);
    }
    // SAFETY: plain syscalls on a pid this process started and has not reaped.
    unsafe {
        libc::kill(pid as i32, signal);
        let mut status = 0;
        libc::waitpid(pid as i32, &mut status, 0);
    }
}

/// Spawns `command` from a thread that lives as long as the process, with a parent-death
/// signal so the child goes even when the test process is killed. `signal` is also what
/// the exit hook sends; `cleanup` is removed after the child is gone.
pub fn spawn_for_process_lifetime(
    mut command: Command,
    signal: i32,
    cleanup: Option<std::path::PathBuf>,
) -> std::io::Result<u32> {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe; it runs in the child between fork and exec.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (sender, receiver) = mpsc::channel::<std::io::Result<Child>>();
    std::thread::Builder::new()
        .name("testkit-owner".to_string())
        .spawn(move || {
            let spawned = command.spawn();
            let alive = spawned.is_ok();
            let _ = sender.send(spawned);
            if alive {
                loop {
                    std::thread::park();
                }
            }
        })?;
    let child = receiver
        .recv()
        .map_err(|_| std::io::Error::other("the owner thread ended"))??;
    let pid = child.id();
    // The Child handle is dropped without waiting: the exit hook reaps it.
    std::mem::forget(child);
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        // SAFETY: registers a plain extern "C" function.
        unsafe {
            libc::atexit(stop_children);
        }
    });
    if let Ok(mut children) = CHILDREN.lock() {
        children.push((pid as i32, signal, cleanup));
    }
    Ok(pid)
}
