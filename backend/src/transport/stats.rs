//! The transports' counters: one set for both kinds (a counter the other kind never moves
//! stays 0), summed over the halves of a transport and the shards of a device.

/// Transport counters.
#[derive(Clone, Copy, Debug, Default)]
pub struct TransportStats {
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub tx_dropped: u64,
    /// Times the socket buffer was full (EAGAIN): the packets waited for writability.
    pub tx_blocked: u64,
    /// Packets to a destination the egress policy refuses (`--allow-peer`): dropped.
    pub tx_denied: u64,
    pub tx_wrong_family: u64,
    /// `sendmsg`s that carried several packets as UDP GSO segments, and those packets.
    pub tx_gso_sends: u64,
    pub tx_gso_segments: u64,
    /// GSO sends the kernel refused as GSO (EINVAL, EIO, EOPNOTSUPP): their packets went out
    /// one by one; after `GSO_REFUSALS_OFF` (the udp transport) in a row GSO stays off.
    pub tx_gso_refused: u64,
    /// Packets that left from the bound socket's port because no socket could be bound to
    /// their own source port (another program holds it; `crate::transport::sport`).
    pub tx_sport_fallback: u64,
    /// Sockets opened to send from the QPs' own source ports.
    pub tx_sport_sockets: u64,
    /// Of those, open now (a gauge: they close after an idle time; the soaks take them off
    /// the daemon's fd count).
    pub tx_sport_open: u64,
    /// Received messages that were coalesced runs (UDP GRO), and the datagrams in them.
    pub rx_gro_runs: u64,
    pub rx_gro_segments: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub rx_icrc_ok: u64,
    /// IPv4 packets verified by solving for the IP ID (a sender other than ID 0, e.g. rxe),
    /// whose ID lies in a window of its source's ID sequence.
    pub rx_icrc_id_solved: u64,
    /// IPv4 packets dropped although an IP ID explains their ICRC: the ID lies outside every
    /// window of its source (a sequence not seen yet, or one that jumped), and is learned.
    pub rx_icrc_id_learned: u64,
    /// Of `rx_icrc_id_solved`, UD and UC packets accepted with the full solve because their
    /// source had no live window (its first packet, or its first after an idle time).
    pub rx_icrc_id_opened: u64,
    /// IPv4 ID solves run (packets whose ICRC failed the exact check but passed the cheap
    /// ones: source allowed, BTH worth a look).
    pub rx_icrc_solves: u64,
    /// IPv4 packets not solved because they are for no live QP of the device (nor QP1,
    /// nor multicast): junk, or a QP's stragglers after it was destroyed.
    pub rx_icrc_no_qp: u64,
    pub rx_icrc_bad: u64,
    pub rx_short: u64,
    /// Receive errors other than "nothing waiting" (ICMP errors reported on the socket, …).
    pub rx_errors: u64,
    /// Datagrams dropped because no guest memory was there to take them yet.
    pub rx_unattached: u64,
    // The raw transport's own reasons (crate::transport::raw): 0 with the udp transport.
    /// Frames to a destination MAC or IP address that is not ours.
    pub rx_not_ours: u64,
    /// Frames neither IPv4 nor IPv6 (or VLAN-tagged).
    pub rx_bad_ethertype: u64,
    /// Bad IP version, header length, total length, protocol, or a fragment.
    pub rx_bad_ip: u64,
    pub rx_ip_checksum_bad: u64,
    /// Bad UDP length, destination port, or non-zero checksum.
    pub rx_bad_udp: u64,
    /// Frames the ring held only part of.
    pub rx_truncated: u64,
    /// Frames the kernel dropped because the receive ring was full.
    pub rx_ring_lost: u64,
    /// Packets whose address vector has no destination MAC.
    pub tx_no_dmac: u64,
    /// Packets from a source GID that is none of our addresses.
    pub tx_bad_source: u64,
    /// ARP requests for one of our IPv4 addresses answered with our MAC.
    pub arp_replies: u64,
    /// IPv6 neighbour solicitations for one of our addresses answered with our MAC.
    pub nd_adverts: u64,
    /// ARP and ICMPv6 frames that reached us but asked nothing we answer (replies, other
    /// targets, malformed solicitations).
    pub rx_arp_ignored: u64,
}

impl TransportStats {
    /// The sum of two sets of counters (the worker's and the I/O thread's halves).
    pub fn plus(mut self, o: &TransportStats) -> TransportStats {
        self.tx_packets += o.tx_packets;
        self.tx_bytes += o.tx_bytes;
        self.tx_dropped += o.tx_dropped;
        self.tx_blocked += o.tx_blocked;
        self.tx_denied += o.tx_denied;
        self.tx_wrong_family += o.tx_wrong_family;
        self.tx_gso_sends += o.tx_gso_sends;
        self.tx_gso_segments += o.tx_gso_segments;
        self.tx_gso_refused += o.tx_gso_refused;
        self.tx_sport_fallback += o.tx_sport_fallback;
        self.tx_sport_sockets += o.tx_sport_sockets;
        self.tx_sport_open += o.tx_sport_open;
        self.rx_gro_runs += o.rx_gro_runs;
        self.rx_gro_segments += o.rx_gro_segments;
        self.rx_packets += o.rx_packets;
        self.rx_bytes += o.rx_bytes;
        self.rx_icrc_ok += o.rx_icrc_ok;
        self.rx_icrc_id_solved += o.rx_icrc_id_solved;
        self.rx_icrc_id_learned += o.rx_icrc_id_learned;
        self.rx_icrc_id_opened += o.rx_icrc_id_opened;
        self.rx_icrc_solves += o.rx_icrc_solves;
        self.rx_icrc_no_qp += o.rx_icrc_no_qp;
        self.rx_icrc_bad += o.rx_icrc_bad;
        self.rx_short += o.rx_short;
        self.rx_errors += o.rx_errors;
        self.rx_unattached += o.rx_unattached;
        self.rx_not_ours += o.rx_not_ours;
        self.rx_bad_ethertype += o.rx_bad_ethertype;
        self.rx_bad_ip += o.rx_bad_ip;
        self.rx_ip_checksum_bad += o.rx_ip_checksum_bad;
        self.rx_bad_udp += o.rx_bad_udp;
        self.rx_truncated += o.rx_truncated;
        self.rx_ring_lost += o.rx_ring_lost;
        self.tx_no_dmac += o.tx_no_dmac;
        self.tx_bad_source += o.tx_bad_source;
        self.arp_replies += o.arp_replies;
        self.nd_adverts += o.nd_adverts;
        self.rx_arp_ignored += o.rx_arp_ignored;
        self
    }
}
