//! Reads another process's memory with `process_vm_readv`: one system call per read, no
//! ptrace stop, nothing written. A read of memory the process has unmapped, or of a
//! process that is gone, fails and the caller falls back.

/// The memory of one process.
#[derive(Debug, Clone, Copy)]
pub struct Memory {
    pub pid: u32,
}

impl Memory {
    /// Fills `out` from `address`; false unless every byte was read.
    pub fn read(&self, address: u64, out: &mut [u8]) -> bool {
        if out.is_empty() {
            return true;
        }
        let local = libc::iovec {
            iov_base: out.as_mut_ptr().cast(),
            iov_len: out.len(),
        };
        let remote = libc::iovec {
            iov_base: address as *mut libc::c_void,
            iov_len: out.len(),
        };
        // SAFETY: `local` describes `out`, which is writable for its length; the remote
        // range is only read by the kernel, which checks it.
        let read =
            unsafe { libc::process_vm_readv(self.pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        read == out.len() as isize
    }

    pub fn u64(&self, address: u64) -> Option<u64> {
        let mut bytes = [0u8; 8];
        self.read(address, &mut bytes)
            .then(|| u64::from_ne_bytes(bytes))
    }

    pub fn u32(&self, address: u64) -> Option<u32> {
        let mut bytes = [0u8; 4];
        self.read(address, &mut bytes)
            .then(|| u32::from_ne_bytes(bytes))
    }

    /// `len` bytes, at most `limit`.
    pub fn bytes(&self, address: u64, len: usize, limit: usize) -> Option<Vec<u8>> {
        if len > limit {
            return None;
        }
        let mut out = vec![0u8; len];
        self.read(address, &mut out).then_some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_memory_and_fails_on_unmapped_addresses() {
        let value: u64 = 0x1122_3344_5566_7788;
        let memory = Memory {
            pid: std::process::id(),
        };
        assert_eq!(memory.u64(&value as *const u64 as u64), Some(value));
        assert_eq!(memory.u64(8), None);
        let text = b"kiln";
        assert_eq!(
            memory.bytes(text.as_ptr() as u64, 4, 16).as_deref(),
            Some(&text[..])
        );
        assert_eq!(memory.bytes(text.as_ptr() as u64, 32, 16), None);
    }
}
