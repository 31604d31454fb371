//! Guest memory: the mapped regions a frontend shares ([`guest_mem`]) and the references into
//! them that a packet carries until a transport sends it ([`payload_ref`]). Below both the device
//! model and the transports; imports only the ABI.

pub mod dmabuf;
pub mod guest_mem;
pub mod payload_ref;
