// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * virtio_rdma: probe, the three virtqueues (control, doorbell, event), the netdev the
 * port is paired with, and ib_device registration. The verbs are in virtio_rdma_verbs.c.
 */

#include <linux/cc_platform.h>
#include <linux/etherdevice.h>
#include <linux/module.h>
#include <linux/scatterlist.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <linux/virtio_config.h>
#include <linux/virtio_ids.h>
#include <net/addrconf.h>
#include <rdma/ib_addr.h>

#include "virtio_rdma.h"

/* TCG guests against a busy daemon: generous, but a dead device must not hang forever. */
static unsigned int cmd_timeout_ms = 30000;
module_param(cmd_timeout_ms, uint, 0644);
MODULE_PARM_DESC(cmd_timeout_ms, "control command timeout in milliseconds");

static bool reprobe = true;
module_param(reprobe, bool, 0644);
MODULE_PARM_DESC(reprobe, "after DEVICE_FATAL (device state lost), remove and probe the device again");

static int status_to_errno(u32 status)
{
	switch (status) {
	case VRDMA_OK:
		return 0;
	case VRDMA_NO_MEMORY:
		return -ENOMEM;
	case VRDMA_NOT_FOUND:
		return -ENOENT;
	case VRDMA_BUSY:
		return -EBUSY;
	case VRDMA_PERMISSION:
		return -EPERM;
	case VRDMA_UNSUPPORTED:
		return -EOPNOTSUPP;
	case VRDMA_BAD_ADDRESS:
		return -EFAULT;
	case VRDMA_ADDRESS_NOT_AVAILABLE:
		return -EADDRNOTAVAIL;
	case VRDMA_INVALID:
	case VRDMA_BAD_STATE:
	case VRDMA_BAD_REQUEST:
	default:
		return -EINVAL;
	}
}

/*
 * One control command: [ctrl hdr][cmd] device-readable, [resp hdr][resp] device-writable.
 * Sleeps; never called from atomic context (kernel AHs use inline AVs for that reason).
 */
int vrdma_cmd(struct vrdma_dev *dev, u32 opcode, const void *cmd, size_t cmd_len,
	      void *resp, size_t resp_len)
{
	struct vrdma_ctrl_hdr *hdr = dev->ctrl_req;
	struct vrdma_resp_hdr *rh = dev->ctrl_resp;
	struct scatterlist out, in, *sgs[2] = { &out, &in };
	unsigned int len, noreclaim;
	void *tok;
	int err;

	if (WARN_ON(cmd_len + sizeof(*hdr) > PAGE_SIZE || resp_len + sizeof(*rh) > PAGE_SIZE))
		return -EINVAL;
	might_sleep();

	mutex_lock(&dev->ctrl_lock);
	/*
	 * No reclaim while the control queue is held: reclaim may invalidate an on-demand MR,
	 * whose invalidation sends a command (and waits for a fault handler that may be
	 * waiting for this lock).
	 */
	noreclaim = memalloc_noreclaim_save();
	if (dev->broken) {
		err = -EIO;
		goto out;
	}
	hdr->opcode = cpu_to_le32(opcode);
	hdr->flags = 0;
	hdr->seq = cpu_to_le64(++dev->seq);
	if (cmd_len)
		memcpy(hdr + 1, cmd, cmd_len);
	memset(rh, 0, sizeof(*rh) + resp_len);
	sg_init_one(&out, hdr, sizeof(*hdr) + cmd_len);
	sg_init_one(&in, rh, sizeof(*rh) + resp_len);

	reinit_completion(&dev->ctrl_done);
	err = virtqueue_add_sgs(dev->ctrl_vq, sgs, 1, 1, dev, GFP_KERNEL);
	if (err)
		goto out;
	virtqueue_kick(dev->ctrl_vq);

	for (;;) {
		tok = virtqueue_get_buf(dev->ctrl_vq, &len);
		if (tok)
			break;
		if (!wait_for_completion_timeout(&dev->ctrl_done,
						 msecs_to_jiffies(cmd_timeout_ms))) {
			/* The buffers stay with the device: never reuse them. */
			dev_err(&dev->vdev->dev, "command %u timed out; device unusable\n", opcode);
			dev->broken = true;
			err = -ETIMEDOUT;
			goto out;
		}
		reinit_completion(&dev->ctrl_done);
	}
	if (len < sizeof(*rh)) {
		err = -EIO;
		goto out;
	}
	if (le64_to_cpu(rh->seq) != dev->seq) {
		dev_warn(&dev->vdev->dev, "command %u: response seq mismatch\n", opcode);
		err = -EIO;
		goto out;
	}
	err = status_to_errno(le32_to_cpu(rh->status));
	if (!err && resp_len) {
		size_t got = min_t(size_t, le32_to_cpu(rh->len), resp_len);

		memcpy(resp, rh + 1, got);
		if (got < resp_len)
			memset((u8 *)resp + got, 0, resp_len - got);
	}
	if (err && err != -ENOENT && err != -EBUSY)
		dev_dbg(&dev->vdev->dev, "command %u: status %u\n", opcode,
			le32_to_cpu(rh->status));
out:
	memalloc_noreclaim_restore(noreclaim);
	mutex_unlock(&dev->ctrl_lock);
	return err;
}

int vrdma_cmd_handle(struct vrdma_dev *dev, u32 opcode, u32 handle)
{
	struct vrdma_handle h = { .handle = cpu_to_le32(handle) };

	return vrdma_cmd(dev, opcode, &h, sizeof(h), NULL, 0);
}

static void vrdma_ctrl_cb(struct virtqueue *vq)
{
	struct vrdma_dev *dev = vq->vdev->priv;

	complete(&dev->ctrl_done);
}

/* --- doorbells ------------------------------------------------------------------------ */

static void db_reclaim(struct vrdma_dev *dev)
{
	struct vrdma_doorbell *db;
	unsigned int len;

	while ((db = virtqueue_get_buf(dev->db_vq, &len)))
		dev->db_free[dev->db_nfree++] = db - dev->db_bufs;
}

static bool db_post(struct vrdma_dev *dev, u32 kind, u32 object, u32 index)
{
	struct vrdma_doorbell *db;
	struct scatterlist sg;
	unsigned int i;

	if (!dev->db_nfree)
		db_reclaim(dev);
	if (!dev->db_nfree)
		return false;
	i = dev->db_free[--dev->db_nfree];
	db = &dev->db_bufs[i];
	db->kind = cpu_to_le32(kind);
	db->object = cpu_to_le32(object);
	db->index = cpu_to_le32(index);
	db->reserved = 0;
	sg_init_one(&sg, db, sizeof(*db));
	if (virtqueue_add_outbuf(dev->db_vq, &sg, 1, db, GFP_ATOMIC)) {
		dev->db_free[dev->db_nfree++] = i;
		return false;
	}
	return true;
}

/*
 * Posts the backlogged SQ doorbells as buffers come back; db_lock held. Leaves the used-buffer
 * callback enabled while a backlog remains. virtqueue_enable_cb() returning false means used
 * buffers arrived before the callback was armed — the device will not interrupt for them — so
 * go round again rather than wait for a callback that never comes (a QP whose doorbell sits in
 * the backlog would stall, and every later doorbell queues behind it).
 */
static void db_run_backlog(struct vrdma_dev *dev)
{
	struct vrdma_qp *qp, *tmp;
	bool kick;

	do {
		kick = false;
		db_reclaim(dev);
		list_for_each_entry_safe(qp, tmp, &dev->db_backlog, db_node) {
			u32 prod = READ_ONCE(qp->sq.buf->producer_index);

			if (!db_post(dev, VRDMA_DB_SQ, qp->qpn, prod))
				break;
			kick = true;
			list_del(&qp->db_node);
			qp->db_pending = false;
		}
		if (kick)
			virtqueue_kick(dev->db_vq);
		if (list_empty(&dev->db_backlog)) {
			virtqueue_disable_cb(dev->db_vq);
			return;
		}
	} while (!virtqueue_enable_cb(dev->db_vq));
}

/*
 * Rings a doorbell. Safe in any context. A doorbell is idempotent per ring (the device reads
 * up to the producer index it finds), so when the queue is full an SQ doorbell is kept as a
 * per-QP pending bit and sent as buffers come back; other kinds are optional hints and are
 * dropped.
 */
void vrdma_ring_doorbell(struct vrdma_dev *dev, u32 kind, u32 object, u32 index,
			 struct vrdma_qp *qp)
{
	unsigned long flags;

	if (READ_ONCE(dev->dead))
		return;	/* it knows none of our queues any more */

	spin_lock_irqsave(&dev->db_lock, flags);
	if (list_empty(&dev->db_backlog) && db_post(dev, kind, object, index)) {
		virtqueue_kick(dev->db_vq);
	} else if (qp && kind == VRDMA_DB_SQ && !qp->db_pending) {
		qp->db_pending = true;
		list_add_tail(&qp->db_node, &dev->db_backlog);
		db_run_backlog(dev);
	}
	spin_unlock_irqrestore(&dev->db_lock, flags);
}

void vrdma_db_forget(struct vrdma_dev *dev, struct vrdma_qp *qp)
{
	unsigned long flags;

	spin_lock_irqsave(&dev->db_lock, flags);
	if (qp->db_pending) {
		list_del(&qp->db_node);
		qp->db_pending = false;
	}
	spin_unlock_irqrestore(&dev->db_lock, flags);
}

static void vrdma_db_cb(struct virtqueue *vq)
{
	struct vrdma_dev *dev = vq->vdev->priv;
	unsigned long flags;

	spin_lock_irqsave(&dev->db_lock, flags);
	db_run_backlog(dev);
	spin_unlock_irqrestore(&dev->db_lock, flags);
}

/* --- events --------------------------------------------------------------------------- */

static void ev_post(struct vrdma_dev *dev, struct vrdma_event *ev)
{
	struct scatterlist sg;

	sg_init_one(&sg, ev, sizeof(*ev));
	/* cannot fail: exactly one buffer per descriptor, as many buffers as descriptors */
	WARN_ON_ONCE(virtqueue_add_inbuf(dev->ev_vq, &sg, 1, ev, GFP_ATOMIC));
}

static void qp_event(struct vrdma_dev *dev, u32 qpn, enum ib_event_type type)
{
	struct vrdma_qp *qp = xa_load(&dev->qps, qpn);
	struct ib_event ev;

	if (!qp || !qp->ibqp.event_handler)
		return;
	ev.device = &dev->ib;
	ev.element.qp = &qp->ibqp;
	ev.event = type;
	qp->ibqp.event_handler(&ev, qp->ibqp.qp_context);
}

static void vrdma_handle_event(struct vrdma_dev *dev, const struct vrdma_event *e)
{
	u32 kind = le32_to_cpu(e->kind), type = le32_to_cpu(e->event);
	u32 obj = le32_to_cpu(e->object);
	struct ib_event ev = { .device = &dev->ib };
	struct vrdma_srq *srq;
	struct vrdma_cq *cq;

	if (kind == VRDMA_EV_COMPLETION) {
		cq = xa_load(&dev->cqs, obj);
		if (cq && cq->ibcq.comp_handler) {
			WRITE_ONCE(cq->armed, false);
			cq->ibcq.comp_handler(&cq->ibcq, cq->ibcq.cq_context);
		}
		return;
	}
	if (kind == VRDMA_EV_EVENTS_LOST) {
		unsigned long i;

		/* Any of them may have been a completion event: fire every armed CQ. */
		dev_warn_ratelimited(&dev->vdev->dev, "device dropped events\n");
		xa_for_each(&dev->cqs, i, cq) {
			if (READ_ONCE(cq->armed) && cq->ibcq.comp_handler) {
				WRITE_ONCE(cq->armed, false);
				cq->ibcq.comp_handler(&cq->ibcq, cq->ibcq.cq_context);
			}
		}
		return;
	}
	if (kind == VRDMA_EV_PAGE_FAULT) {
		vrdma_odp_fault(dev, obj,
				le32_to_cpu(e->reserved) |
				(u64)(type >> VRDMA_PAGE_FAULT_PAGE_HI_SHIFT) << 32,
				type & VRDMA_PAGE_FAULT_WRITE);
		return;
	}
	if (kind != VRDMA_EV_ASYNC)
		return;
	switch (type) {
	case VRDMA_AE_CQ_ERR:
		cq = xa_load(&dev->cqs, obj);
		if (cq && cq->ibcq.event_handler) {
			ev.event = IB_EVENT_CQ_ERR;
			ev.element.cq = &cq->ibcq;
			cq->ibcq.event_handler(&ev, cq->ibcq.cq_context);
		}
		break;
	case VRDMA_AE_QP_FATAL:
	case VRDMA_AE_QP_REQ_ERR:
	case VRDMA_AE_QP_ACCESS_ERR:
	case VRDMA_AE_COMM_EST:
	case VRDMA_AE_SQ_DRAINED:
	case VRDMA_AE_QP_LAST_WQE_REACHED:
		/* ibv_event_type and ib_event_type share these values */
		qp_event(dev, obj, type);
		break;
	case VRDMA_AE_SRQ_LIMIT_REACHED:
		srq = xa_load(&dev->srqs, obj);
		if (srq && srq->ibsrq.event_handler) {
			ev.event = IB_EVENT_SRQ_LIMIT_REACHED;
			ev.element.srq = &srq->ibsrq;
			srq->ibsrq.event_handler(&ev, srq->ibsrq.srq_context);
		}
		break;
	case VRDMA_AE_DEVICE_FATAL:
		WRITE_ONCE(dev->dead, true);
		fallthrough;
	case VRDMA_AE_PORT_ACTIVE:
	case VRDMA_AE_PORT_ERR:
		/* ib_dispatch_event sleeps: from a work item */
		set_bit(type, &dev->port_events);
		schedule_work(&dev->port_work);
		break;
	default:
		break;
	}
}

/*
 * DEVICE_FATAL: the device lost every object (a restarted daemon, §9). Recover as a new
 * device: remove (ib_unregister_device disassociates user contexts, whose verbs then fail
 * with EIO and whose event channels report it; kernel clients close their objects, which
 * the device answers NOT_FOUND) and probe again, which resets the device. Applications
 * open the new vrdma device; the guest need not reboot.
 */
struct vrdma_reprobe {
	struct delayed_work work;
	struct device *dev;
};

/* How long applications that only poll their CQ rings have to see the flush completions
 * before the removal unmaps the rings. */
#define VRDMA_REPROBE_DELAY_MS 500

static void vrdma_reprobe_work(struct work_struct *w)
{
	struct vrdma_reprobe *r = container_of(to_delayed_work(w), struct vrdma_reprobe, work);

	dev_warn(r->dev, "device state lost: removing and probing the device again\n");
	if (device_reprobe(r->dev))
		dev_err(r->dev, "re-probe failed\n");
	put_device(r->dev);
	kfree(r);
}

static void vrdma_schedule_reprobe(struct vrdma_dev *dev)
{
	struct vrdma_reprobe *r;

	if (dev->reprobing)
		return;
	r = kzalloc(sizeof(*r), GFP_KERNEL);
	if (!r)
		return;
	dev->reprobing = true;
	INIT_DELAYED_WORK(&r->work, vrdma_reprobe_work);
	r->dev = get_device(&dev->vdev->dev);
	/* not on this device's work items: remove() cancels those */
	schedule_delayed_work(&r->work, msecs_to_jiffies(VRDMA_REPROBE_DELAY_MS));
}

static void vrdma_port_work(struct work_struct *w)
{
	struct vrdma_dev *dev = container_of(w, struct vrdma_dev, port_work);
	static const u32 types[] = { VRDMA_AE_DEVICE_FATAL, VRDMA_AE_PORT_ERR,
				     VRDMA_AE_PORT_ACTIVE };
	struct ib_event ev = { .device = &dev->ib };
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(types); i++) {
		if (!test_and_clear_bit(types[i], &dev->port_events))
			continue;
		ev.event = types[i];
		if (types[i] == VRDMA_AE_DEVICE_FATAL)
			ev.element.port_num = 0;
		else
			ev.element.port_num = 1;
		ib_dispatch_event(&ev);
		if (types[i] == VRDMA_AE_DEVICE_FATAL) {
			/* kernel consumers poll and find their work flushed; user rings get
			 * their flush completions written */
			vrdma_kick_cqs(dev);
			vrdma_flush_user(dev);
			if (reprobe)
				vrdma_schedule_reprobe(dev);
		}
	}
}

/*
 * Event queue callback (interrupt context). Handlers run under ev_lock; destroying a CQ,
 * QP or SRQ removes it from its xarray under the same lock, so no handler runs for an
 * object after its destroy verb returned.
 */
static void vrdma_ev_cb(struct virtqueue *vq)
{
	struct vrdma_dev *dev = vq->vdev->priv;
	struct vrdma_event *ev;
	unsigned long flags;
	unsigned int len;
	bool again;

	spin_lock_irqsave(&dev->ev_lock, flags);
	do {
		virtqueue_disable_cb(vq);
		while ((ev = virtqueue_get_buf(vq, &len))) {
			if (len >= sizeof(*ev))
				vrdma_handle_event(dev, ev);
			ev_post(dev, ev);
		}
		again = !virtqueue_enable_cb(vq);
	} while (again);
	virtqueue_kick(vq);
	spin_unlock_irqrestore(&dev->ev_lock, flags);
}

/* --- netdev pairing ------------------------------------------------------------------- */

/*
 * The port is paired with the guest netdev whose MAC is the config-space MAC (normally
 * the virtio-net of the same VM): ib_core then builds the RoCEv2 GID table from that
 * netdev's addresses and resolves routes and neighbours through it.
 *
 * ib_core learns the netdev through the get_netdev op, not ib_device_set_netdev(): the latter
 * also files the device in ib_core's netdev hash, where Linux rxe looks up "its" device by
 * netdev and RDMA_DRIVER_RXE (on every received packet and netdev event) and casts whatever
 * it finds to struct rxe_dev. With rdma_rxe loaded in the same guest that wrote rxe's port
 * state into this driver's private data. Out of the hash, rxe never sees this device, and
 * rxe0 and vrdma0 can even share a netdev.
 */
struct net_device *vrdma_get_netdev(struct ib_device *ibdev, u32 port)
{
	struct vrdma_dev *dev = container_of(ibdev, struct vrdma_dev, ib);
	struct net_device *ndev;

	if (port != 1)
		return NULL;
	rcu_read_lock();
	ndev = rcu_dereference(dev->netdev);
	dev_hold(ndev);
	rcu_read_unlock();
	return ndev;
}

static void vrdma_rescan_work(struct work_struct *w)
{
	struct vrdma_dev *dev = container_of(w, struct vrdma_dev, rescan_work);

	rdma_roce_rescan_device(&dev->ib);
}

static int vrdma_netdev_event(struct notifier_block *nb, unsigned long event, void *ptr)
{
	struct vrdma_dev *dev = container_of(nb, struct vrdma_dev, nb);
	struct net_device *ndev = netdev_notifier_info_to_dev(ptr);
	struct net_device *cur = rtnl_dereference(dev->netdev);

	switch (event) {
	case NETDEV_REGISTER:
		if (cur || !ether_addr_equal(ndev->dev_addr, dev->mac))
			break;
		rcu_assign_pointer(dev->netdev, ndev);
		dev_info(&dev->vdev->dev, "port 1 paired with %s\n", ndev->name);
		/* before registration ib_core scans the netdev itself */
		if (READ_ONCE(dev->registered))
			schedule_work(&dev->rescan_work);
		break;
	case NETDEV_UNREGISTER:
		if (ndev != cur)
			break;
		/* ib_core's own notifier removes the GIDs of an unregistered netdev */
		RCU_INIT_POINTER(dev->netdev, NULL);
		synchronize_net();
		dev_info(&dev->vdev->dev, "port 1 unpaired from %s\n", ndev->name);
		break;
	}
	return NOTIFY_DONE;
}

/* --- probe / remove ------------------------------------------------------------------- */

static int vrdma_init_vqs(struct vrdma_dev *dev)
{
	struct virtqueue *vqs[VRDMA_NUM_VQS];
	struct virtqueue_info info[VRDMA_NUM_VQS] = {
		{ "control", vrdma_ctrl_cb },
		{ "doorbell", vrdma_db_cb },
		{ "event", vrdma_ev_cb },
	};
	unsigned int i;
	int err;

	err = virtio_find_vqs(dev->vdev, VRDMA_NUM_VQS, vqs, info, NULL);
	if (err)
		return err;
	dev->ctrl_vq = vqs[VRDMA_VQ_CTRL];
	dev->db_vq = vqs[VRDMA_VQ_DOORBELL];
	dev->ev_vq = vqs[VRDMA_VQ_EVENT];

	dev->db_num = virtqueue_get_vring_size(dev->db_vq);
	dev->db_bufs = kcalloc(dev->db_num, sizeof(*dev->db_bufs), GFP_KERNEL);
	dev->db_free = kcalloc(dev->db_num, sizeof(*dev->db_free), GFP_KERNEL);
	/* the driver posts one event buffer per descriptor of the event queue */
	dev->ev_num = virtqueue_get_vring_size(dev->ev_vq);
	dev->ev_bufs = kcalloc(dev->ev_num, sizeof(*dev->ev_bufs), GFP_KERNEL);
	dev->ctrl_req = kzalloc(PAGE_SIZE, GFP_KERNEL);
	dev->ctrl_resp = kzalloc(PAGE_SIZE, GFP_KERNEL);
	if (!dev->db_bufs || !dev->db_free || !dev->ev_bufs || !dev->ctrl_req || !dev->ctrl_resp)
		return -ENOMEM;
	for (i = 0; i < dev->db_num; i++)
		dev->db_free[i] = i;
	dev->db_nfree = dev->db_num;
	return 0;
}

static void vrdma_free_bufs(struct vrdma_dev *dev)
{
	kfree(dev->db_bufs);
	kfree(dev->db_free);
	kfree(dev->ev_bufs);
	kfree(dev->ctrl_req);
	kfree(dev->ctrl_resp);
}

static int vrdma_probe(struct virtio_device *vdev)
{
	struct vrdma_dev *dev;
	unsigned int i;
	int err;

	vrdma_abi_check();
	/*
	 * The device has no VIRTIO_F_ACCESS_PLATFORM: every address it is given is a
	 * guest-physical address, which memory encryption makes meaningless.
	 */
	if (cc_platform_has(CC_ATTR_MEM_ENCRYPT)) {
		dev_err(&vdev->dev, "guest memory is encrypted; the device cannot reach it\n");
		return -ENODEV;
	}
	if (!virtio_has_feature(vdev, VIRTIO_F_VERSION_1))
		return -ENODEV;

	dev = ib_alloc_device(vrdma_dev, ib);
	if (!dev)
		return -ENOMEM;
	dev->vdev = vdev;
	vdev->priv = dev;
	mutex_init(&dev->ctrl_lock);
	init_completion(&dev->ctrl_done);
	spin_lock_init(&dev->db_lock);
	spin_lock_init(&dev->ev_lock);
	INIT_LIST_HEAD(&dev->db_backlog);
	INIT_WORK(&dev->port_work, vrdma_port_work);
	xa_init_flags(&dev->cqs, XA_FLAGS_ALLOC1);
	xa_init_flags(&dev->qps, 0);
	xa_init_flags(&dev->srqs, 0);
	xa_init(&dev->odp_mrs);

	err = vrdma_init_vqs(dev);
	if (err)
		goto err_vqs;
	virtio_device_ready(vdev);
	virtqueue_disable_cb(dev->db_vq);

	spin_lock_irq(&dev->ev_lock);
	for (i = 0; i < dev->ev_num; i++)
		ev_post(dev, &dev->ev_bufs[i]);
	virtqueue_kick(dev->ev_vq);
	spin_unlock_irq(&dev->ev_lock);

	virtio_cread_bytes(vdev, 0, &dev->cfg, sizeof(dev->cfg));
	if (le32_to_cpu(dev->cfg.version) != VRDMA_VERSION) {
		/* QUERY_DEVICE returns the same bytes */
		err = vrdma_cmd(dev, VRDMA_CMD_QUERY_DEVICE, NULL, 0, &dev->cfg, sizeof(dev->cfg));
		if (err || le32_to_cpu(dev->cfg.version) != VRDMA_VERSION) {
			dev_err(&vdev->dev, "unsupported device version %u\n",
				le32_to_cpu(dev->cfg.version));
			err = -ENODEV;
			goto err_reset;
		}
	}
	memcpy(dev->mac, dev->cfg.mac, ETH_ALEN);
	if (!(le32_to_cpu(dev->cfg.caps) & VRDMA_CAP_CQ_NOTIFY_WORD)) {
		dev_err(&vdev->dev, "device cannot arm CQs through the ring header\n");
		err = -ENODEV;
		goto err_reset;
	}
	/* A driver reloaded on a live device starts from a clean one. */
	err = vrdma_cmd(dev, VRDMA_CMD_RESET, NULL, 0, NULL, 0);
	if (err)
		goto err_reset;

	if (le32_to_cpu(dev->cfg.caps) & VRDMA_CAP_GID_SOURCES) {
		err = vrdma_cmd(dev, VRDMA_CMD_QUERY_GID_SOURCES, NULL, 0, &dev->sources,
				sizeof(dev->sources));
		if (err)
			memset(&dev->sources, 0, sizeof(dev->sources));
		for (i = 0; i < min_t(u32, le32_to_cpu(dev->sources.count),
				      VRDMA_MAX_GID_SOURCES); i++)
			dev_info(&vdev->dev,
				 "the device sends from %pI6c: only that GID of the paired netdev works\n",
				 dev->sources.gids[i]);
	}
	vrdma_init_attrs(dev);
	err = vrdma_odp_init(dev);
	if (err)
		goto err_reset;
	ib_set_device_ops(&dev->ib, &vrdma_dev_ops);
	/* `rdma statistic` and hw_counters/: the device's counters, named as rxe's */
	if (le32_to_cpu(dev->cfg.caps) & VRDMA_CAP_HW_STATS)
		ib_set_device_ops(&dev->ib, &vrdma_hw_stats_ops);
	if (le32_to_cpu(dev->cfg.caps) & VRDMA_CAP_XRC)
		ib_set_device_ops(&dev->ib, &vrdma_xrc_ops);
	if (le32_to_cpu(dev->cfg.caps) & VRDMA_CAP_RAW_PACKET)
		ib_set_device_ops(&dev->ib, &vrdma_raw_ops);
	if (le32_to_cpu(dev->cfg.caps) & VRDMA_CAP_RSS)
		ib_set_device_ops(&dev->ib, &vrdma_rss_ops);
	dev->ib.node_type = RDMA_NODE_IB_CA;
	dev->ib.phys_port_cnt = 1;
	dev->ib.num_comp_vectors = 1;
	/*
	 * Two write() commands ib_uverbs leaves off unless the driver asks, as rxe does:
	 * librxe's doorbell (a zero-WR POST_SEND) and ibv_req_notify_cq (the arm is a
	 * driver store into the CQ ring header).
	 */
	dev->ib.uverbs_cmd_mask |= BIT_ULL(IB_USER_VERBS_CMD_POST_SEND) |
				   BIT_ULL(IB_USER_VERBS_CMD_REQ_NOTIFY_CQ);
	dev->ib.dev.parent = &vdev->dev;
	addrconf_addr_eui48((unsigned char *)&dev->ib.node_guid, dev->mac);
	strscpy(dev->ib.node_desc, "virtio-rdma", sizeof(dev->ib.node_desc));

	INIT_WORK(&dev->rescan_work, vrdma_rescan_work);
	/* Replays NETDEV_REGISTER for every netdev that exists already. */
	dev->nb.notifier_call = vrdma_netdev_event;
	err = register_netdevice_notifier(&dev->nb);
	if (err)
		goto err_reset;
	dev->nb_registered = true;

	/* No DMA device: ib_core uses virtual DMA; page lists carry page_to_phys(). */
	err = ib_register_device(&dev->ib, "vrdma%d", NULL);
	if (err)
		goto err_nb;
	WRITE_ONCE(dev->registered, true);
	dev_info(&vdev->dev, "%s: mac %pM, %s\n", dev_name(&dev->ib.dev), dev->mac,
		 rcu_access_pointer(dev->netdev) ? "paired" : "no netdev with that MAC yet");
	return 0;

err_nb:
	unregister_netdevice_notifier(&dev->nb);
err_reset:
	vrdma_odp_fini(dev);
	virtio_reset_device(vdev);
	vdev->config->del_vqs(vdev);
err_vqs:
	vrdma_free_bufs(dev);
	ib_dealloc_device(&dev->ib);
	return err;
}

static void vrdma_remove(struct virtio_device *vdev)
{
	struct vrdma_dev *dev = vdev->priv;

	unregister_netdevice_notifier(&dev->nb);
	cancel_work_sync(&dev->rescan_work);
	/* destroys every object through the verbs, which still need the control queue */
	ib_unregister_device(&dev->ib);
	cancel_work_sync(&dev->port_work);
	/* after every MR is gone: no fault is queued any more */
	vrdma_odp_fini(dev);
	virtio_reset_device(vdev);
	vdev->config->del_vqs(vdev);
	vrdma_free_bufs(dev);
	ib_dealloc_device(&dev->ib);
}

static const struct virtio_device_id id_table[] = {
	{ VIRTIO_ID_RDMA_DEV, VIRTIO_DEV_ANY_ID },
	{ 0 },
};

static unsigned int features[] = {};

static struct virtio_driver vrdma_driver = {
	.driver.name = KBUILD_MODNAME,
	.id_table = id_table,
	.feature_table = features,
	.feature_table_size = ARRAY_SIZE(features),
	.probe = vrdma_probe,
	.remove = vrdma_remove,
};

module_virtio_driver(vrdma_driver);
MODULE_DEVICE_TABLE(virtio, id_table);
MODULE_DESCRIPTION("virtio-rdma: paravirtual RoCEv2 device (rxe user ABI)");
MODULE_LICENSE("Dual BSD/GPL");
