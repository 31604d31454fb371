//! The counters query interface: a unix socket that writes one JSON document to whoever
//! connects, then closes. `socat - UNIX-CONNECT:/path` or `nc -U /path` reads it.

use std::io::Write;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::device::model::Model;
use crate::sync::lock;
use crate::transport::udp::TransportStats;
use crate::transport::Transport;
use crate::unix_socket::SocketAccess;
use crate::worker::counters_desk::CountersDesk;

/// What the counters thread (and the signal thread) can see of the running daemon.
pub struct Shared {
    /// The connected frontend's worker, which renders the counters on its own thread.
    pub backend: Mutex<Option<Arc<CountersDesk>>>,
    pub transport: Arc<Mutex<Transport>>,
    pub connections: AtomicU64,
    pub shutdown: AtomicBool,
    /// The virtio-net device's counters (`--net-socket`), read without a lock.
    pub net: Option<Arc<crate::net::vhu_net::NetStats>>,
    /// The same-host inbox and its counters (`--same-host`), read without a lock.
    pub same_host: Option<Arc<crate::transport::same_host::Inbox>>,
    /// The I/O thread (`--io-thread`): its counters, read without a lock.
    pub io: Option<Arc<crate::transport::io_thread::IoThread>>,
    /// `--shard-threads`: the sockets of engine shards 1 and up, with their counters.
    pub shard_links: Vec<Arc<crate::worker::shard_worker::ShardLink>>,
    /// The link under the transport, which the port's state follows (none for a wildcard
    /// `--udp-addr`).
    pub link: Option<Arc<Mutex<crate::transport::link_watch::LinkWatch>>>,
}

/// How long a reader waits for the worker thread to render the counters.
const RENDER_WAIT: Duration = Duration::from_secs(2);

macro_rules! json_fields {
    ($out:expr, $s:expr, [$($f:ident),*]) => {{
        let mut parts: Vec<String> = Vec::new();
        $( parts.push(format!("\"{}\":{}", stringify!($f), $s.$f)); )*
        $out.push_str(&parts.join(","));
    }};
}

/// The counters of the transport and, with a frontend connected, of its device, as the
/// members of a JSON object (no braces): what the worker thread renders, holding the locks
/// it holds anyway.
pub fn render_body(t: &TransportStats, model: Option<&Model>) -> String {
    let mut o = String::from("\"transport\":{");
    json_fields!(
        o,
        t,
        [
            tx_packets,
            tx_bytes,
            tx_dropped,
            tx_blocked,
            tx_denied,
            tx_wrong_family,
            tx_gso_sends,
            tx_gso_segments,
            tx_gso_refused,
            tx_sport_fallback,
            tx_sport_sockets,
            tx_sport_open,
            rx_gro_runs,
            rx_gro_segments,
            rx_packets,
            rx_bytes,
            rx_icrc_ok,
            rx_icrc_id_solved,
            rx_icrc_id_learned,
            rx_icrc_id_opened,
            rx_icrc_solves,
            rx_icrc_no_qp,
            rx_icrc_bad,
            rx_short,
            rx_errors,
            rx_unattached,
            rx_not_ours,
            rx_bad_ethertype,
            rx_bad_ip,
            rx_ip_checksum_bad,
            rx_bad_udp,
            rx_truncated,
            rx_ring_lost,
            tx_no_dmac,
            tx_bad_source,
            arp_replies,
            nd_adverts,
            rx_arp_ignored
        ]
    );
    o.push('}');
    if let Some(m) = model {
        let p = m.port_counters();
        o.push_str(",\"port\":{");
        json_fields!(
            o,
            p,
            [
                rx_packets,
                rx_bytes,
                tx_packets,
                tx_bytes,
                rx_dropped,
                rx_unknown_qp,
                rx_bad_gid,
                rx_malformed,
                tx_segments,
                odp_faults
            ]
        );
        // 1 while QUERY_PORT reports the port ACTIVE, 0 while DOWN.
        o.push_str(&format!(",\"active\":{}}}", u8::from(m.port_active())));
        // With --engine-shards: how the QPs and packets spread over the shards.
        let loads = m.shard_loads();
        if loads.len() > 1 {
            for (k, (qps, p)) in loads.iter().enumerate() {
                o.push_str(&format!(",\"shard{k}\":{{\"qps\":{qps},"));
                json_fields!(o, p, [rx_packets, tx_packets]);
                o.push('}');
            }
        }
        let s = m.stats();
        o.push_str(",\"device\":{");
        json_fields!(
            o,
            s,
            [
                ctrl_cmds,
                ctrl_errors,
                doorbells,
                bad_doorbells,
                bad_wqes,
                ring_faults,
                cq_overflows,
                events_raised,
                events_dropped,
                sq_wqes,
                rq_wqes,
                cqes,
                reg_mr_waits,
                tx_lost_segments,
                wqe_budget_waits,
                odp_updates,
                raw_dropped
            ]
        );
        let l = m.page_lists();
        let w = m.wqe_budget();
        o.push_str(&format!(
            ",\"page_list_bytes\":{},\"page_list_cap\":{},\"wqe_bytes\":{},\"wqe_bytes_cap\":{}",
            l.used, l.cap, w.used, w.cap
        ));
        o.push('}');
        let (q, c, r) = m.object_counts();
        o.push_str(&format!(
            ",\"objects\":{{\"qps\":{q},\"cqs\":{c},\"srqs\":{r}}},\"qps\":["
        ));
        let qps: Vec<String> = m
            .qp_counters()
            .into_iter()
            .map(|(qpn, c)| {
                let mut s = format!("{{\"qpn\":{qpn},");
                json_fields!(
                    s,
                    c,
                    [
                        tx_packets,
                        tx_bytes,
                        rx_packets,
                        rx_bytes,
                        retransmits,
                        timeouts,
                        naks_sent,
                        naks_received,
                        rnr_naks_sent,
                        rnr_naks_received,
                        duplicates,
                        dropped,
                        errors,
                        ghost_responses,
                        responses_dropped
                    ]
                );
                s.push('}');
                s
            })
            .collect();
        o.push_str(&qps.join(","));
        o.push(']');
    }
    o
}

/// The document a reader gets. With a frontend connected its worker renders the counters
/// between two events (never this thread: the device's locks are the data path's); a worker
/// that does not answer in time gives `"busy":true` and no device counters.
pub fn render(shared: &Shared) -> String {
    let connections = shared.connections.load(Ordering::Relaxed);
    let backend = lock(&shared.backend).clone();
    let body = match backend {
        Some(b) => b
            .render_counters(RENDER_WAIT)
            .unwrap_or_else(|| "\"busy\":true".to_string()),
        // No worker: nothing else takes the transport.
        None => render_body(
            &crate::worker::shard_worker::all_stats(
                lock(&shared.transport).stats(),
                &shared.shard_links,
            ),
            None,
        ),
    };
    let heap = match crate::heap::stats() {
        Some(h) => format!(
            ",\"heap\":{{\"live_bytes\":{},\"live_blocks\":{},\"allocations\":{}}}",
            h.live_bytes, h.live_blocks, h.allocations
        ),
        None => String::new(),
    };
    let net = match &shared.net {
        Some(n) => format!(",\"net\":{{{}}}", n.render()),
        None => String::new(),
    };
    let same_host = match &shared.same_host {
        Some(i) => format!(",\"same_host\":{{{}}}", i.render()),
        None => String::new(),
    };
    let io = match &shared.io {
        Some(i) => format!(",\"io_thread\":{{{}}}", i.render()),
        None => String::new(),
    };
    format!("{{\"connections\":{connections},{body}{net}{same_host}{io}{heap}}}\n")
}

/// The counters socket, bound (and its path held) before the daemon serves.
pub type Bound = (UnixListener, crate::unix_socket::PathLock);

/// Binds the counters socket at `path`.
pub fn bind(path: &Path, access: SocketAccess) -> std::io::Result<Bound> {
    let (l, lock) = crate::unix_socket::bind_private(path, access, || UnixListener::bind(path))
        .map_err(|e| std::io::Error::new(e.kind(), format!("counters socket: {e}")))?;
    l.set_nonblocking(true)?;
    Ok((l, lock))
}

/// Serves the bound counters socket until `shared.shutdown` is set.
pub fn spawn(
    (l, lock): Bound,
    shared: Arc<Shared>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("counters".into())
        .spawn(move || {
            while !shared.shutdown.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((mut s, _)) => {
                        let _ = s.set_nonblocking(false);
                        let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
                        let _ = s.write_all(render(&shared).as_bytes());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
            // The socket goes with its lock.
            drop(lock);
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::model::ModelConfig;

    /// A reader never takes the device's lock: with the worker busy (here: the model held
    /// and nobody serving the backend's events) it gets `"busy":true` after a bounded wait,
    /// not a hang; without a frontend it gets the transport's counters.
    #[test]
    fn a_reader_does_not_wait_for_the_data_path() {
        let Ok(t) =
            crate::transport::udp::UdpTransport::bind("127.0.0.1:0".parse().unwrap(), 0, false)
        else {
            vur_testkit::skip(
                "a_reader_does_not_wait_for_the_data_path",
                "127.0.0.1 cannot be bound",
            );
            return;
        };
        let model = Arc::new(Mutex::new(Model::new(ModelConfig::default())));
        let transport = Arc::new(Mutex::new(Transport::Udp(t)));
        let shared = Shared {
            backend: Mutex::new(None),
            transport: transport.clone(),
            connections: AtomicU64::new(3),
            shutdown: AtomicBool::new(false),
            net: None,
            same_host: None,
            io: None,
            shard_links: Vec::new(),
            link: None,
        };
        let doc = render(&shared);
        assert!(
            doc.starts_with("{\"connections\":3,\"transport\":{"),
            "{doc}"
        );
        assert!(doc.ends_with("}\n") && !doc.contains("\"port\""));
        let backend = crate::vhu_rdma::VhuRdma::new(model.clone(), transport, 0, None).unwrap();
        *lock(&shared.backend) = Some(backend.counters_desk());
        let _held = lock(&model);
        let t0 = std::time::Instant::now();
        let doc = render(&shared);
        assert_eq!(doc, "{\"connections\":3,\"busy\":true}\n");
        // The bound catches a reader that waits for the lock (a hang), not a slow machine.
        assert!(t0.elapsed() < RENDER_WAIT + Duration::from_secs(30));
    }
}
