//! Go binaries with no symbols and no DWARF (`-ldflags="-s -w"`) named from the
//! `.gopclntab` that stripping keeps ([`kiln_gosym`]). The uploaded file is then the
//! stripped binary itself: no debug file of it exists, and none is needed.

use std::path::Path;

use kiln_gosym::elf::image;
use kiln_gosym::Table;

use kiln_model::symbols::Frame;

/// Whether a file is named here rather than by blazesym: a `.gopclntab` and nothing else
/// to name with. (An unstripped Go binary has `.symtab` and DWARF with its inlined calls,
/// which blazesym reads.)
pub(crate) fn only_table(contents: &crate::Contents) -> bool {
    contents.go_pclntab && contents.symbols == 0 && !contents.lines
}

/// Parses the table of an ELF file read whole, so it can be checked at upload.
pub(crate) fn check(bytes: &[u8]) -> Result<Describe, CheckError> {
    let elf = object::File::parse(bytes).map_err(CheckError::Elf)?;
    let image = image(&elf).ok_or(CheckError::NoTable)?;
    let table = Table::new(image).map_err(CheckError::Table)?;
    Ok(Describe {
        functions: table.functions(),
        layout: table.layout().to_string(),
        inlining: table.inlining(),
    })
}

pub(crate) struct Describe {
    pub functions: usize,
    pub layout: String,
    pub inlining: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("not an ELF file: {0}")]
    Elf(object::Error),
    #[error("no readable .gopclntab section")]
    NoTable,
    #[error(transparent)]
    Table(kiln_gosym::Error),
}

/// The frames at each virtual address, innermost first; none where the table names none.
pub(crate) fn resolve(path: &Path, addresses: &[u64]) -> Vec<Vec<Frame>> {
    let none = || vec![Vec::new(); addresses.len()];
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(err) => {
            tracing::warn!(error = %err, file = %path.display(), "opening a Go binary");
            return none();
        }
    };
    // SAFETY: files in the debug-file cache are written once under a temporary name and
    // renamed into place; none is written to while mapped.
    let map = match unsafe { memmap2::Mmap::map(&file) } {
        Ok(map) => map,
        Err(err) => {
            tracing::warn!(error = %err, file = %path.display(), "mapping a Go binary");
            return none();
        }
    };
    let table = object::File::parse(&*map)
        .ok()
        .and_then(|elf| Table::new(image(&elf)?).ok());
    let Some(table) = table else {
        tracing::warn!(file = %path.display(), "a Go binary's .gopclntab did not parse");
        return none();
    };
    addresses
        .iter()
        .map(|address| {
            table
                .frames(*address)
                .into_iter()
                .map(|frame| Frame {
                    name: frame.function.to_string(),
                    file: frame.file.to_string(),
                    line: i64::from(frame.line),
                })
                .collect()
        })
        .collect()
}
