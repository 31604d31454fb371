//! eBPF tcx tap for RoCEv2: a BPF C program on tcx ingress and egress parses
//! Ethernet/VLAN → IPv4/IPv6 → UDP 4791 → BTH and its extension headers, filters in the kernel
//! (QPN, opcode class, IP, AETH syndrome) and copies the parsed headers and each frame, up to
//! the snap length, into a ring buffer; user space writes pcap or pcapng, the parsed headers as
//! text, and a one-line summary per second. `vhost-user-rdma tap` calls
//! [`cli::main_with_args`]. docs/tap.md is the user's guide.

pub mod bpf;
pub mod cli;
pub mod pcap;
pub mod roce;
