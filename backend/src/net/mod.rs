//! The guest's virtio-net beside its RDMA device (`--net-socket`): the vhost-user-net backend
//! ([`vhu_net`]), the host interface it is bound to ([`net_port`]), what the guest may send and
//! receive ([`net_policy`]), the proxy to another vhost-user-net backend ([`vhost_proxy`]),
//! the `link` subcommand that creates the interface ([`netlink`]), and the probe that says why
//! RoCEv2 cannot be received straight into a dma-buf through the kernel's devmem ([`devmem`]).

pub mod devmem;
pub mod net_policy;
pub mod net_port;
pub mod netlink;
pub mod stats;
pub mod vhost_proxy;
pub mod vhu_net;
