//! The sections of an ELF file that [`Table::new`](crate::Table::new) reads, found with
//! `object`, for the agent (binaries on the host) and the server (uploaded files) alike.

use object::{Object, ObjectSection, ObjectSegment};

use crate::{Image, Section};

/// Whether `elf` is named from its `.gopclntab` alone: it has the table and neither
/// `.symtab` nor DWARF (`-ldflags="-s -w"`). An unstripped Go binary's symbols and DWARF,
/// whose inlined calls are there too, are for the ELF symbolizer.
pub fn only_table<'a, R: object::ReadRef<'a>>(elf: &object::File<'a, R>) -> bool {
    elf.section_by_name(".gopclntab").is_some()
        && elf.section_by_name(".symtab").is_none()
        && elf.section_by_name(".debug_info").is_none()
        && elf.section_by_name(".zdebug_info").is_none()
}

/// `.gopclntab` and the sections `moduledata` and the inline trees may be in, with those
/// the linker puts `moduledata` in (`.go.module` from Go 1.26, `.noptrdata` before)
/// first so it is found soonest.
pub fn image<'a, R: object::ReadRef<'a>>(elf: &object::File<'a, R>) -> Option<Image<'a>> {
    let table = elf.section_by_name(".gopclntab")?;
    let pclntab = Section {
        address: table.address(),
        bytes: table.data().ok()?,
    };
    let text = elf.section_by_name(".text").map_or(0, |s| s.address());
    let mut data: Vec<(u8, Section<'a>)> = elf
        .sections()
        .filter(|s| {
            s.address() != 0
                && s.name().is_ok_and(|n| n != ".gopclntab" && n != ".text")
                && matches!(
                    s.kind(),
                    object::SectionKind::Data | object::SectionKind::ReadOnlyData
                )
        })
        .filter_map(|s| {
            let rank = match s.name() {
                Ok(".go.module") => 0,
                Ok(".noptrdata") => 1,
                _ => 2,
            };
            Some((
                rank,
                Section {
                    address: s.address(),
                    bytes: s.data().ok()?,
                },
            ))
        })
        .collect();
    data.sort_by_key(|(rank, _)| *rank);
    Some(Image {
        pclntab,
        text,
        data: data.into_iter().map(|(_, s)| s).collect(),
    })
}

/// The virtual address of a file offset inside one of the file's loaded segments: what a
/// mapping's file offset is in the table's address space.
pub fn address_of_offset<'a, R: object::ReadRef<'a>>(
    elf: &object::File<'a, R>,
    offset: u64,
) -> Option<u64> {
    elf.segments().find_map(|segment| {
        let (start, size) = segment.file_range();
        let inside = offset.checked_sub(start)?;
        (inside < size).then(|| segment.address().checked_add(inside))?
    })
}
