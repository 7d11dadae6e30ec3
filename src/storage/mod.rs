//! Durable log building blocks (overview written below once the pieces exist).

pub mod dir;
pub mod format;
pub mod index;
pub mod recovery;
pub mod segment;
