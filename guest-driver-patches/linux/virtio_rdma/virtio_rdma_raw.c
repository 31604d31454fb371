// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * virtio_rdma: flow steering for raw packet QPs (caps RAW_PACKET, docs/virtio-rdma.md §5.13).
 *
 * A raw packet QP is an ordinary user QP of type IB_QPT_RAW_PACKET (vrdma_create_qp): each
 * send WQE is a whole Ethernet frame, each receive takes one. Which frames a QP receives is
 * what its flows say: ib_core hands create_flow a list of specs (Ethernet, IPv4, IPv6, TCP,
 * UDP, each a value and a mask), which all hold at once; the device takes them as one
 * FlowMatch. A field the device does not match on (IPv4 TOS/TTL/flags, IPv6 flow label,
 * traffic class, hop limit), an inner or action spec, or a flow type other than NORMAL is
 * refused with EOPNOTSUPP rather than ignored.
 *
 * Receive-side scaling (caps RSS, §5.14): a work queue is a raw packet QP with a receive ring
 * only, which librxe maps as it maps an RQ; an indirection table is ib_core's list of work
 * queues; an RSS QP is a raw packet QP with no ring and no CQ that SET_RSS points at the
 * table's work queues, with the Toeplitz key and fields librxe passes in its create_qp_ex.
 */

#include <linux/slab.h>

#include "virtio_rdma.h"

struct vrdma_flow {
	struct ib_flow ibflow;
	u32 handle;
};

/* One spec into the match; -EOPNOTSUPP for what the device does not match on. */
static int spec_to_match(const union ib_flow_spec *s, struct vrdma_flow_match *m, u32 *layers)
{
	switch (s->type) {
	case IB_FLOW_SPEC_ETH:
		memcpy(m->dst_mac, s->eth.val.dst_mac, 6);
		memcpy(m->dst_mac_mask, s->eth.mask.dst_mac, 6);
		memcpy(m->src_mac, s->eth.val.src_mac, 6);
		memcpy(m->src_mac_mask, s->eth.mask.src_mac, 6);
		m->ether_type = s->eth.val.ether_type;
		m->ether_type_mask = s->eth.mask.ether_type;
		m->vlan_tci = s->eth.val.vlan_tag;
		m->vlan_tci_mask = s->eth.mask.vlan_tag;
		return 0;
	case IB_FLOW_SPEC_IPV4:
		if (s->ipv4.mask.tos || s->ipv4.mask.ttl || s->ipv4.mask.flags)
			return -EOPNOTSUPP;
		*layers |= VRDMA_FLOW_IPV4;
		memcpy(m->src_ip, &s->ipv4.val.src_ip, 4);
		memcpy(m->src_ip_mask, &s->ipv4.mask.src_ip, 4);
		memcpy(m->dst_ip, &s->ipv4.val.dst_ip, 4);
		memcpy(m->dst_ip_mask, &s->ipv4.mask.dst_ip, 4);
		m->ip_proto = s->ipv4.val.proto;
		m->ip_proto_mask = s->ipv4.mask.proto;
		return 0;
	case IB_FLOW_SPEC_IPV6:
		if (s->ipv6.mask.flow_label || s->ipv6.mask.traffic_class ||
		    s->ipv6.mask.hop_limit)
			return -EOPNOTSUPP;
		*layers |= VRDMA_FLOW_IPV6;
		memcpy(m->src_ip, s->ipv6.val.src_ip, 16);
		memcpy(m->src_ip_mask, s->ipv6.mask.src_ip, 16);
		memcpy(m->dst_ip, s->ipv6.val.dst_ip, 16);
		memcpy(m->dst_ip_mask, s->ipv6.mask.dst_ip, 16);
		m->ip_proto = s->ipv6.val.next_hdr;
		m->ip_proto_mask = s->ipv6.mask.next_hdr;
		return 0;
	case IB_FLOW_SPEC_TCP:
	case IB_FLOW_SPEC_UDP:
		*layers |= s->type == IB_FLOW_SPEC_TCP ? VRDMA_FLOW_TCP : VRDMA_FLOW_UDP;
		m->src_port = s->tcp_udp.val.src_port;
		m->src_port_mask = s->tcp_udp.mask.src_port;
		m->dst_port = s->tcp_udp.val.dst_port;
		m->dst_port_mask = s->tcp_udp.mask.dst_port;
		return 0;
	default:
		return -EOPNOTSUPP;
	}
}

static struct ib_flow *vrdma_create_flow(struct ib_qp *ibqp, struct ib_flow_attr *attr,
					 struct ib_udata *udata)
{
	struct vrdma_qp *qp = container_of(ibqp, struct vrdma_qp, ibqp);
	struct vrdma_cmd_create_flow cmd = {};
	const u8 *p = (const u8 *)attr->flows;
	const u8 *end = (const u8 *)attr + attr->size;
	struct vrdma_flow *flow;
	struct vrdma_handle h;
	u32 layers = 0;
	int i, err;

	if (ibqp->qp_type != IB_QPT_RAW_PACKET)
		return ERR_PTR(-EOPNOTSUPP);
	if (attr->type != IB_FLOW_ATTR_NORMAL || attr->flags)
		return ERR_PTR(-EOPNOTSUPP);
	for (i = 0; i < attr->num_of_specs; i++) {
		const union ib_flow_spec *s = (const void *)p;

		if (p + sizeof(s->type) + sizeof(s->size) > end || s->size < 8 ||
		    p + s->size > end)
			return ERR_PTR(-EINVAL);
		err = spec_to_match(s, &cmd.m, &layers);
		if (err)
			return ERR_PTR(err);
		p += s->size;
	}
	cmd.qpn = cpu_to_le32(qp->qpn);
	cmd.m.layers = cpu_to_le32(layers);
	flow = kzalloc(sizeof(*flow), GFP_KERNEL);
	if (!flow)
		return ERR_PTR(-ENOMEM);
	err = vrdma_cmd(to_vdev(ibqp->device), VRDMA_CMD_CREATE_FLOW, &cmd, sizeof(cmd), &h,
			sizeof(h));
	if (err) {
		kfree(flow);
		return ERR_PTR(err);
	}
	flow->handle = le32_to_cpu(h.handle);
	return &flow->ibflow;
}

static int vrdma_destroy_flow(struct ib_flow *ibflow)
{
	struct vrdma_flow *flow = container_of(ibflow, struct vrdma_flow, ibflow);
	int err = vrdma_cmd_handle(to_vdev(ibflow->device), VRDMA_CMD_DESTROY_FLOW,
				   flow->handle);

	/* a device that lost its state (§9) no longer knows the flow: it is gone either way */
	if (err && err != -ENOENT && err != -EIO && err != -ETIMEDOUT)
		return err;
	kfree(flow);
	return 0;
}

/* --- work queues, indirection tables, RSS QPs ------------------------------------------ */

/* libibverbs' IBV_RX_HASH_FUNC_TOEPLITZ */
#define VRDMA_RX_HASH_FUNC_TOEPLITZ	1

/* an indirection table holds nothing of its own: ib_core keeps its work queues */
struct vrdma_ind_tbl {
	struct ib_rwq_ind_table ibtbl;
};

struct vrdma_wq {
	struct ib_wq ibwq;
	struct vrdma_queue rq;
	u32 qpn;
};

/* MODIFY_QP of a work queue's raw packet QP to `state`. */
static int wq_qp_state(struct vrdma_dev *dev, u32 qpn, enum ib_qp_state state, u32 mask)
{
	struct vrdma_qp_attrs c = {};

	c.qpn = cpu_to_le32(qpn);
	c.attr_mask = cpu_to_le32(IB_QP_STATE | mask);
	c.qp_state = cpu_to_le32(state);
	c.port_num = 1;
	return vrdma_cmd(dev, VRDMA_CMD_MODIFY_QP, &c, sizeof(c), NULL, 0);
}

static struct ib_wq *vrdma_create_wq(struct ib_pd *pd, struct ib_wq_init_attr *init,
				     struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(pd->device);
	const struct ib_device_attr *a = &dev->attrs;
	struct vrdma_create_wq_resp uresp = {};
	struct vrdma_cmd_create_qp cmd = {};
	struct vrdma_resp_create_qp r;
	struct vrdma_pl pl = {};
	struct vrdma_wq *wq;
	u32 slots, sge;
	int err;

	if (!udata || init->wq_type != IB_WQT_RQ || init->create_flags ||
	    !(le32_to_cpu(dev->cfg.caps) & VRDMA_CAP_RSS))
		return ERR_PTR(-EOPNOTSUPP);
	if (udata->outlen < sizeof(uresp))
		return ERR_PTR(-EINVAL);
	if (init->max_wr < 1 || init->max_wr > a->max_qp_wr || init->max_sge > a->max_recv_sge)
		return ERR_PTR(-EINVAL);
	wq = kzalloc(sizeof(*wq), GFP_KERNEL);
	if (!wq)
		return ERR_PTR(-ENOMEM);
	sge = max_t(u32, init->max_sge, 1);
	slots = roundup_pow_of_two(init->max_wr + 1);
	err = vrdma_queue_alloc(&wq->rq, slots, sizeof(struct rxe_recv_wqe) +
				sge * sizeof(struct rxe_sge));
	if (err)
		goto err_free;
	err = vrdma_queue_describe(dev, &wq->rq, &pl, &cmd.rq);
	if (err)
		goto err_q;
	cmd.qp_type = cpu_to_le32(IB_QPT_RAW_PACKET);
	cmd.pdn = cpu_to_le32(container_of(pd, struct vrdma_pd, ibpd)->pdn);
	cmd.send_cqn = cpu_to_le32(container_of(init->cq, struct vrdma_cq, ibcq)->cqn);
	cmd.recv_cqn = cmd.send_cqn;
	cmd.max_recv_wr = cpu_to_le32(slots - 1);
	cmd.max_recv_sge = cpu_to_le32(sge);
	err = vrdma_cmd(dev, VRDMA_CMD_CREATE_QP, &cmd, sizeof(cmd), &r, sizeof(r));
	vrdma_pl_free(&pl);
	if (err)
		goto err_q;
	wq->qpn = le32_to_cpu(r.qpn);
	wq->ibwq.wq_num = wq->qpn;
	init->max_wr = slots - 1;
	init->max_sge = sge;
	err = vrdma_queue_mmap(udata, &wq->rq, &uresp.mi);
	if (!err)
		err = ib_copy_to_udata(udata, &uresp, sizeof(uresp));
	if (err)
		goto err_destroy;
	return &wq->ibwq;

err_destroy:
	vrdma_cmd_handle(dev, VRDMA_CMD_DESTROY_QP, wq->qpn);
err_q:
	vrdma_pl_free(&pl);
	vrdma_queue_free(&wq->rq);
err_free:
	kfree(wq);
	return ERR_PTR(err);
}

static int vrdma_destroy_wq(struct ib_wq *ibwq, struct ib_udata *udata)
{
	struct vrdma_wq *wq = container_of(ibwq, struct vrdma_wq, ibwq);
	int err = vrdma_cmd_handle(to_vdev(ibwq->device), VRDMA_CMD_DESTROY_QP, wq->qpn);

	if (err && err != -ENOENT && err != -EIO && err != -ETIMEDOUT)
		return err;
	vrdma_queue_free(&wq->rq);
	kfree(wq);
	return 0;
}

/* RDY is the QP's RTR (it receives), RESET and ERR are the QP's. */
static int vrdma_modify_wq(struct ib_wq *ibwq, struct ib_wq_attr *attr, u32 mask,
			   struct ib_udata *udata)
{
	struct vrdma_wq *wq = container_of(ibwq, struct vrdma_wq, ibwq);
	struct vrdma_dev *dev = to_vdev(ibwq->device);
	enum ib_wq_state cur, next;
	int err = 0;

	if (mask & ~(IB_WQ_STATE | IB_WQ_CUR_STATE))
		return -EOPNOTSUPP;
	if (!(mask & IB_WQ_STATE))
		return 0;
	cur = (mask & IB_WQ_CUR_STATE) ? attr->curr_wq_state : ibwq->state;
	next = attr->wq_state;
	switch (next) {
	case IB_WQS_RDY:
		if (cur == IB_WQS_RDY)
			return 0;
		if (cur != IB_WQS_RESET)
			return -EINVAL;
		err = wq_qp_state(dev, wq->qpn, IB_QPS_INIT, IB_QP_PORT);
		if (!err)
			err = wq_qp_state(dev, wq->qpn, IB_QPS_RTR, 0);
		break;
	case IB_WQS_RESET:
		err = wq_qp_state(dev, wq->qpn, IB_QPS_RESET, 0);
		break;
	case IB_WQS_ERR:
		err = wq_qp_state(dev, wq->qpn, IB_QPS_ERR, 0);
		break;
	default:
		return -EINVAL;
	}
	if (!err)
		ibwq->state = next;
	return err;
}

static int vrdma_create_rwq_ind_table(struct ib_rwq_ind_table *tbl,
				      struct ib_rwq_ind_table_init_attr *init,
				      struct ib_udata *udata)
{
	static atomic_t next_num = ATOMIC_INIT(0);

	/* ib_core keeps the work queues (tbl->ind_tbl); SET_RSS takes them at the QP */
	if (init->log_ind_tbl_size > VRDMA_RSS_MAX_LOG_TABLE)
		return -EINVAL;
	tbl->ind_tbl_num = atomic_inc_return(&next_num);
	return 0;
}

static int vrdma_destroy_rwq_ind_table(struct ib_rwq_ind_table *tbl)
{
	return 0;
}

/* create_qp of a QP with an indirection table: a raw packet QP with no ring, then SET_RSS. */
int vrdma_create_rss_qp(struct vrdma_qp *qp, struct ib_qp_init_attr *init,
			struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(qp->ibqp.device);
	struct ib_rwq_ind_table *tbl = init->rwq_ind_tbl;
	struct vrdma_cmd_create_qp cmd = {};
	struct vrdma_create_qp_rss ucmd = {};
	struct vrdma_resp_create_qp r;
	struct vrdma_cmd_set_rss *rss;
	unsigned long flags;
	u32 i, n;
	int err;

	if (!udata || init->qp_type != IB_QPT_RAW_PACKET || init->create_flags ||
	    init->cap.max_send_wr || !(le32_to_cpu(dev->cfg.caps) & VRDMA_CAP_RSS))
		return -EOPNOTSUPP;
	err = ib_copy_from_udata(&ucmd, udata, min(udata->inlen, sizeof(ucmd)));
	if (err)
		return err;
	if (ucmd.rx_hash_function != VRDMA_RX_HASH_FUNC_TOEPLITZ || ucmd.rx_key_len != 40 ||
	    ucmd.rx_hash_fields_mask & ~(u64)VRDMA_RSS_FIELDS)
		return -EOPNOTSUPP;
	n = 1U << tbl->log_ind_tbl_size;
	rss = kzalloc(sizeof(*rss), GFP_KERNEL);
	if (!rss)
		return -ENOMEM;
	spin_lock_init(&qp->sq_lock);
	spin_lock_init(&qp->rq_lock);
	INIT_LIST_HEAD(&qp->db_node);
	qp->is_user = true;
	cmd.qp_type = cpu_to_le32(IB_QPT_RAW_PACKET);
	cmd.pdn = cpu_to_le32(container_of(qp->ibqp.pd, struct vrdma_pd, ibpd)->pdn);
	err = vrdma_cmd(dev, VRDMA_CMD_CREATE_QP, &cmd, sizeof(cmd), &r, sizeof(r));
	if (err)
		goto out;
	qp->qpn = le32_to_cpu(r.qpn);
	qp->ibqp.qp_num = qp->qpn;
	rss->qpn = cpu_to_le32(qp->qpn);
	rss->fields = cpu_to_le32((u32)ucmd.rx_hash_fields_mask);
	rss->log_table_size = cpu_to_le32(tbl->log_ind_tbl_size);
	rss->key_len = cpu_to_le32(40);
	memcpy(rss->key, ucmd.rx_hash_key, 40);
	for (i = 0; i < n; i++)
		rss->table[i] = cpu_to_le32(container_of(tbl->ind_tbl[i], struct vrdma_wq,
							 ibwq)->qpn);
	err = vrdma_cmd(dev, VRDMA_CMD_SET_RSS, rss, sizeof(*rss), NULL, 0);
	if (!err) {
		spin_lock_irqsave(&dev->ev_lock, flags);
		err = xa_err(xa_store(&dev->qps, qp->qpn, qp, GFP_ATOMIC));
		spin_unlock_irqrestore(&dev->ev_lock, flags);
	}
	if (err)
		vrdma_cmd_handle(dev, VRDMA_CMD_DESTROY_QP, qp->qpn);
	memset(&init->cap, 0, sizeof(init->cap));
out:
	kfree(rss);
	return err;
}

const struct ib_device_ops vrdma_raw_ops = {
	.create_flow = vrdma_create_flow,
	.destroy_flow = vrdma_destroy_flow,
};

const struct ib_device_ops vrdma_rss_ops = {
	.create_rwq_ind_table = vrdma_create_rwq_ind_table,
	.create_wq = vrdma_create_wq,
	.destroy_rwq_ind_table = vrdma_destroy_rwq_ind_table,
	.destroy_wq = vrdma_destroy_wq,
	.modify_wq = vrdma_modify_wq,

	INIT_RDMA_OBJ_SIZE(ib_rwq_ind_table, vrdma_ind_tbl, ibtbl),
};
