//! The `VhostUserBackend` implementation, and nothing else: it answers the frontend's
//! questions (features, config space, queue sizes) and hands every event of the worker
//! thread to the per-frontend [`Worker`]. All events of one frontend connection run on one
//! worker thread.

use std::io;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};

use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost_user_backend::{VhostUserBackend, VringEpollHandler, VringRwLock};
use virtio_bindings::virtio_config::{VIRTIO_F_NOTIFY_ON_EMPTY, VIRTIO_F_VERSION_1};
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{EventConsumer, EventNotifier};
use vmm_sys_util::eventfd::EventFd;

use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};

use crate::abi::{NUM_QUEUES, VQ_CTRL};
use crate::device::model::Model;
use crate::memory::dmabuf::Udmabuf;
use crate::transport::Transport;
use crate::worker::counters_desk::CountersDesk;
use crate::worker::queues::{Listeners, Worker, GM};
use crate::worker::shard_worker::ShardLink;

pub use crate::worker::queues::{
    resume_at_used, COUNTERS_EVENT, IO_EVENT, LINK_EVENT, SAME_HOST_EVENT, TIMER_EVENT, UDP_EVENT,
    UDP_WRITABLE_EVENT, WORK_EVENT,
};

/// Queue size the device offers.
pub const QUEUE_SIZE: usize = 1024;

/// The vhost-user protocol features the device offers. CONFIGURE_MEM_SLOTS lets a VMM add
/// hotplugged memory with ADD_MEM_REG (cloud-hypervisor does, when it is offered) instead of
/// a whole new table, which is limited to 8 regions. Not INFLIGHT_SHMFD: vhost-user-backend
/// refuses its messages, and a device whose objects die with the daemon has nothing in flight
/// worth replaying.
pub fn protocol_features() -> VhostUserProtocolFeatures {
    VhostUserProtocolFeatures::CONFIG
        | VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::REPLY_ACK
        | VhostUserProtocolFeatures::RESET_DEVICE
        | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
}

pub struct VhuRdma {
    worker: Worker,
    /// `--guest-memory dmabuf`: every memory table is mapped again through dma-bufs.
    dmabuf: Option<Arc<Udmabuf>>,
}

impl VhuRdma {
    /// A backend for one frontend connection; `poll_us` is `--poll-us` (0: no polling).
    pub fn new(
        model: Arc<Mutex<Model>>,
        transport: Arc<Mutex<Transport>>,
        poll_us: u32,
        dmabuf: Option<Arc<Udmabuf>>,
    ) -> io::Result<Self> {
        Ok(VhuRdma {
            worker: Worker::new(model, transport, poll_us, crate::counters::render_body)?,
            dmabuf,
        })
    }

    /// Closes the exit-event fds vhost-user-backend leaks. Call only after the
    /// `VhostUserDaemon` that used this backend was dropped (its threads joined).
    pub fn close_exit_fds(&self) {
        self.worker.close_exit_fds();
    }

    pub fn timer_fd(&self) -> RawFd {
        self.worker.timer_fd()
    }

    /// The guest's memory, once the frontend gave its table.
    pub fn memory(&self) -> Option<GM> {
        self.worker.memory()
    }

    /// Where the guest's memory is kept, for the shard threads (`--shard-threads`).
    pub fn memory_slot(&self) -> Arc<Mutex<Option<GM>>> {
        self.worker.memory_slot()
    }

    /// The eventfd that wakes the worker to pump and hand the guest its events.
    pub fn wake_fd(&self) -> Arc<EventFd> {
        self.worker.wake_fd()
    }

    /// `--shard-threads`: how to wake the thread of each shard (index = shard).
    pub fn set_shard_kicks(&self, kicks: Arc<Vec<Arc<EventFd>>>) {
        self.worker.set_shard_kicks(kicks);
    }

    /// `--shard-threads`: the shards' sockets, whose counters add to the transport's.
    pub fn set_shard_links(&self, links: Vec<Arc<ShardLink>>) {
        self.worker.set_shard_links(links);
    }

    pub fn work_fd(&self) -> RawFd {
        self.worker.work_fd()
    }

    pub fn counters_fd(&self) -> RawFd {
        self.worker.counters_fd()
    }

    /// Where counters readers ask the worker for a rendering.
    pub fn counters_desk(&self) -> Arc<CountersDesk> {
        self.worker.counters_desk()
    }

    /// The I/O thread's inbox's eventfd, with `--io-thread`.
    pub fn io_fd(&self) -> Option<RawFd> {
        self.worker.io_fd()
    }

    /// The same-host inbox's eventfd, with `--same-host`.
    pub fn same_host_fd(&self) -> Option<RawFd> {
        self.worker.same_host_fd()
    }

    /// The link under the transport, which the port's state follows.
    pub fn set_link_watch(&self, w: Option<Arc<Mutex<crate::transport::link_watch::LinkWatch>>>) {
        self.worker.set_link_watch(w);
    }

    /// The link watch's fd, with one.
    pub fn link_fd(&self) -> Option<RawFd> {
        self.worker.link_fd()
    }

    /// The epoll handler of the worker thread, for the writability wait.
    pub fn set_epoll_handler(&self, h: &Arc<VringEpollHandler<Arc<VhuRdma>>>) {
        let h: Arc<dyn Listeners> = h.clone();
        self.worker.set_epoll_handler(Arc::downgrade(&h));
    }
}

impl crate::transport::same_host::Driver for VhuRdma {
    /// Another device of the process (`--same-host`) put packets in this one's inbox: this
    /// device's side runs on the sender's thread if its worker is idle ([`Worker::try_drive`]).
    fn try_drive(&self) -> bool {
        self.worker.try_drive()
    }
}

impl VhostUserBackend for VhuRdma {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_F_NOTIFY_ON_EMPTY)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | vhost::vhost_user::message::VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        protocol_features()
    }

    fn reset_device(&self) {
        crate::info_limited!("device reset");
        self.worker.reset();
    }

    fn acked_features(&self, features: u64) {
        self.worker
            .set_notify_on_empty(features & (1 << VIRTIO_F_NOTIFY_ON_EMPTY) != 0);
    }

    fn set_event_idx(&self, enabled: bool) {
        self.worker.set_event_idx(enabled);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let cs = self.worker.config_space();
        let b = vm_memory::ByteValued::as_slice(&cs);
        let start = (offset as usize).min(b.len());
        let end = start.saturating_add(size as usize).min(b.len());
        let mut v = b[start..end].to_vec();
        v.resize(size as usize, 0);
        v
    }

    fn update_memory(&self, mem: GM) -> io::Result<()> {
        let Some(u) = &self.dmabuf else {
            self.worker.set_memory(mem);
            return Ok(());
        };
        // The device keeps no mapping of a table it cannot serve as asked: the table fails
        // whole, and vhost-user-backend ends the connection.
        let ram = u.remap(&mem.memory()).map_err(|e| {
            log::error!("{e}");
            io::Error::other(e.to_string())
        })?;
        log::info!(
            "guest memory: {} region(s) through dma-bufs ({})",
            ram.regions.len(),
            ram.regions
                .iter()
                .map(|r| format!("GPA {:#x} +{} MiB", r.gpa, r.size >> 20))
                .collect::<Vec<_>>()
                .join(", ")
        );
        self.worker.set_memory(GuestMemoryAtomic::new(ram.mem));
        Ok(())
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        // A driver reset stops every queue; stopping the control queue resets the device
        // (the guest may reuse the memory of every ring after a reset).
        if queue_index == VQ_CTRL as u32 {
            crate::info_limited!("control queue stopped: device reset");
            self.worker.reset();
        }
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        self.worker.exit_event()
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> io::Result<()> {
        self.worker.handle(device_event, vrings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ADD_MEM_REG for hotplugged memory (cloud-hypervisor uses it when offered); never
    /// INFLIGHT_SHMFD, whose messages vhost-user-backend refuses.
    #[test]
    fn protocol_features_offered() {
        let f = protocol_features();
        for want in [
            VhostUserProtocolFeatures::CONFIG,
            VhostUserProtocolFeatures::MQ,
            VhostUserProtocolFeatures::REPLY_ACK,
            VhostUserProtocolFeatures::RESET_DEVICE,
            VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS,
        ] {
            assert!(f.contains(want), "{want:?}");
        }
        for not in [
            VhostUserProtocolFeatures::INFLIGHT_SHMFD,
            VhostUserProtocolFeatures::LOG_SHMFD,
            VhostUserProtocolFeatures::BACKEND_REQ,
            VhostUserProtocolFeatures::DEVICE_STATE,
        ] {
            assert!(!f.contains(not), "{not:?}");
        }
    }
}
