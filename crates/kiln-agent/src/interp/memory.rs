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

    /// Reads many ranges with as few system calls as they allow (one, unless a range is
    /// unmapped): `out` receives them one after another, and each range says whether it
    /// was read whole.
    pub fn read_many(&self, ranges: &[(u64, usize)], out: &mut [u8]) -> Vec<bool> {
        let mut read = vec![false; ranges.len()];
        let total: usize = ranges.iter().map(|(_, len)| len).sum();
        if out.len() < total {
            return read;
        }
        let starts: Vec<usize> = ranges
            .iter()
            .scan(0, |at, (_, len)| {
                let start = *at;
                *at += len;
                Some(start)
            })
            .collect();
        let mut next = 0;
        while next < ranges.len() {
            // The kernel takes at most IOV_MAX (1024) ranges a call.
            let batch = &ranges[next..ranges.len().min(next + 1024)];
            let remote: Vec<libc::iovec> = batch
                .iter()
                .map(|(address, len)| libc::iovec {
                    iov_base: *address as *mut libc::c_void,
                    iov_len: *len,
                })
                .collect();
            let from = starts[next];
            let len: usize = batch.iter().map(|(_, len)| len).sum();
            let local = libc::iovec {
                iov_base: out[from..].as_mut_ptr().cast(),
                iov_len: len,
            };
            // SAFETY: `local` describes `len` writable bytes of `out` (checked above to
            // hold every range); the remote ranges are only read by the kernel, which
            // checks them.
            let got = unsafe {
                libc::process_vm_readv(
                    self.pid as libc::pid_t,
                    &local,
                    1,
                    remote.as_ptr(),
                    remote.len() as libc::c_ulong,
                    0,
                )
            };
            // The kernel stops at the first range it cannot read: those before it are
            // whole, that one is not, and the rest are tried again.
            let mut done = usize::try_from(got).unwrap_or(0);
            let mut whole = 0;
            for (_, len) in batch {
                if done < *len {
                    break;
                }
                done -= len;
                whole += 1;
            }
            for flag in &mut read[next..next + whole] {
                *flag = true;
            }
            next += whole + usize::from(whole < batch.len());
        }
        read
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

    /// A NUL-terminated string of at most `max` bytes; `None` without its NUL. One read,
    /// or, for a string at the very end of its mapping, a byte at a time.
    pub fn c_string(&self, address: u64, max: usize) -> Option<String> {
        let mut bytes = vec![0u8; max];
        let len = if self.read(address, &mut bytes) {
            max
        } else {
            let mut len = 0;
            while len < max
                && self.read(address.wrapping_add(len as u64), &mut bytes[len..len + 1])
                && bytes[len] != 0
            {
                len += 1;
            }
            // Stopped at its NUL (kept), or at unreadable memory (none).
            if len < max && bytes[len] == 0 {
                len + 1
            } else {
                len
            }
        };
        let end = bytes[..len].iter().position(|b| *b == 0)?;
        Some(String::from_utf8_lossy(&bytes[..end]).into_owned())
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
        let c = b"kiln\0rest";
        assert_eq!(
            memory.c_string(c.as_ptr() as u64, 8).as_deref(),
            Some("kiln")
        );
        // No NUL within `max`: not a string.
        assert_eq!(memory.c_string(c.as_ptr() as u64, 3), None);
    }

    #[test]
    fn many_ranges_are_read_at_once_and_an_unmapped_one_fails_alone() {
        let values: [u64; 3] = [11, 22, 33];
        let memory = Memory {
            pid: std::process::id(),
        };
        let at = |i: usize| &values[i] as *const u64 as u64;
        let ranges = [(at(0), 8), (8, 8), (at(2), 8), (at(1), 4)];
        let mut out = [0u8; 28];
        assert_eq!(
            memory.read_many(&ranges, &mut out),
            vec![true, false, true, true]
        );
        assert_eq!(u64::from_ne_bytes(out[0..8].try_into().unwrap()), 11);
        assert_eq!(u64::from_ne_bytes(out[16..24].try_into().unwrap()), 33);
        assert_eq!(u32::from_ne_bytes(out[24..28].try_into().unwrap()), 22);
        assert_eq!(memory.read_many(&ranges, &mut [0u8; 4]), vec![false; 4]);
    }
}
