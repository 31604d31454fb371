// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * virtio_rdma: XRC (caps XRC, docs/virtio-rdma.md §5.12).
 *
 * An XRC domain is a device object (ALLOC_XRCD); ib_core shares it between processes through
 * the file ibv_open_xrcd names, so the device sees one domain. XRC SRQs are created by
 * vrdma_create_srq (CREATE_XRC_SRQ) and XRC INI QPs by vrdma_create_qp (a send queue only);
 * XRC TGT QPs, here, have no ring at all: ib_core creates them itself, with no udata even
 * for user space, and shares them (ib_open_qp). The device takes each request's receive WQE,
 * CQ and PD from the XRC SRQ it names.
 */

#include "virtio_rdma.h"

static int vrdma_alloc_xrcd(struct ib_xrcd *ibxrcd, struct ib_udata *udata)
{
	struct vrdma_xrcd *x = container_of(ibxrcd, struct vrdma_xrcd, ibxrcd);
	struct vrdma_handle h;
	int err;

	err = vrdma_cmd(to_vdev(ibxrcd->device), VRDMA_CMD_ALLOC_XRCD, NULL, 0, &h, sizeof(h));
	if (err)
		return err;
	x->xrcdn = le32_to_cpu(h.handle);
	return 0;
}

static int vrdma_dealloc_xrcd(struct ib_xrcd *ibxrcd, struct ib_udata *udata)
{
	struct vrdma_xrcd *x = container_of(ibxrcd, struct vrdma_xrcd, ibxrcd);
	int err = vrdma_cmd_handle(to_vdev(ibxrcd->device), VRDMA_CMD_DEALLOC_XRCD, x->xrcdn);

	/* a device that lost its state (§9) no longer knows the domain: it is gone either way */
	return err == -ENOENT || err == -EIO || err == -ETIMEDOUT ? 0 : err;
}

/* CREATE_QP of an XRC TGT QP in init->xrcd: no PD, CQ, SRQ or ring (the KERNEL flag: no
 * ring is ever mapped to user space). */
int vrdma_create_xrc_tgt(struct vrdma_qp *qp, struct ib_qp_init_attr *init)
{
	struct vrdma_dev *dev = to_vdev(qp->ibqp.device);
	struct vrdma_cmd_create_qp cmd = {};
	struct vrdma_resp_create_qp r;
	unsigned long flags;
	int err;

	if (!(le32_to_cpu(dev->cfg.caps) & VRDMA_CAP_XRC) || !init->xrcd)
		return -EOPNOTSUPP;
	spin_lock_init(&qp->sq_lock);
	spin_lock_init(&qp->rq_lock);
	INIT_LIST_HEAD(&qp->db_node);
	qp->sq_sig_type = init->sq_sig_type;
	cmd.qp_type = cpu_to_le32(IB_QPT_XRC_TGT);
	cmd.flags = cpu_to_le32(VRDMA_CREATE_QP_KERNEL);
	cmd.xrcdn = cpu_to_le32(container_of(init->xrcd, struct vrdma_xrcd, ibxrcd)->xrcdn);
	err = vrdma_cmd(dev, VRDMA_CMD_CREATE_QP, &cmd, sizeof(cmd), &r, sizeof(r));
	if (err)
		return err;
	qp->qpn = le32_to_cpu(r.qpn);
	qp->ibqp.qp_num = qp->qpn;
	memset(&init->cap, 0, sizeof(init->cap));
	spin_lock_irqsave(&dev->ev_lock, flags);
	err = xa_err(xa_store(&dev->qps, qp->qpn, qp, GFP_ATOMIC));
	spin_unlock_irqrestore(&dev->ev_lock, flags);
	if (err)
		vrdma_cmd_handle(dev, VRDMA_CMD_DESTROY_QP, qp->qpn);
	return err;
}

const struct ib_device_ops vrdma_xrc_ops = {
	.alloc_xrcd = vrdma_alloc_xrcd,
	.dealloc_xrcd = vrdma_dealloc_xrcd,

	INIT_RDMA_OBJ_SIZE(ib_xrcd, vrdma_xrcd, ibxrcd),
};
