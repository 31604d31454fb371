//! The device model's unit tests.

use super::*;

#[test]
fn page_list_budget_charges_up_to_the_cap_and_never_overflows() {
    let mut b = PageListBudget::new(1 << 20);
    assert!(b.fits(1 << 20));
    b.charge(1 << 19).unwrap();
    b.charge(1 << 19).unwrap();
    assert_eq!(b.charge(8), Err(Status::NoMemory));
    assert_eq!(b.charge(u64::MAX), Err(Status::NoMemory));
    assert_eq!(b.used, 1 << 20, "a refused charge keeps nothing");
    b.release(1 << 19);
    assert!(b.fits(1 << 19) && !b.fits((1 << 19) + 1));
    b.release(u64::MAX);
    assert_eq!(b.used, 0);
}

#[test]
fn the_config_space_states_the_caps_as_log2() {
    let m = Model::new(ModelConfig {
        dev: DeviceConfig::default(),
        max_page_list_bytes: 1 << 26,
        ..Default::default()
    });
    let c = m.config_space();
    assert_eq!(c.log2_max_page_list_bytes, 26);
    assert_eq!(
        1u64 << c.log2_max_qp_reg_mr_list_bytes,
        MAX_QP_REG_MR_LIST_BYTES
    );
    assert_ne!(c.caps & abi::caps::MR_PAGE_OFFSET, 0);
    assert_eq!(m.page_lists(), PageListBudget::new(1 << 26));
    let flush = abi::dev_cap::FLUSH_GLOBAL | abi::dev_cap::FLUSH_PERSISTENT;
    assert_eq!(c.device_cap_flags & flush, flush, "as rxe states them");
    assert_eq!(flush, (1 << 38) | (1 << 39));
}

/// A sink whose socket was full and has drained: the pump sends what it kept back and
/// goes on (here: the engine is idle), rather than waiting for another EPOLLOUT.
#[test]
fn a_sink_that_drained_is_not_reported_blocked() {
    struct Drained {
        blocked: bool,
        buf: Vec<u8>,
    }
    impl PacketSink for Drained {
        fn next_buf(&mut self) -> &mut [u8] {
            assert!(!self.blocked, "no packet is taken while blocked");
            &mut self.buf
        }
        fn push(&mut self, _: &rxe_core::device::Transmit) {}
        fn flush(&mut self) {
            self.blocked = false;
        }
        fn blocked(&self) -> bool {
            self.blocked
        }
    }
    let mut m = Model::new(ModelConfig::default());
    let mem = GuestMemoryMmap::from_ranges(&[(vm_memory::GuestAddress(0), 1 << 16)]).unwrap();
    let mut tx = Drained {
        blocked: true,
        buf: vec![0; 8192],
    };
    assert_eq!(m.pump(&mem, Instant(1), &mut tx), Pump::Idle);
    // Still full after the flush: blocked, and nothing taken from the engine.
    struct Full;
    impl PacketSink for Full {
        fn next_buf(&mut self) -> &mut [u8] {
            panic!("no packet is taken while blocked")
        }
        fn push(&mut self, _: &rxe_core::device::Transmit) {}
        fn flush(&mut self) {}
        fn blocked(&self) -> bool {
            true
        }
    }
    assert_eq!(m.pump(&mem, Instant(1), &mut Full), Pump::Blocked);
}

/// A device reset re-seeds: the objects created after it are not named as before.
#[test]
fn a_reset_draws_new_keys_and_qpns() {
    let mut m = Model::new(ModelConfig {
        dev: DeviceConfig {
            seed: Some(42),
            ..Default::default()
        },
        ..Default::default()
    });
    let names = |m: &mut Model| {
        let mut s = m.any();
        let pd = s.dev.alloc_pd().unwrap();
        let cq = s.dev.create_cq(16).unwrap();
        let key = s.dev.alloc_mr(pd, 16).unwrap();
        let qpn = s
            .dev
            .create_qp(rxe_core::QpInit {
                qp_type: QpType::Rc,
                pd,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                xrcd: None,
                cap: QpCap::default(),
                sq_sig_all: false,
            })
            .unwrap();
        (key, qpn.0)
    };
    let before = names(&mut m);
    m.reset();
    let after = names(&mut m);
    assert_ne!(before, after);
}

/// Shards handed to threads of their own: a packet this model takes for one of them
/// (or a multicast packet, for every shard) marks it touched, so that its thread is woken;
/// its own shard 0 is never marked; the marks are taken once.
#[test]
fn shards_handed_out_are_marked_when_this_model_works_on_them() {
    let mut m = Model::new(ModelConfig {
        shards: 3,
        ..Default::default()
    });
    let h = m.hand_out_shards();
    assert_eq!(h.iter().map(ShardHandle::index).collect::<Vec<_>>(), [1, 2]);
    let mem = GuestMemoryMmap::from_ranges(&[(vm_memory::GuestAddress(0), 1 << 16)]).unwrap();
    let meta = RecvMeta {
        src: Gid::from_ip("10.0.0.1".parse().unwrap()),
        dst: Gid::from_ip("10.0.0.2".parse().unwrap()),
        sport: 0,
        traffic_class: 0,
        hop_limit: 64,
        flow_label: 0,
    };
    // A SEND_ONLY BTH to `qpn`, and an ICRC (wrong: the engine drops it, as it should).
    let packet = |qpn: u32| {
        let mut b = vec![0u8; 16];
        b[0] = 0x04;
        b[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        b
    };
    for (qpn, touched) in [(3, 0), (4, 1 << 1), (5, 1 << 2)] {
        m.handle_packet(&mem, Instant(1), &meta, &packet(qpn));
        assert_eq!(m.take_touched(), touched, "QPN {qpn}");
        assert_eq!(m.take_touched(), 0, "QPN {qpn}: taken once");
    }
    m.handle_packet(&mem, Instant(1), &meta, &packet(MULTICAST_QPN));
    assert_eq!(m.take_touched(), 0b110, "multicast: every shard");
    // A shard's thread sees the packets of other shards land there too.
    assert_eq!(
        h[0].handle_packet(&mem, Instant(1), &meta, &packet(5)),
        1 << 2
    );
    // Without shards handed out, nothing is marked.
    let mut one = Model::new(ModelConfig {
        shards: 3,
        ..Default::default()
    });
    one.handle_packet(&mem, Instant(1), &meta, &packet(5));
    assert_eq!(one.take_touched(), 0);
    // Each packet went to the shard its QPN names, the multicast one to all three.
    let rx = |m: &Model| -> Vec<u64> { m.shard_loads().iter().map(|l| l.1.rx_packets).collect() };
    assert_eq!(rx(&m), [2, 2, 3]);
    assert_eq!(rx(&one), [0, 0, 1]);
}

/// A pending event is merged with a new one for the same object; a dropped one counts.
#[test]
fn events_are_counted_as_raised_merged_or_dropped() {
    let m = Model::new(ModelConfig::default());
    for _ in 0..3 {
        m.common
            .push_event(abi::event::KIND_ASYNC, abi::event::QP_FATAL, 17);
    }
    assert_eq!((m.events_len(), m.stats().events_raised), (1, 1));
    for qpn in 0..MAX_PENDING_EVENTS as u32 {
        m.common
            .push_event(abi::event::KIND_ASYNC, abi::event::QP_FATAL, qpn);
    }
    assert!(m.stats().events_dropped > 0);
    assert_eq!(
        m.stats().events_raised + m.stats().events_dropped,
        MAX_PENDING_EVENTS as u64
    );
}
