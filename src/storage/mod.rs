//! Durable log building blocks (overview written below once the pieces exist).

pub mod format;
