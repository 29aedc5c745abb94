//! The crash tests' hook: with `KILN_TEST_CRASH_AT=<point>` in the environment, the
//! process kills itself with SIGKILL when it reaches that point, exactly as `kill -9` at
//! the worst moment would. Each crate names its points where it calls [`point`].

/// Dies here when `KILN_TEST_CRASH_AT` names `point`; otherwise does nothing.
pub fn point(point: &str) {
    static CRASH_AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let armed = CRASH_AT.get_or_init(|| std::env::var("KILN_TEST_CRASH_AT").ok());
    if armed.as_deref() == Some(point) {
        eprintln!("KILN_TEST_CRASH_AT={point} reached: killing the process");
        // SAFETY: plain syscalls on this process.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}
