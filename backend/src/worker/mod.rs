//! The per-frontend worker: the guest's queues, polling, the receive loop, the counters'
//! rendering, and the shard threads that run the engine beside it.

pub mod counters_desk;
pub mod poll;
pub mod queues;
pub mod receive;
pub mod shard_worker;
