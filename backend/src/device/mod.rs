//! The device model: the virtio-rdma control commands, the guest's work and completion rings,
//! asynchronous events, and the engine pumping, testable without a vhost-user socket.

pub mod events;
pub mod model;
pub mod ring;
