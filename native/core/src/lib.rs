//! kai-ray's scheduling core in Rust: the same decisions as the Python core (`kai_ray/core`),
//! module for module, so either can be read next to the other. Pure: no I/O, no clock (the
//! caller passes one to time actions), no randomness; the Python bindings live in
//! `kai-ray-native`. The Python core stays the reference: tests compare the two decision by
//! decision.

pub mod accounting;
pub mod actions;
pub mod capacity;
pub mod cluster;
pub mod constraints;
pub mod fairshare;
pub mod jobs;
pub mod model;
pub mod ordering;
pub mod packing;
pub mod placement;
pub mod pyfmt;
pub mod queuetree;
pub mod schedule;
pub mod scratch;
pub mod state;
pub mod statement;

pub use schedule::{schedule, CycleOutput};
