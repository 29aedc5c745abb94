//! What the fuzz targets run; see [`targets`].

pub mod targets;
