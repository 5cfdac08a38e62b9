//! The actions of a cycle, in KAI's order: allocate, consolidation, reclaim, preempt, stale-gang
//! eviction (kai_ray/core/actions/).

pub mod allocate;
pub mod common;
pub mod consolidation;
pub mod gpu_room;
pub mod preempt;
pub mod reclaim;
pub mod runtime;
pub mod solver;
pub mod stale;
pub mod victim_stream;
pub mod victims;
