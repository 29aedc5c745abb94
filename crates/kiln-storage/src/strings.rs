//! A dataset's string table, every string in one buffer.
//!
//! A dataset holds thousands of strings (function names, file names, label values). As a
//! `Vec<String>` each was an allocation of its own: decoding a level-0 dataset spent half
//! its time allocating, and dropping one freed each string separately, often on another
//! thread than the one that allocated it (`perf`, docs/benchmarks.md, "Queries while
//! ingesting"). Here a table is two allocations, the bytes and the end offsets, and a
//! string costs 8 bytes of bookkeeping instead of a 24-byte `String` plus its block.

use std::ops::Index;

#[derive(Clone, Default, PartialEq, Eq)]
pub struct Strings {
    /// Every string, one after the other.
    text: String,
    /// Where each string ends in `text`; string `i` starts where `i - 1` ends.
    ends: Vec<usize>,
}

impl Strings {
    pub fn new() -> Self {
        Strings::default()
    }

    /// Room for `count` strings of `bytes` bytes in all.
    pub fn with_capacity(count: usize, bytes: usize) -> Self {
        Strings {
            text: String::with_capacity(bytes),
            ends: Vec::with_capacity(count),
        }
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn push(&mut self, value: &str) {
        self.text.push_str(value);
        self.ends.push(self.text.len());
    }

    pub fn get(&self, index: usize) -> Option<&str> {
        let end = *self.ends.get(index)?;
        let start = match index {
            0 => 0,
            _ => self.ends[index - 1],
        };
        self.text.get(start..end)
    }

    pub fn first(&self) -> Option<&str> {
        self.get(0)
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.len()).map(|index| &self[index])
    }

    /// Every string's bytes back to back, and where each ends: what the block format's
    /// string column is written from without a copy per string.
    pub fn as_parts(&self) -> (&str, &[usize]) {
        (&self.text, &self.ends)
    }

    /// Heap memory held, for caches to budget by.
    pub fn heap_bytes(&self) -> usize {
        self.text.capacity() + self.ends.capacity() * std::mem::size_of::<usize>()
    }
}

impl Index<usize> for Strings {
    type Output = str;

    /// Panics past the end, as a slice does.
    fn index(&self, index: usize) -> &str {
        match self.get(index) {
            Some(value) => value,
            None => panic!("string {index} of a table of {} strings", self.ends.len()),
        }
    }
}

impl<S: AsRef<str>> FromIterator<S> for Strings {
    fn from_iter<I: IntoIterator<Item = S>>(values: I) -> Self {
        let mut strings = Strings::new();
        for value in values {
            strings.push(value.as_ref());
        }
        strings
    }
}

impl std::fmt::Debug for Strings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_read_back_as_pushed_empty_ones_included() {
        let values = ["", "main", "", "runtime.mallocgc", "é ü ∑"];
        let strings: Strings = values.iter().collect();
        assert_eq!(strings.len(), 5);
        assert_eq!(strings.iter().collect::<Vec<_>>(), values);
        for (index, value) in values.iter().enumerate() {
            assert_eq!(&strings[index], *value);
            assert_eq!(strings.get(index), Some(*value));
        }
        assert_eq!(strings.get(5), None);
        assert_eq!(strings.first(), Some(""));
        assert_eq!(Strings::new().first(), None);
        assert_eq!(format!("{strings:?}"), format!("{values:?}"));
        let (text, ends) = strings.as_parts();
        assert_eq!(text, "mainruntime.mallocgcé ü ∑");
        assert_eq!(ends, &[0, 4, 4, 20, text.len()]);
    }
}
