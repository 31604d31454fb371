//! A test guest for vhost-user-rdma. It plays two parts, following docs/virtio-rdma.md:
//!
//! - **the VMM**: a vhost-user frontend on the daemon's unix socket, guest RAM in memfds the
//!   daemon maps, and the three split virtqueues it drives ([`Guest::connect`]);
//! - **the guest driver + librxe**: control commands on vq 0, rings in the Linux rxe user ABI
//!   that it fills and reads itself (send WQEs, receive WQEs, `ib_uverbs_wc`), doorbells on
//!   vq 1, events on vq 2, behind a small verbs-like API.
//!
//! User buffers and rings are mapped into this process the way a guest process sees them:
//! a contiguous virtual range backed by scattered guest-physical pages (each page `mmap`ed
//! from the memfd at its own offset), so page lists are really exercised.
//!
//! The rooms, lowest first: [`error`]; the VMM's side, [`ram`] (guest RAM, guest-process views)
//! and [`virtq`] (split virtqueues); the driver's side, [`rings`] (rxe-ABI queue buffers and the
//! objects owning them), [`wqe`] (work queue entries) and [`driver`] ([`Guest`]); apart from the
//! guest, [`daemon`] (daemon processes); above both, [`node`] (a daemon with its guest, QP pairs)
//! and [`perf`] (measurements); [`net`], [`cloud_hypervisor`], [`scale`] and [`netns`] beside.

pub mod cloud_hypervisor;
pub mod daemon;
pub mod driver;
pub mod error;
pub mod net;
pub mod netns;
pub mod node;
pub mod perf;
pub mod ram;
pub mod rings;
pub mod scale;
pub mod virtq;
pub mod wqe;

pub use daemon::{find_daemon, json_u64, loopback_pair, pin_current_thread, Daemon};
pub use driver::{Guest, GuestOpts, WorkerHold};
pub use error::{Error, Result};
pub use node::{bring_up, bring_up_l2, connect_qps, ud_dest, ConnOpts, End, Node};
pub use ram::{GuestRam, VaMap, GPA_BASE, PAGE};
pub use rings::{Cq, Mr, Qp, QueueBuf, Srq, Wc};
pub use vhost_user_rdma::abi;
pub use virtq::Virtq;
pub use wqe::{encode_send_wqe, reg_mr_slot};
