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

const struct ib_device_ops vrdma_raw_ops = {
	.create_flow = vrdma_create_flow,
	.destroy_flow = vrdma_destroy_flow,
};
