//! The daemon behind cloud-hypervisor's `--generic-vhost-user` frontend. cloud-hypervisor
//! cannot boot a guest without KVM, so its frontend is replayed message for message
//! (`vur_testguest::cloud_hypervisor`): the handshake at VM creation, the activation at
//! DRIVER_OK with guest RAM in two regions around a hole (each its own memfd, as
//! cloud-hypervisor lays out more than 3 GiB), config space read a byte at a time as the Linux
//! driver does, memory hotplug, device reset, wrong `queue_sizes` lists, and the reconnect to
//! a restarted daemon.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rxe_core::verbs::*;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vur_testguest::cloud_hypervisor::{ChError, GenericVhostUserDevice, Msg};
use vur_testguest::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_vur-daemon"))
}

const T: Duration = Duration::from_secs(10);
/// Below the 32-bit hole (cloud-hypervisor: 0 – 3 GiB), scaled down.
const LOW: (u64, u64) = (GPA_BASE, 24 << 20);
/// From 4 GiB on.
const HIGH: (u64, u64) = (4 << 30, 40 << 20);
/// Hotplugged later.
const HOTPLUG: (u64, u64) = ((4 << 30) + (128 << 20), 16 << 20);
const QUEUE_SIZES: [u16; 3] = [256, 256, 256];

/// The device's protocol features that cloud-hypervisor asks for.
fn agreed() -> VhostUserProtocolFeatures {
    VhostUserProtocolFeatures::CONFIG
        | VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::REPLY_ACK
        | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
}

/// VERSION_1, RING_EVENT_IDX, RING_INDIRECT_DESC and PROTOCOL_FEATURES: what both offer.
fn features() -> u64 {
    (1 << 32) | (1 << 29) | (1 << 28) | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
}

fn ch_ram() -> Arc<GuestRam> {
    GuestRam::with_regions(&[LOW, HIGH, HOTPLUG], 2).expect("guest RAM")
}

/// The messages at VM creation.
fn creation() -> Vec<Msg> {
    vec![
        Msg::Connect,
        Msg::SetOwner,
        Msg::GetFeatures,
        Msg::GetProtocolFeatures,
        Msg::SetProtocolFeatures(agreed().bits()),
        Msg::GetQueueNum,
    ]
}

/// The setup of `sizes.len()` queues at `bases`, at activation or after a reconnect.
fn setup(sizes: &[u16], bases: &[u16]) -> Vec<Msg> {
    let mut m = vec![Msg::SetFeatures(features()), Msg::SetMemTable(2)];
    m.extend(
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| Msg::SetVringNum(i, n)),
    );
    for (i, &b) in bases.iter().enumerate() {
        m.extend([
            Msg::SetVringAddr(i),
            Msg::SetVringBase(i, b),
            Msg::SetVringCall(i),
            Msg::SetVringKick(i),
        ]);
    }
    m.extend((0..sizes.len()).map(|i| Msg::SetVringEnable(i, true)));
    m
}

/// The Linux driver's config read: 128 one-byte GET_CONFIGs.
fn config_read() -> Vec<Msg> {
    (0..std::mem::size_of::<abi::ConfigSpace>() as u32)
        .map(|offset| Msg::GetConfig { offset, size: 1 })
        .collect()
}

/// A daemon whose log the test reads, and a cloud-hypervisor VM with the device activated.
fn ch_node(addr: std::net::SocketAddr) -> (Node, GenericVhostUserDevice) {
    let daemon = Daemon::spawn_logged(bin(), addr, &[]).expect("spawn");
    let mut dev = GenericVhostUserDevice::create(&daemon.socket, &QUEUE_SIZES, T).expect("VM");
    let mut guest = dev.activate_guest(&ch_ram()).expect("activation");
    let gid = rxe_core::Gid::from_ip(addr.ip());
    guest.add_gid(0, gid).expect("add_gid");
    (
        Node {
            daemon,
            guest,
            gid,
            mac: [0; 6],
        },
        dev,
    )
}

fn fine(d: &mut Daemon) {
    assert!(d.is_alive(), "daemon exited; log:\n{}", d.log());
    assert!(!d.log().contains("panicked"), "daemon log:\n{}", d.log());
}

/// Polls until `f` holds or `T` passes.
fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + T;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE);

/// Two VMs with `queue_sizes=[256,256,256]`: the exact messages of VM creation and of the
/// activation, the config space as the driver reads it, RC SEND/RECV and WRITE between two
/// QPs out of buffers that span both RAM regions, then the guest's teardown: its objects
/// destroyed, the device reset (SET_VRING_ENABLE 0 and GET_VRING_BASE per queue), the VM
/// shut down; the daemon serves the next VM.
#[test]
fn generic_vhost_user_sequence_then_rc_traffic_then_teardown() {
    let (aa, ba) = loopback_pair(4791);
    let (mut a, mut dev_a) = ch_node(aa);
    let (mut b, _dev_b) = ch_node(ba);

    let mut want = creation();
    want.extend(setup(&QUEUE_SIZES, &[0, 0, 0]));
    want.extend(config_read());
    assert_eq!(dev_a.log, want);
    assert_eq!(dev_a.backend_queue_num, Some(3));
    assert_eq!(dev_a.avail_features, features());
    assert_eq!(dev_a.acked_protocol_features, agreed());
    let q = a.guest.query_device().unwrap();
    assert_eq!(
        q, a.guest.config,
        "the config space read byte by byte is QUERY_DEVICE's"
    );
    assert_eq!(q.version, abi::VERSION);

    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).expect("RC QPs");
    let sbuf = a.guest.reg_mr(ea.pd, 256 << 10, ALL).unwrap();
    let rbuf = b.guest.reg_mr(eb.pd, 256 << 10, ALL).unwrap();
    for mr in [&sbuf, &rbuf] {
        let regions: std::collections::BTreeSet<u64> = mr
            .buf
            .pages
            .iter()
            .map(|&p| a.guest.ram.region_of(p).expect("RAM").0)
            .collect();
        assert_eq!(regions.len(), 2, "the buffer lies in both RAM regions");
    }
    let msg: Vec<u8> = (0..200_000u32).map(|i| (i * 7 + 3) as u8).collect();
    sbuf.write(0, &msg);
    b.guest
        .post_recv(
            &eb.qp,
            &RecvWr {
                wr_id: 42,
                sg_list: vec![rbuf.sge(0, 256 << 10)].into(),
            },
        )
        .unwrap();
    a.guest
        .post_send(
            &ea.qp,
            &SendWr::new(7, SendOp::Send, vec![sbuf.sge(0, msg.len() as u32)]),
        )
        .unwrap();
    let wa = a.guest.wait_cq(&ea.cq, 1, T);
    let wb = b.guest.wait_cq(&eb.cq, 1, T);
    assert_eq!(
        (wa.len(), wa.first().map(|w| (w.wr_id, w.status))),
        (1, Some((7, 0)))
    );
    assert_eq!(
        (
            wb.len(),
            wb.first().map(|w| (w.wr_id, w.status, w.byte_len))
        ),
        (1, Some((42, 0, msg.len() as u32)))
    );
    assert_eq!(rbuf.to_vec(0, msg.len()), msg);

    // RDMA WRITE back from b into a's buffer.
    let back: Vec<u8> = msg.iter().rev().copied().collect();
    rbuf.write(0, &back);
    b.guest
        .post_send(
            &eb.qp,
            &SendWr::new(
                8,
                SendOp::Write {
                    remote_addr: sbuf.addr(0),
                    rkey: sbuf.rkey,
                },
                vec![rbuf.sge(0, back.len() as u32)],
            ),
        )
        .unwrap();
    let wb = b.guest.wait_cq(&eb.cq, 1, T);
    assert_eq!(wb.first().map(|w| (w.wr_id, w.status)), Some((8, 0)));
    assert_eq!(sbuf.to_vec(0, back.len()), back);

    // The guest driver's removal: its objects, then the device reset.
    a.guest.destroy_qp(ea.qp).unwrap();
    a.guest.destroy_cq(ea.cq).unwrap();
    a.guest.dereg_mr(sbuf).unwrap();
    a.guest.dealloc_pd(ea.pd).unwrap();
    let pos = cloud_hypervisor::ring_positions(&a.guest);
    let n = dev_a.log.len();
    let bases = dev_a.reset().expect("reset");
    assert_eq!(
        dev_a.log[n..],
        [
            Msg::SetVringEnable(0, false),
            Msg::GetVringBase(0),
            Msg::SetVringEnable(1, false),
            Msg::GetVringBase(1),
            Msg::SetVringEnable(2, false),
            Msg::GetVringBase(2),
        ]
    );
    // Every queue stopped at its used index: nothing taken and left unused. No command was
    // in flight; the event buffers stay posted (the device takes one per event).
    for (i, (base, (avail, used))) in bases.iter().zip(pos).enumerate() {
        assert_eq!(*base, used as u32, "queue {i}");
        if i == 0 {
            assert_eq!(avail, used);
        }
    }
    assert_eq!(pos[2].0.wrapping_sub(pos[2].1), QUEUE_SIZES[2]);

    // VM shutdown: the socket closes, the daemon serves the next VM.
    drop(a.guest);
    drop(dev_a);
    wait_until("the disconnect", || {
        a.daemon.log().contains("frontend disconnected")
    });
    let mut g = Guest::connect(&a.daemon.socket, GuestOpts::default()).unwrap();
    g.query_device().unwrap();
    fine(&mut a.daemon);
    fine(&mut b.daemon);
}

/// A driver reload (or guest reboot) on the same connection: reset, then the whole activation
/// again on fresh rings, and the device works from a clean slate.
#[test]
fn driver_reload_activates_again_on_the_same_connection() {
    let (aa, _) = loopback_pair(4791);
    let (mut a, mut dev) = ch_node(aa);
    let pd = a.guest.alloc_pd().unwrap();
    a.guest.create_cq(63).unwrap();
    dev.reset().unwrap();
    let n = dev.log.len();
    dev.reactivate_guest(&mut a.guest)
        .expect("activation again");
    let mut want = setup(&QUEUE_SIZES, &[0, 0, 0]);
    want.extend(config_read());
    assert_eq!(dev.log[n..], want);
    let q = a.guest.query_device().unwrap();
    assert_eq!(a.guest.config, q);
    // The reset dropped every object.
    assert!(matches!(
        a.guest.dealloc_pd(pd),
        Err(Error::Status(abi::Status::NotFound))
    ));
    a.guest.add_gid(0, a.gid).unwrap();
    let pd = a.guest.alloc_pd().unwrap();
    a.guest.reg_mr(pd, 8192, ALL).unwrap();
    fine(&mut a.daemon);
}

/// Memory hotplug: cloud-hypervisor adds the region with ADD_MEM_REG (the daemon offers
/// CONFIGURE_MEM_SLOTS); buffers in it then carry RC traffic both ways.
#[test]
fn hotplugged_memory_arrives_with_add_mem_reg() {
    let (aa, ba) = loopback_pair(4791);
    let (mut a, mut dev_a) = ch_node(aa);
    let (mut b, _dev_b) = ch_node(ba);
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();

    let region = a.guest.ram.plug(2);
    let n = dev_a.log.len();
    dev_a
        .add_memory_region(&a.guest.ram, &region)
        .expect("hotplug");
    assert_eq!(dev_a.log[n..], [Msg::AddMemReg(HOTPLUG.0)]);

    let abuf = a.guest.reg_mr(ea.pd, 64 << 10, ALL).unwrap();
    assert!(
        abuf.buf
            .pages
            .iter()
            .all(|&p| a.guest.ram.region_of(p) == Some(HOTPLUG)),
        "the buffer lies in the hotplugged region"
    );
    let bbuf = b.guest.reg_mr(eb.pd, 64 << 10, ALL).unwrap();
    let data: Vec<u8> = (0..60_000u32).map(|i| (i ^ (i >> 8)) as u8).collect();
    bbuf.write(0, &data);
    b.guest
        .post_send(
            &eb.qp,
            &SendWr::new(
                1,
                SendOp::Write {
                    remote_addr: abuf.addr(0),
                    rkey: abuf.rkey,
                },
                vec![bbuf.sge(0, data.len() as u32)],
            ),
        )
        .unwrap();
    let w = b.guest.wait_cq(&eb.cq, 1, T);
    assert_eq!(w.first().map(|w| (w.wr_id, w.status)), Some((1, 0)));
    assert_eq!(abuf.to_vec(0, data.len()), data);

    // And out of it: a SEND from the hotplugged buffer.
    b.guest
        .post_recv(
            &eb.qp,
            &RecvWr {
                wr_id: 2,
                sg_list: vec![bbuf.sge(0, 64 << 10)].into(),
            },
        )
        .unwrap();
    let back: Vec<u8> = data.iter().map(|x| x.wrapping_add(1)).collect();
    abuf.write(0, &back);
    a.guest
        .post_send(
            &ea.qp,
            &SendWr::new(3, SendOp::Send, vec![abuf.sge(0, back.len() as u32)]),
        )
        .unwrap();
    let w = b.guest.wait_cq(&eb.cq, 1, T);
    assert_eq!(w.first().map(|w| (w.wr_id, w.status)), Some((2, 0)));
    assert_eq!(bbuf.to_vec(0, back.len()), back);
    let w = a.guest.wait_cq(&ea.cq, 1, T);
    assert_eq!(w.first().map(|w| (w.wr_id, w.status)), Some((3, 0)));
    fine(&mut a.daemon);
}

/// QUERY_DEVICE on a bare control queue; returns the status.
fn query_on(ram: &GuestRam, ctrl: &mut Virtq) -> u32 {
    let req = ram.alloc_contig(16, 16).unwrap();
    let resp = ram.alloc_contig(16 + 128, 16).unwrap();
    let h = abi::CtrlHdr {
        opcode: abi::op::QUERY_DEVICE,
        flags: 0,
        seq: 1,
    };
    ram.write(req, vm_memory::ByteValued::as_slice(&h));
    let head = ctrl
        .add(&[(req, 16, false), (resp, 16 + 128, true)])
        .unwrap();
    let (id, len) = ctrl.wait_used(T).expect("an answer");
    assert_eq!((id, len), (head, 16 + 128));
    let mut b = [0u8; 16];
    ram.read(resp, &mut b);
    abi::read_struct::<abi::RespHdr>(&b).unwrap().status
}

/// A wrong `queue_sizes` list, one VM after the other on one daemon, which refuses or reports
/// each and serves the next:
/// - four queues: GET_QUEUE_NUM says 3, cloud-hypervisor refuses to create the VM;
/// - two queues: creation succeeds (2 ≤ 3); the Linux driver's probe fails to find the event
///   queue and never sets DRIVER_OK, so nothing else happens;
/// - two queues with a driver that goes on: the daemon answers on the control queue and logs
///   that the event queue was not set up;
/// - 2048 entries a queue (a power of two, so cloud-hypervisor takes it): SET_VRING_NUM is
///   refused with a REPLY_ACK error, cloud-hypervisor's activation fails, the daemon logs why
///   and closes the connection.
#[test]
fn wrong_queue_sizes_are_refused_or_reported() {
    let (aa, _) = loopback_pair(4791);
    let mut d = Daemon::spawn_logged(bin(), aa, &[]).unwrap();

    match GenericVhostUserDevice::create(&d.socket, &[256; 4], T) {
        Err(ChError::TooManyQueues {
            requested: 4,
            backend: 3,
        }) => {}
        Err(e) => panic!("four queues: {e}"),
        Ok(_) => panic!("four queues accepted"),
    }
    fine(&mut d);

    {
        let dev = GenericVhostUserDevice::create(&d.socket, &[256, 256], T).unwrap();
        assert_eq!(dev.log, creation());
    }
    fine(&mut d);

    {
        let mut dev = GenericVhostUserDevice::create(&d.socket, &[256, 256], T).unwrap();
        let ram = ch_ram();
        let mut ctrl = Virtq::new(&ram, 256, true).unwrap();
        let db = Virtq::new(&ram, 256, true).unwrap();
        dev.activate(
            &ram,
            cloud_hypervisor::LINUX_TRANSPORT_FEATURES,
            &[(0, &ctrl), (1, &db)],
        )
        .expect("two queues activate");
        assert_eq!(dev.log[creation().len()..], setup(&[256, 256], &[0, 0]));
        assert_eq!(query_on(&ram, &mut ctrl), abi::Status::Ok as u32);
        wait_until("the warning", || {
            d.log().contains("did not set up the event queue")
        });
    }
    fine(&mut d);

    let mut dev = GenericVhostUserDevice::create(&d.socket, &[2048; 3], T).unwrap();
    match dev.activate_guest(&ch_ram()) {
        Err(ChError::Message(Msg::SetVringNum(0, 2048), _)) => {}
        Err(e) => panic!("2048 entries: {e}"),
        Ok(_) => panic!("2048 entries accepted"),
    }
    wait_until("the refusal in the log", || {
        let l = d.log();
        l.contains("queue size 2048 out of range") && l.contains("frontend connection ended")
    });
    drop(dev);
    fine(&mut d);

    // And the next VM is served.
    let mut dev = GenericVhostUserDevice::create(&d.socket, &QUEUE_SIZES, T).unwrap();
    let mut g = dev.activate_guest(&ch_ram()).unwrap();
    g.query_device().unwrap();
    fine(&mut d);
}

/// cloud-hypervisor reconnects a generic device whose socket hangs up: the daemon is killed
/// (SIGKILL) under a running guest, which then posts a command nobody answers; a new daemon
/// starts on the same socket; the reconnect sends the features agreed before and the rings at
/// their avail index. The daemon resumes every ring at its used index instead, so the command
/// in flight is answered and the event buffers the guest posted carry DEVICE_FATAL; the fresh
/// device then works.
#[test]
fn reconnect_to_a_restarted_daemon() {
    let (aa, _) = loopback_pair(4791);
    let (mut a, mut dev) = ch_node(aa);
    let pd = a.guest.alloc_pd().unwrap();
    let cq = a.guest.create_cq(63).unwrap();
    a.guest
        .create_qp(QpType::Rc, pd, &cq, &cq, None, ConnOpts::default().cap)
        .unwrap();

    a.daemon.kill();
    assert!(dev.wait_hangup(T), "the socket hangs up");
    a.guest.timeout = Duration::from_millis(300);
    assert!(matches!(
        a.guest.query_device(),
        Err(Error::Timeout("control queue"))
    ));
    a.guest.timeout = T;
    let pos = cloud_hypervisor::ring_positions(&a.guest);
    assert_eq!(pos[0].0, pos[0].1 + 1, "one command in flight");

    a.daemon.restart().unwrap();
    let n = dev.log.len();
    dev.reconnect(&mut a.guest, T).expect("reconnect");
    let mut want = vec![
        Msg::Connect,
        Msg::SetOwner,
        Msg::GetFeatures,
        Msg::SetProtocolFeatures(agreed().bits()),
    ];
    want.extend(setup(&QUEUE_SIZES, &[pos[0].0, pos[1].0, pos[2].0]));
    assert_eq!(dev.log[n..], want);

    let fatal =
        |e: &abi::Event| e.kind == abi::event::KIND_ASYNC && e.event == abi::event::DEVICE_FATAL;
    assert!(
        a.guest.wait_event(T, fatal).is_some(),
        "no DEVICE_FATAL; daemon log:\n{}",
        a.daemon.log()
    );
    wait_until("the answer to the command in flight", || {
        let p = cloud_hypervisor::ring_positions(&a.guest)[0];
        p.0 == p.1
    });
    assert!(a.daemon.log().contains("resuming at"));
    // The old objects are gone; the new device works.
    assert!(matches!(
        a.guest.dealloc_pd(pd),
        Err(Error::Status(abi::Status::NotFound))
    ));
    let q = a.guest.query_device().unwrap();
    assert_eq!(q, a.guest.config);
    a.guest.add_gid(0, a.gid).unwrap();
    let pd = a.guest.alloc_pd().unwrap();
    a.guest.reg_mr(pd, 8192, ALL).unwrap();
    fine(&mut a.daemon);
}
