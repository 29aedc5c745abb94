//! Frame names from a dataset's symbol tables.

use kiln_storage::Dataset;

/// Resolves the frames of each location, outermost caller first (pprof lists inlined
/// frames innermost first), as names for flame graphs.
pub struct FrameNames<'a> {
    dataset: &'a Dataset,
    line_offsets: Vec<u32>,
}

impl<'a> FrameNames<'a> {
    pub fn new(dataset: &'a Dataset) -> Self {
        FrameNames {
            dataset,
            line_offsets: dataset.location_line_offsets(),
        }
    }

    /// Calls `emit` with each frame name of `location`, outermost first.
    pub fn for_each_frame(&self, location: u32, mut emit: impl FnMut(&str)) {
        self.for_each_frame_id(location, |_, name| emit(name));
    }

    /// As [`Self::for_each_frame`], with the name's id in the dataset's string table where
    /// it is one (`None` for `[unknown]` and unsymbolized addresses): a caller folding many
    /// stack nodes can then look each distinct name up once per dataset, not once per frame.
    pub fn for_each_frame_id(&self, location: u32, mut emit: impl FnMut(Option<u32>, &str)) {
        let location = location as usize;
        let (Some(start), Some(end)) = (
            self.line_offsets.get(location),
            self.line_offsets.get(location + 1),
        ) else {
            emit(None, "[unknown]");
            return;
        };
        if start == end {
            emit(None, &self.unsymbolized(location));
            return;
        }
        for line in (*start..*end).rev() {
            let function = self.dataset.line_function[line as usize] as usize;
            match self.dataset.functions.get(function) {
                Some(function) => {
                    let id = match self.dataset.string(function.name) {
                        "" => function.system_name,
                        _ => function.name,
                    };
                    emit(Some(id), self.dataset.string(id));
                }
                None => emit(None, "[unknown]"),
            }
        }
    }

    /// Calls `emit` with each frame of `location` that has a function, outermost first:
    /// its name (as [`Self::for_each_frame`] gives it), its file and its line (0 when the
    /// profile did not say).
    pub fn for_each_line(&self, location: u32, mut emit: impl FnMut(&str, &str, i64)) {
        let location = location as usize;
        let (Some(start), Some(end)) = (
            self.line_offsets.get(location),
            self.line_offsets.get(location + 1),
        ) else {
            return;
        };
        for line in (*start..*end).rev() {
            let function = self.dataset.line_function[line as usize] as usize;
            let Some(function) = self.dataset.functions.get(function) else {
                continue;
            };
            let mut name = self.dataset.string(function.name);
            if name.is_empty() {
                name = self.dataset.string(function.system_name);
            }
            let number = self
                .dataset
                .line_number
                .get(line as usize)
                .copied()
                .unwrap_or(0);
            emit(name, self.dataset.string(function.filename), number);
        }
    }

    /// The innermost frame's name of `location`: the function a sample's self value
    /// belongs to.
    pub fn leaf(&self, location: u32) -> String {
        let mut leaf = String::new();
        self.for_each_frame(location, |name| {
            leaf.clear();
            leaf.push_str(name);
        });
        leaf
    }

    /// The mapping of a location shown as `module+0xoffset`; `None` for a named location
    /// or one of no file.
    pub fn unnamed_mapping(&self, location: u32) -> Option<u32> {
        let at = location as usize;
        if self.line_offsets.get(at)? != self.line_offsets.get(at + 1)? {
            return None;
        }
        let mapping = *self.dataset.location_mapping.get(at)?;
        let row = self.dataset.mappings.get(mapping as usize)?;
        (row.filename != 0).then_some(mapping)
    }

    /// The binary of `mapping` as its unnamed frames show it, with its build id.
    pub fn binary(&self, mapping: u32) -> Option<crate::api::UnnamedBinary> {
        let row = self.dataset.mappings.get(mapping as usize)?;
        Some(crate::api::UnnamedBinary {
            binary: module(self.dataset.string(row.filename)).to_string(),
            build_id: self.dataset.string(row.build_id).to_string(),
        })
    }

    /// `module+0xoffset` for a frame without symbols, so it can be symbolized later.
    fn unsymbolized(&self, location: usize) -> String {
        let address = self
            .dataset
            .location_address
            .get(location)
            .copied()
            .unwrap_or(0);
        let mapping = self
            .dataset
            .location_mapping
            .get(location)
            .and_then(|m| self.dataset.mappings.get(*m as usize));
        match mapping {
            Some(mapping) if mapping.filename != 0 => {
                let module = module(self.dataset.string(mapping.filename));
                let offset = address
                    .wrapping_sub(mapping.memory_start)
                    .wrapping_add(mapping.file_offset);
                format!("{module}+0x{offset:x}")
            }
            _ => format!("0x{address:x}"),
        }
    }
}

/// A mapping's file as its unnamed frames name it: the last part of its path.
fn module(file: &str) -> &str {
    file.rsplit('/').next().unwrap_or(file)
}
