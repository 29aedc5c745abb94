//! What a debug file holds, checked before it is kept: an ELF file with a GNU build id,
//! its sections inside the file, its compressed sections inflating to a bounded size,
//! and DWARF whose units parse. A file that fails is refused with a reason that is
//! counted; it never reaches the resolver.

use std::borrow::Cow;
use std::io::Read;
use std::path::Path;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};
use serde::Serialize;

/// What a debug file can name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Contents {
    /// The GNU build id, lower-case hex.
    pub build_id: String,
    pub bytes: u64,
    /// Function symbols in `.symtab`: names for addresses.
    pub symbols: u64,
    /// `.debug_line`: file and line of each address.
    pub lines: bool,
    /// `DW_TAG_inlined_subroutine` entries: inlined calls as frames of their own.
    pub inline_frames: bool,
    /// `.gopclntab`: a Go binary's own function and line table, which stripping keeps.
    pub go_pclntab: bool,
    /// The executable segments' (virtual address, size in memory): where a mapping of
    /// the binary's text lands in the file's address space ([`Contents::virtual_address`]).
    #[serde(skip)]
    pub text_segments: Vec<(u64, u64)>,
    /// The bytes a reader parses: its DWARF and symbol tables, compressed ones as inflated.
    #[serde(skip)]
    pub tables: u64,
}

/// The page size mappings are aligned to (x86-64, and arm64's common 4 KiB kernels).
const PAGE: u64 = 4096;

impl Contents {
    /// What reading the file is taken to cost in memory ([`crate::resolver`]): the
    /// tables it parses. blazesym's were measured at about 0.9 byte per byte of DWARF
    /// (docs/benchmarks.md); the code and data of an unstripped binary cost nothing.
    pub fn weight(&self) -> u64 {
        self.tables
    }

    /// The address in the file's own address space (what its symbols and DWARF use) of
    /// `address` in a process that mapped the binary's text at `start..limit`.
    ///
    /// A debug file (`objcopy --only-keep-debug`, `eu-strip -f`) keeps the program
    /// headers' virtual addresses and sizes but zeroes their file offsets, so the file
    /// offset a profile records cannot be turned into an address through it. The mapping
    /// itself can: the kernel maps a segment from the page holding its start, so the
    /// mapping's first byte is the segment's virtual address rounded down to a page.
    /// Which executable segment a mapping is, when a binary has several, follows from
    /// their sizes.
    pub fn virtual_address(&self, start: u64, limit: u64, address: u64) -> Option<u64> {
        let span = limit.checked_sub(start)?;
        let segment = self.text_segments.iter().min_by_key(|(vaddr, size)| {
            let mapped = (vaddr % PAGE + size).div_ceil(PAGE) * PAGE;
            mapped.abs_diff(span)
        })?;
        let base = segment.0 - segment.0 % PAGE;
        let vaddr = address.checked_sub(start)?.checked_add(base)?;
        (vaddr < segment.0.saturating_add(segment.1)).then_some(vaddr)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("reading the file: {0}")]
    Io(#[from] std::io::Error),
    #[error("{bytes} bytes is more than the {limit} allowed (symbolization.max_debuginfo_bytes)")]
    TooLarge { bytes: u64, limit: u64 },
    #[error("not an ELF file: {0}")]
    NotElf(String),
    #[error("the ELF file has no GNU build id note")]
    NoBuildId,
    #[error("the file's build id is {found}, not {expected}")]
    OtherBuildId { expected: String, found: String },
    #[error("section {section} is outside the file or unreadable: {source}")]
    BadSection {
        section: String,
        source: object::Error,
    },
    #[error("symbol {0:?} ends past the end of the address space")]
    BadSymbol(String),
    #[error("compressed sections inflate to {bytes} bytes, more than the {limit} allowed")]
    Inflates { bytes: u64, limit: u64 },
    #[error("section {section} does not inflate: {source}")]
    BadCompression {
        section: String,
        source: std::io::Error,
    },
    #[error("DWARF in {section} does not parse: {source}")]
    BadDwarf {
        section: &'static str,
        source: gimli::Error,
    },
    #[error("the file holds nothing to name addresses with (no symbols, no DWARF, no .gopclntab)")]
    Empty,
    #[error("the Go binary's .gopclntab, all it names with, does not parse: {0}")]
    BadGoTable(#[source] crate::go::CheckError),
}

impl Refused {
    /// The reason's label on `kiln_symbolization_refused_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Refused::Io(_) => "io",
            Refused::TooLarge { .. } => "too_large",
            Refused::NotElf(_) => "not_elf",
            Refused::NoBuildId => "no_build_id",
            Refused::OtherBuildId { .. } => "other_build_id",
            Refused::BadSection { .. } => "bad_section",
            Refused::BadSymbol(_) => "bad_symbol",
            Refused::Inflates { .. } => "inflates",
            Refused::BadCompression { .. } => "bad_compression",
            Refused::BadDwarf { .. } => "bad_dwarf",
            Refused::Empty => "empty",
            Refused::BadGoTable(_) => "bad_gopclntab",
        }
    }
}

/// Whether `text` is a build id as Kiln keys them: 2 to 64 bytes in lower-case hex.
pub fn valid_build_id(text: &str) -> bool {
    (4..=128).contains(&text.len())
        && text.len().is_multiple_of(2)
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// Checks the file at `path` and says what it holds; `limit` bounds its size and what its
/// compressed sections inflate to.
pub fn inspect(path: &Path, limit: u64) -> Result<Contents, Refused> {
    let file = std::fs::File::open(path)?;
    let bytes = file.metadata()?.len();
    if bytes > limit {
        return Err(Refused::TooLarge { bytes, limit });
    }
    let cache = object::ReadCache::new(file);
    let elf = object::File::parse(&cache).map_err(|e| Refused::NotElf(e.to_string()))?;
    if elf.format() != object::BinaryFormat::Elf {
        return Err(Refused::NotElf(format!("{:?}", elf.format())));
    }
    let build_id = match elf.build_id() {
        Ok(Some(id)) if !id.is_empty() && id.len() <= 64 => hex(id),
        Ok(_) => return Err(Refused::NoBuildId),
        Err(source) => {
            return Err(Refused::BadSection {
                section: "build id note".into(),
                source,
            })
        }
    };
    let mut inflated = 0u64;
    let mut tables = 0u64;
    for section in elf.sections() {
        let range = section
            .compressed_file_range()
            .map_err(|source| Refused::BadSection {
                section: section.name().unwrap_or("?").to_string(),
                source,
            })?;
        if range.format != object::CompressionFormat::None {
            inflated = inflated.saturating_add(range.uncompressed_size);
        }
        let name = section.name().unwrap_or("");
        if name.starts_with(".debug_")
            || name.starts_with(".zdebug_")
            || matches!(name, ".symtab" | ".strtab" | ".dynsym" | ".dynstr")
        {
            tables = tables.saturating_add(range.uncompressed_size);
        }
    }
    if inflated > limit {
        return Err(Refused::Inflates {
            bytes: inflated,
            limit,
        });
    }
    // Each zlib section inflates to exactly the size it declares: the reader sizes its
    // buffer from the declaration (and blazesym asserts the two agree).
    for section in elf.sections() {
        check_inflation(&section)?;
    }
    // A symbol whose end overflows the address space is no symbol (and trips readers).
    if let Some(symbol) = elf
        .symbols()
        .chain(elf.dynamic_symbols())
        .find(|s| s.address().checked_add(s.size()).is_none())
    {
        return Err(Refused::BadSymbol(
            symbol.name().unwrap_or("?").chars().take(200).collect(),
        ));
    }
    let symbols = elf
        .symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.is_definition() && s.size() > 0)
        .count() as u64;
    let present = |name: &str| {
        elf.section_by_name(name)
            .or_else(|| elf.section_by_name(&name.replacen(".debug_", ".zdebug_", 1)))
            .filter(|s| s.kind() != object::SectionKind::UninitializedData && s.size() > 0)
    };
    let lines = present(".debug_line").is_some();
    let inline_frames = match (present(".debug_info"), present(".debug_abbrev")) {
        (Some(info), Some(abbrev)) => {
            let info = section_data(&info)?;
            let abbrev = section_data(&abbrev)?;
            match (info, abbrev) {
                (Some(info), Some(abbrev)) => {
                    has_inlined_subroutines(&info, &abbrev, elf.is_little_endian())?
                }
                // zstd-compressed: present, not looked into here (the resolver reads it).
                _ => false,
            }
        }
        _ => false,
    };
    let go_pclntab = elf.section_by_name(".gopclntab").is_some();
    let text_segments = elf
        .segments()
        .filter(|s| matches!(s.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0))
        .map(|s| (s.address(), s.size()))
        .filter(|(_, size)| *size > 0)
        .collect();
    if symbols == 0 && !lines && !go_pclntab {
        return Err(Refused::Empty);
    }
    let mut contents = Contents {
        build_id,
        bytes,
        symbols,
        lines,
        inline_frames,
        go_pclntab,
        text_segments,
        tables,
    };
    if crate::go::only_table(&contents) {
        // All it names with is the table: it must parse, and its inline trees say
        // whether inlined calls come out as frames.
        let file = std::fs::File::open(path)?;
        // SAFETY: the file is the caller's, written whole before it is inspected; no
        // one writes to it while it is mapped here.
        let map = unsafe { memmap2::Mmap::map(&file) }?;
        let table = crate::go::check(&map).map_err(Refused::BadGoTable)?;
        contents.inline_frames = table.inlining;
        tracing::debug!(
            functions = table.functions,
            layout = %table.layout,
            inlining = table.inlining,
            "a Go binary named from its .gopclntab"
        );
    }
    Ok(contents)
}

/// A section's bytes, inflated when zlib-compressed; `None` for a compression this does
/// not read (zstd). [`inspect`] bounded the inflated sizes before this runs.
fn section_data<'a>(
    section: &object::Section<'a, '_, &'a object::ReadCache<std::fs::File>>,
) -> Result<Option<Cow<'a, [u8]>>, Refused> {
    let name = || section.name().unwrap_or("?").to_string();
    let range = section
        .compressed_file_range()
        .map_err(|source| Refused::BadSection {
            section: name(),
            source,
        })?;
    let compressed = section
        .compressed_data()
        .map_err(|source| Refused::BadSection {
            section: name(),
            source,
        })?;
    match range.format {
        object::CompressionFormat::None => Ok(Some(Cow::Borrowed(compressed.data))),
        object::CompressionFormat::Zlib => {
            let mut out = Vec::with_capacity(range.uncompressed_size.min(1 << 30) as usize);
            flate2::read::ZlibDecoder::new(compressed.data)
                .take(range.uncompressed_size)
                .read_to_end(&mut out)
                .map_err(|source| Refused::BadCompression {
                    section: name(),
                    source,
                })?;
            Ok(Some(Cow::Owned(out)))
        }
        _ => Ok(None),
    }
}

/// A zlib-compressed section's stream, inflated and counted (not kept): an error unless it
/// ends at exactly its declared size.
fn check_inflation<'a>(
    section: &object::Section<'a, '_, &'a object::ReadCache<std::fs::File>>,
) -> Result<(), Refused> {
    let name = || section.name().unwrap_or("?").to_string();
    let bad = |source| Refused::BadSection {
        section: name(),
        source,
    };
    let range = section.compressed_file_range().map_err(bad)?;
    if range.format != object::CompressionFormat::Zlib {
        return Ok(());
    }
    let compressed = section.compressed_data().map_err(bad)?;
    let mut decoder = flate2::read::ZlibDecoder::new(compressed.data);
    // One byte past the declaration tells a longer stream from an exact one.
    let inflated = std::io::copy(
        &mut (&mut decoder).take(range.uncompressed_size.saturating_add(1)),
        &mut std::io::sink(),
    )
    .map_err(|source| Refused::BadCompression {
        section: name(),
        source,
    })?;
    if inflated != range.uncompressed_size {
        return Err(Refused::BadCompression {
            section: name(),
            source: std::io::Error::other(format!(
                "inflates to {inflated} bytes, not the {} declared",
                range.uncompressed_size
            )),
        });
    }
    Ok(())
}

/// Walks the DWARF units' entries until one is an inlined call; every unit header and
/// entry on the way must parse.
fn has_inlined_subroutines(info: &[u8], abbrev: &[u8], little: bool) -> Result<bool, Refused> {
    let endian = if little {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let bad = |section| move |source| Refused::BadDwarf { section, source };
    let info = gimli::DebugInfo::new(info, endian);
    let abbrev = gimli::DebugAbbrev::new(abbrev, endian);
    let mut units = info.units();
    while let Some(header) = units.next().map_err(bad(".debug_info"))? {
        let abbreviations = header
            .abbreviations(&abbrev)
            .map_err(bad(".debug_abbrev"))?;
        let mut entries = header.entries(&abbreviations);
        while let Some(entry) = entries.next_dfs().map_err(bad(".debug_info"))? {
            if entry.tag() == gimli::DW_TAG_inlined_subroutine {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_ids_are_lower_case_hex_of_whole_bytes() {
        assert!(valid_build_id("0123456789abcdef0123456789abcdef01234567"));
        assert!(!valid_build_id("0123456789ABCDEF"));
        assert!(!valid_build_id("abc"));
        assert!(!valid_build_id("../../etc/passwd"));
        assert!(!valid_build_id(""));
    }

    #[test]
    fn what_is_not_elf_is_refused_with_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x");
        std::fs::write(&path, b"\x7fELF\x02\x01\x01 truncated").unwrap();
        assert_eq!(inspect(&path, 1 << 20).unwrap_err().reason(), "not_elf");
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        assert_eq!(inspect(&path, 1 << 20).unwrap_err().reason(), "not_elf");
        assert_eq!(inspect(&path, 100).unwrap_err().reason(), "too_large");
    }

    /// The test binary itself: an ELF file with a build id, symbols and DWARF.
    #[test]
    fn the_test_binary_names_itself() {
        let me = std::env::current_exe().unwrap();
        let contents = inspect(&me, 4 << 30).unwrap();
        assert!(valid_build_id(&contents.build_id), "{contents:?}");
        assert!(contents.symbols > 100, "{contents:?}");
        assert!(contents.lines, "{contents:?}");
    }
}
