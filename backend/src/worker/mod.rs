//! The per-frontend worker: polling the guest's queues and the shard threads that run the engine
//! beside it.

pub mod poll;
pub mod shard_worker;
