//! `rxe-core`: a sans-IO RoCEv2 transport engine, wire-compatible with Linux `rdma_rxe`.
//!
//! The crate holds the protocol and nothing else: no sockets, threads or clocks. Packets go in and
//! out as byte buffers, time is an argument, and memory (MRs, queues) is reached through the
//! [`mem::Memory`] trait so that the same engine serves guest memory in the daemon and plain
//! vectors in tests.
//!
//! Transports: RC, UC, UD (and the GSI QP), as Linux rxe, and XRC, which rxe has not: XRC
//! domains, XRC SRQs and the XRC INI / XRC TGT QP types (IBTA annex A14; see `xrc.rs`). The
//! device contract does not offer XRC yet.

pub mod icrc;
pub mod mem;
#[cfg(feature = "testing")]
pub mod pcap;
pub mod types;
pub mod verbs;
pub mod wire;

pub use types::{Gid, Instant, Psn, Qpn};

mod brlock;
mod comp;
mod complete;
pub mod device;
pub mod qp;
mod req;
mod resp;
mod shared;
mod slab;
mod timers;
mod xrc;

pub use device::{Device, DeviceConfig, QpInit, RecvMeta, Transmit};
pub use qp::QpCounters;
pub use verbs::VerbError;
#[cfg(feature = "testing")]
pub mod sim;
