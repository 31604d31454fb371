// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * virtio_rdma verbs. Every object lives in the device; the driver allocates the rings
 * (rxe_queue_buf, exactly as rxe sizes them), describes them to the device by page lists
 * of guest-physical addresses, and answers ib_uverbs the way rxe does (mmap_info for each
 * ring), so librxe works unchanged: post_recv and poll_cq stay in user space and
 * post_send is a doorbell.
 */

#include <linux/vmalloc.h>
#include <linux/unaligned.h>
#include <linux/mm.h>
#include <rdma/ib_addr.h>
#include <rdma/ib_cache.h>
#include <rdma/ib_mad.h>
#include <rdma/uverbs_ioctl.h>
/* the DMA block iterator has a header of its own in newer kernels, ib_umem.h's before */
#if __has_include(<rdma/iter.h>)
#include <rdma/iter.h>
#endif

#include "virtio_rdma.h"

static bool kernel_verbs = true;
module_param(kernel_verbs, bool, 0444);
MODULE_PARM_DESC(kernel_verbs, "kernel QPs (QP1 for ib_mad, the CM and rdma_cm; kernel ULPs)");

static bool trace_verbs;
module_param(trace_verbs, bool, 0644);
MODULE_PARM_DESC(trace_verbs, "log QP creation and doorbells (driver debugging)");

/* --- rings and page lists ------------------------------------------------------------- */

#define PL_PER_PAGE (PAGE_SIZE / sizeof(__le64))

void vrdma_pl_free(struct vrdma_pl *pl)
{
	unsigned int i;

	for (i = 0; i < pl->npages; i++)
		free_page((unsigned long)pl->pages[i]);
	kvfree(pl->pages);
	pl->pages = NULL;
	pl->npages = 0;
}

/*
 * Builds a page list of n data pages (4 KiB) whose GPAs next() yields in order, with as
 * few levels of 4 KiB list pages as needed (docs/virtio-rdma.md §5.1). The device copies
 * the list at command time, so it is freed right after the command.
 */
int vrdma_pl_build(struct vrdma_dev *dev, struct vrdma_pl *pl, u32 n,
		    u64 (*next)(void *ctx), void *ctx)
{
	u32 l1 = DIV_ROUND_UP(n, PL_PER_PAGE), l2 = DIV_ROUND_UP(l1, PL_PER_PAGE);
	u32 levels = n <= PL_PER_PAGE ? 0 : l1 <= PL_PER_PAGE ? 1 : 2;
	u32 nleaf = levels ? l1 : 1, nmid = levels == 2 ? l2 : 0;
	u32 total = nleaf + nmid + (levels ? 1 : 0), i;
	__le64 *top;

	memset(pl, 0, sizeof(*pl));
	if (!n || (levels == 2 && l2 > PL_PER_PAGE))
		return -EINVAL;
	if (levels && !(le32_to_cpu(dev->cfg.caps) & VRDMA_CAP_MULTI_LEVEL_PAGE_LIST))
		return -EOPNOTSUPP;
	pl->pages = kvcalloc(total, sizeof(void *), GFP_KERNEL);
	if (!pl->pages)
		return -ENOMEM;
	for (i = 0; i < total; i++) {
		pl->pages[i] = (void *)get_zeroed_page(GFP_KERNEL);
		if (!pl->pages[i]) {
			vrdma_pl_free(pl);
			return -ENOMEM;
		}
		pl->npages++;
	}
	for (i = 0; i < n; i++)
		((__le64 *)pl->pages[i / PL_PER_PAGE])[i % PL_PER_PAGE] = cpu_to_le64(next(ctx));
	if (levels == 0) {
		top = pl->pages[0];
	} else if (levels == 1) {
		top = pl->pages[nleaf];
		for (i = 0; i < nleaf; i++)
			top[i] = cpu_to_le64(virt_to_phys(pl->pages[i]));
	} else {
		for (i = 0; i < nleaf; i++)
			((__le64 *)pl->pages[nleaf + i / PL_PER_PAGE])[i % PL_PER_PAGE] =
				cpu_to_le64(virt_to_phys(pl->pages[i]));
		top = pl->pages[nleaf + nmid];
		for (i = 0; i < nmid; i++)
			top[i] = cpu_to_le64(virt_to_phys(pl->pages[nleaf + i]));
	}
	pl->desc.gpa = cpu_to_le64(virt_to_phys(top));
	pl->desc.num_pages = cpu_to_le32(n);
	pl->desc.page_shift = PAGE_SHIFT;
	pl->desc.levels = levels;
	return 0;
}

struct vmalloc_it {
	void *buf;
	u32 i;
};

static u64 vmalloc_next(void *ctx)
{
	struct vmalloc_it *it = ctx;

	return page_to_phys(vmalloc_to_page(it->buf + (size_t)it->i++ * PAGE_SIZE));
}

/* A ring of num_slots (power of two) slots of at least elem_size bytes. */
int vrdma_queue_alloc(struct vrdma_queue *q, u32 num_slots, u32 elem_size)
{
	memset(q, 0, sizeof(*q));
	q->num_slots = num_slots;
	q->log2 = order_base_2(elem_size);
	q->size = PAGE_ALIGN(VRDMA_RING_HDR + ((size_t)num_slots << q->log2));
	q->buf = vmalloc_user(q->size);
	if (!q->buf)
		return -ENOMEM;
	q->buf->log2_elem_size = q->log2;
	q->buf->index_mask = num_slots - 1;
	return 0;
}

void vrdma_queue_free(struct vrdma_queue *q)
{
	if (q->mmap) {
		/* the buffer goes with the mmap entry (user mappings keep their pages) */
		rdma_user_mmap_entry_remove(&q->mmap->rdma);
		q->mmap = NULL;
	} else {
		vfree(q->buf);
	}
	q->buf = NULL;
}

int vrdma_queue_describe(struct vrdma_dev *dev, struct vrdma_queue *q, struct vrdma_pl *pl,
			 struct vrdma_queue_desc *d)
{
	struct vmalloc_it it = { .buf = q->buf };
	int err;

	err = vrdma_pl_build(dev, pl, q->size >> PAGE_SHIFT, vmalloc_next, &it);
	if (err)
		return err;
	d->pages = pl->desc;
	d->num_slots = cpu_to_le32(q->num_slots);
	d->log2_elem_size = cpu_to_le32(q->log2);
	d->reserved = 0;
	return 0;
}

/* Makes a user ring mmap-able, rxe style; fills the mminfo librxe reads. */
int vrdma_queue_mmap(struct ib_udata *udata, struct vrdma_queue *q, struct mminfo *mi)
{
	struct vrdma_ucontext *uctx =
		rdma_udata_to_drv_context(udata, struct vrdma_ucontext, ibuc);
	struct vrdma_mmap_entry *e;
	int err;

	e = kzalloc(sizeof(*e), GFP_KERNEL);
	if (!e)
		return -ENOMEM;
	e->buf = q->buf;
	err = rdma_user_mmap_entry_insert(&uctx->ibuc, &e->rdma, q->size);
	if (err) {
		kfree(e);
		return err;
	}
	q->mmap = e;
	mi->offset = rdma_user_mmap_get_offset(&e->rdma);
	mi->size = q->size;
	mi->pad = 0;
	return 0;
}

static int vrdma_mmap(struct ib_ucontext *uctx, struct vm_area_struct *vma)
{
	struct rdma_user_mmap_entry *re = rdma_user_mmap_entry_get(uctx, vma);
	struct vrdma_mmap_entry *e;
	int err;

	if (!re)
		return -EINVAL;
	e = container_of(re, struct vrdma_mmap_entry, rdma);
	err = remap_vmalloc_range(vma, e->buf, 0);
	rdma_user_mmap_entry_put(re);
	return err;
}

static void vrdma_mmap_free(struct rdma_user_mmap_entry *re)
{
	struct vrdma_mmap_entry *e = container_of(re, struct vrdma_mmap_entry, rdma);

	vfree(e->buf);
	kfree(e);
}

/* --- device and port ------------------------------------------------------------------ */


/* ib_device_cap_flags of the config space's device_cap_flags that are reported as the device
 * states them: RDMA FLUSH (IB_UVERBS_DEVICE_FLUSH_GLOBAL/PERSISTENT). */
#define VRDMA_DEVICE_CAP_FLAGS_PASSED	(IB_DEVICE_FLUSH_GLOBAL | IB_DEVICE_FLUSH_PERSISTENT)

/* ib_device_attr from the config space; limits that rings round to a power of two are
 * reported as 2^n - 1 so that a request for the maximum fits. */
void vrdma_init_attrs(struct vrdma_dev *dev)
{
	const struct vrdma_config *c = &dev->cfg;
	struct ib_device_attr *a = &dev->attrs;

	memset(a, 0, sizeof(*a));
	a->fw_ver = 0;
	a->sys_image_guid = 0;
	a->max_mr_size = le64_to_cpu(c->max_mr_size);
	/* 4 KiB pages only: that is what the driver hands the device */
	a->page_size_cap = PAGE_SIZE;
	a->vendor_id = 0x1af4;
	a->vendor_part_id = VIRTIO_ID_RDMA_DEV;
	a->hw_ver = le32_to_cpu(c->version);
	a->max_qp = le32_to_cpu(c->max_qp);
	a->max_qp_wr = rounddown_pow_of_two(le32_to_cpu(c->max_qp_wr) + 1) - 1;
	a->device_cap_flags = IB_DEVICE_RC_RNR_NAK_GEN | IB_DEVICE_SYS_IMAGE_GUID |
			      IB_DEVICE_PORT_ACTIVE_EVENT;
	if (le32_to_cpu(c->caps) & VRDMA_CAP_FAST_REG)
		a->device_cap_flags |= IB_DEVICE_MEM_MGT_EXTENSIONS;
	if (le32_to_cpu(c->caps) & VRDMA_CAP_MEM_WINDOW)
		a->device_cap_flags |= IB_DEVICE_MEM_WINDOW | IB_DEVICE_MEM_WINDOW_TYPE_2B;
	if (le32_to_cpu(c->caps) & VRDMA_CAP_SRQ_RESIZE)
		a->device_cap_flags |= IB_DEVICE_SRQ_RESIZE;
	if (le32_to_cpu(c->caps) & VRDMA_CAP_XRC)
		a->device_cap_flags |= IB_DEVICE_XRC;
	/* Flags that need nothing of the driver, taken from the device as it states them:
	 * ib_core lets MRs have IB_ACCESS_FLUSH_* only with these, and the FLUSH work
	 * requests go from librxe's ring to the device unchanged. */
	a->device_cap_flags |= le64_to_cpu(c->device_cap_flags) & VRDMA_DEVICE_CAP_FLAGS_PASSED;
	a->max_mw = le32_to_cpu(c->max_mw);
	a->max_send_sge = le32_to_cpu(c->max_sge);
	a->max_recv_sge = le32_to_cpu(c->max_sge);
	a->max_sge_rd = le32_to_cpu(c->max_sge);
	a->max_cq = le32_to_cpu(c->max_cq);
	a->max_cqe = rounddown_pow_of_two(le32_to_cpu(c->max_cqe) + 1) - 1;
	a->max_mr = le32_to_cpu(c->max_mr);
	a->max_pd = le32_to_cpu(c->max_pd);
	a->max_qp_rd_atom = le32_to_cpu(c->max_qp_rd_atom);
	a->max_qp_init_rd_atom = le32_to_cpu(c->max_qp_init_rd_atom);
	a->max_res_rd_atom = 0x3f000;
	a->atomic_cap = IB_ATOMIC_HCA;
	a->max_mcast_grp = le32_to_cpu(c->max_mcast_grp);
	a->max_mcast_qp_attach = le32_to_cpu(c->max_mcast_qp_attach);
	a->max_total_mcast_qp_attach = a->max_mcast_grp * a->max_mcast_qp_attach;
	a->max_ah = le32_to_cpu(c->max_ah);
	if (le32_to_cpu(c->caps) & VRDMA_CAP_SRQ) {
		a->max_srq = le32_to_cpu(c->max_srq);
		a->max_srq_wr = rounddown_pow_of_two(le32_to_cpu(c->max_srq_wr) + 1) - 1;
		a->max_srq_sge = le32_to_cpu(c->max_srq_sge);
	}
	a->max_pkeys = 1;
	a->local_ca_ack_delay = 15;
	a->max_fast_reg_page_list_len = 512;
	vrdma_odp_attrs(dev, a);
}

static int vrdma_query_device(struct ib_device *ib, struct ib_device_attr *attr,
			      struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ib);

	if (udata && (udata->inlen || udata->outlen))
		return -EINVAL;
	*attr = dev->attrs;
	attr->sys_image_guid = dev->ib.node_guid;
	return 0;
}

static int vrdma_query_port(struct ib_device *ib, u32 port, struct ib_port_attr *attr)
{
	struct vrdma_dev *dev = to_vdev(ib);
	struct vrdma_cmd_query_port cmd = { .port_num = cpu_to_le32(port) };
	struct vrdma_resp_query_port r;
	int err;

	err = vrdma_cmd(dev, VRDMA_CMD_QUERY_PORT, &cmd, sizeof(cmd), &r, sizeof(r));
	if (err)
		return err;
	/* ib_core zeroes attr before calling */
	attr->state = le32_to_cpu(r.state);
	attr->max_mtu = le32_to_cpu(r.max_mtu);
	attr->active_mtu = le32_to_cpu(r.active_mtu);
	attr->gid_tbl_len = le32_to_cpu(r.gid_tbl_len);
	/* ib_cm sets CM_SUP through ib_modify_port, which RoCE ports accept without an op */
	attr->port_cap_flags = le32_to_cpu(r.port_cap_flags) | IB_PORT_CM_SUP;
	attr->max_msg_sz = le32_to_cpu(r.max_msg_sz);
	attr->pkey_tbl_len = le16_to_cpu(r.pkey_tbl_len);
	attr->phys_state = r.phys_state;
	attr->active_width = r.active_width;
	attr->active_speed = r.active_speed;
	attr->bad_pkey_cntr = 0;
	attr->qkey_viol_cntr = 0;
	if (READ_ONCE(dev->dead)) {
		/* DEVICE_FATAL: this instance carries nothing until the re-probe replaces it (the
		 * device answers for its new state, which is not this one's) */
		attr->state = IB_PORT_DOWN;
		attr->phys_state = IB_PORT_PHYS_STATE_DISABLED;
	}
	return 0;
}

static enum rdma_link_layer vrdma_get_link_layer(struct ib_device *ib, u32 port)
{
	return IB_LINK_LAYER_ETHERNET;
}

static int vrdma_get_port_immutable(struct ib_device *ib, u32 port,
				    struct ib_port_immutable *im)
{
	struct ib_port_attr attr;
	int err;

	err = ib_query_port(ib, port, &attr);
	if (err)
		return err;
	im->pkey_tbl_len = attr.pkey_tbl_len;
	im->gid_tbl_len = attr.gid_tbl_len;
	/*
	 * RoCEv2 only (no RoCEv1 GIDs: the device refuses them). With kernel QPs, ib_mad
	 * opens QP1 on the port and the CM (and so rdma_cm) runs over it.
	 */
	if (kernel_verbs) {
		im->core_cap_flags = RDMA_CORE_PORT_IBA_ROCE_UDP_ENCAP;
		im->max_mad_size = IB_MGMT_MAD_SIZE;
	} else {
		im->core_cap_flags = RDMA_CORE_CAP_PROT_ROCE_UDP_ENCAP | RDMA_CORE_CAP_ETH_AH;
		im->max_mad_size = 0;
	}
	return 0;
}

static int vrdma_query_pkey(struct ib_device *ib, u32 port, u16 index, u16 *pkey)
{
	if (index > 0)
		return -EINVAL;
	*pkey = IB_DEFAULT_PKEY_FULL;
	return 0;
}

/*
 * Multicast: the QP joins or leaves the group in the device, which delivers the group's
 * datagrams to every attached QP. The group's traffic on the wire (IGMP/MLD) is the netdev's:
 * rdma_cm joins through it.
 */
static int vrdma_mcast(struct ib_qp *ibqp, union ib_gid *gid, u32 op)
{
	struct vrdma_cmd_mcast cmd = {
		.qpn = cpu_to_le32(ibqp->qp_num),
	};

	memcpy(cmd.gid, gid->raw, sizeof(cmd.gid));
	return vrdma_cmd(to_vdev(ibqp->device), op, &cmd, sizeof(cmd), NULL, 0);
}

static int vrdma_attach_mcast(struct ib_qp *ibqp, union ib_gid *gid, u16 lid)
{
	return vrdma_mcast(ibqp, gid, VRDMA_CMD_ATTACH_MCAST);
}

static int vrdma_detach_mcast(struct ib_qp *ibqp, union ib_gid *gid, u16 lid)
{
	return vrdma_mcast(ibqp, gid, VRDMA_CMD_DETACH_MCAST);
}

static int vrdma_add_gid(const struct ib_gid_attr *attr, void **context)
{
	struct vrdma_dev *dev = to_vdev(attr->device);
	struct vrdma_cmd_add_gid cmd = {
		.index = cpu_to_le32(attr->index),
		.gid_type = cpu_to_le32(attr->gid_type),
	};

	memcpy(cmd.gid, attr->gid.raw, sizeof(cmd.gid));
	return vrdma_cmd(dev, VRDMA_CMD_ADD_GID, &cmd, sizeof(cmd), NULL, 0);
}

static int vrdma_del_gid(const struct ib_gid_attr *attr, void **context)
{
	return vrdma_cmd_handle(to_vdev(attr->device), VRDMA_CMD_DEL_GID, attr->index);
}

static int vrdma_alloc_ucontext(struct ib_ucontext *uctx, struct ib_udata *udata)
{
	return 0;
}

/*
 * QUERY_CONTEXT (ibv_import_device: a second context over a command fd another process
 * opened): ib_core answers the generic attributes; the rxe user ABI has nothing of the
 * driver's to add.
 */
static int vrdma_query_ucontext(struct ib_ucontext *uctx, struct uverbs_attr_bundle *attrs)
{
	return 0;
}

static void vrdma_dealloc_ucontext(struct ib_ucontext *uctx)
{
}

/* --- PD ------------------------------------------------------------------------------- */

static int vrdma_alloc_pd(struct ib_pd *ibpd, struct ib_udata *udata)
{
	struct vrdma_pd *pd = container_of(ibpd, struct vrdma_pd, ibpd);
	struct vrdma_handle h;
	int err;

	err = vrdma_cmd(to_vdev(ibpd->device), VRDMA_CMD_CREATE_PD, NULL, 0, &h, sizeof(h));
	if (err)
		return err;
	pd->pdn = le32_to_cpu(h.handle);
	return 0;
}

static int vrdma_dealloc_pd(struct ib_pd *ibpd, struct ib_udata *udata)
{
	struct vrdma_pd *pd = container_of(ibpd, struct vrdma_pd, ibpd);
	int err = vrdma_cmd_handle(to_vdev(ibpd->device), VRDMA_CMD_DESTROY_PD, pd->pdn);

	/* a device that lost its state (§9) no longer knows the PD: it is gone either way */
	return err == -ENOENT || err == -EIO || err == -ETIMEDOUT ? 0 : err;
}

static u32 pdn_of(struct ib_pd *ibpd)
{
	return container_of(ibpd, struct vrdma_pd, ibpd)->pdn;
}

/* --- CQ ------------------------------------------------------------------------------- */

static int vrdma_create_cq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr,
			   struct uverbs_attr_bundle *attrs)
{
	struct ib_udata *udata = attrs ? &attrs->driver_udata : NULL;
	struct vrdma_cq *cq = container_of(ibcq, struct vrdma_cq, ibcq);
	struct vrdma_dev *dev = to_vdev(ibcq->device);
	struct vrdma_cmd_create_cq cmd = {};
	struct rxe_create_cq_resp uresp = {};
	struct vrdma_resp_create_cq r;
	struct vrdma_pl pl;
	unsigned long flags;
	int err;

	if (attr->flags)
		return -EOPNOTSUPP;
	if (attr->cqe < 1 || attr->cqe > dev->attrs.max_cqe)
		return -EINVAL;
	if (udata && udata->outlen < sizeof(uresp))
		return -EINVAL;
	cq->is_user = !!udata;
	spin_lock_init(&cq->lock);
	err = vrdma_queue_alloc(&cq->q, roundup_pow_of_two(attr->cqe + 1), 1 << VRDMA_CQ_LOG2_ELEM);
	if (err)
		return err;
	err = vrdma_queue_describe(dev, &cq->q, &pl, &cmd.queue);
	if (err)
		goto err_q;
	cmd.cqe = cpu_to_le32(attr->cqe);
	err = vrdma_cmd(dev, VRDMA_CMD_CREATE_CQ, &cmd, sizeof(cmd), &r, sizeof(r));
	vrdma_pl_free(&pl);
	if (err)
		goto err_q;
	cq->cqn = le32_to_cpu(r.cqn);
	ibcq->cqe = le32_to_cpu(r.cqe);
	if (udata) {
		err = vrdma_queue_mmap(udata, &cq->q, &uresp.mi);
		if (!err)
			err = ib_copy_to_udata(udata, &uresp, sizeof(uresp));
		if (err)
			goto err_destroy;
	}
	spin_lock_irqsave(&dev->ev_lock, flags);
	err = xa_err(xa_store(&dev->cqs, cq->cqn, cq, GFP_ATOMIC));
	spin_unlock_irqrestore(&dev->ev_lock, flags);
	if (err)
		goto err_destroy;
	return 0;

err_destroy:
	vrdma_cmd_handle(dev, VRDMA_CMD_DESTROY_CQ, cq->cqn);
err_q:
	vrdma_queue_free(&cq->q);
	return err;
}

/*
 * RESIZE_CQ hands the device a new ring; it moves the unconsumed entries and the arm.
 * librxe holds its CQ lock across the call and maps the new ring from rxe's
 * rxe_resize_cq_resp; kernel pollers are kept out by the CQ lock.
 */
static int vrdma_resize_cq(struct ib_cq *ibcq, int cqe, struct ib_udata *udata)
{
	struct vrdma_cq *cq = container_of(ibcq, struct vrdma_cq, ibcq);
	struct vrdma_dev *dev = to_vdev(ibcq->device);
	struct vrdma_cmd_resize_cq cmd = {};
	struct rxe_resize_cq_resp uresp = {};
	struct vrdma_resp_create_cq r;
	struct vrdma_queue q, old;
	unsigned long flags;
	struct vrdma_pl pl;
	int err;

	if (cqe < 1 || cqe > dev->attrs.max_cqe)
		return -EINVAL;
	if (udata && udata->outlen < sizeof(uresp))
		return -EINVAL;
	err = vrdma_queue_alloc(&q, roundup_pow_of_two(cqe + 1), 1 << VRDMA_CQ_LOG2_ELEM);
	if (err)
		return err;
	err = vrdma_queue_describe(dev, &q, &pl, &cmd.queue);
	if (err)
		goto err_q;
	cmd.cqn = cpu_to_le32(cq->cqn);
	cmd.cqe = cpu_to_le32(cqe);
	if (udata) {
		/* the mapping first: a failure after the device switched rings is unrecoverable */
		err = vrdma_queue_mmap(udata, &q, &uresp.mi);
		if (err) {
			vrdma_pl_free(&pl);
			goto err_q;
		}
	}
	spin_lock_irqsave(&cq->lock, flags);
	old = cq->q;
	cq->resizing = true;
	spin_unlock_irqrestore(&cq->lock, flags);
	err = vrdma_cmd(dev, VRDMA_CMD_RESIZE_CQ, &cmd, sizeof(cmd), &r, sizeof(r));
	vrdma_pl_free(&pl);
	spin_lock_irqsave(&cq->lock, flags);
	cq->resizing = false;
	if (!err) {
		cq->q = q;
		ibcq->cqe = le32_to_cpu(r.cqe);
	}
	spin_unlock_irqrestore(&cq->lock, flags);
	if (err)
		goto err_q;
	vrdma_queue_free(&old);
	if (udata)
		return ib_copy_to_udata(udata, &uresp, sizeof(uresp));
	return 0;

err_q:
	vrdma_queue_free(&q);
	return err;
}

static int vrdma_destroy_cq(struct ib_cq *ibcq, struct ib_udata *udata)
{
	struct vrdma_cq *cq = container_of(ibcq, struct vrdma_cq, ibcq);
	struct vrdma_dev *dev = to_vdev(ibcq->device);
	unsigned long flags;
	int err;

	err = vrdma_cmd_handle(dev, VRDMA_CMD_DESTROY_CQ, cq->cqn);
	if (err && err != -ENOENT && err != -EIO && err != -ETIMEDOUT)
		return err;
	spin_lock_irqsave(&dev->ev_lock, flags);
	xa_erase(&dev->cqs, cq->cqn);
	spin_unlock_irqrestore(&dev->ev_lock, flags);
	vrdma_queue_free(&cq->q);
	return 0;
}

static bool ring_full(const struct vrdma_queue *q, u32 prod)
{
	return ((prod + 1) & (q->num_slots - 1)) == smp_load_acquire(&q->buf->consumer_index);
}

static void *ring_slot(const struct vrdma_queue *q, u32 idx)
{
	return q->buf->data + ((size_t)(idx & (q->num_slots - 1)) << q->log2);
}

/*
 * A dead device (DEVICE_FATAL: it lost every object) completes nothing. For kernel QPs the
 * driver does what the device does in ERR: every work request still on a send or receive
 * queue completes with WR_FLUSH_ERR, in order, when the CQ is polled; requests posted after
 * the death too. So kernel consumers that drain their QPs before destroying them
 * (ib_drain_qp: move to ERR, post a marker, wait for its completion) finish instead of
 * waiting for ever. The device no longer reads these rings, so the driver owns their
 * consumer indices. SRQ receives are not flushed (they belong to no QP), as on a device.
 */
static int flush_ring(struct vrdma_qp *qp, struct vrdma_queue *q, bool send,
		      struct ib_wc *wc, int num)
{
	struct rxe_queue_buf *b = q->buf;
	int n = 0;

	/* a queue's consumer index is its oldest uncompleted WQE (§7) */
	while (n < num) {
		u32 cons = b->consumer_index & (q->num_slots - 1);

		if (cons == (READ_ONCE(b->producer_index) & (q->num_slots - 1)))
			break;
		memset(&wc[n], 0, sizeof(wc[n]));
		if (send)
			wc[n].wr_id = ((struct rxe_send_wqe *)ring_slot(q, cons))->wr.wr_id;
		else
			wc[n].wr_id = ((struct rxe_recv_wqe *)ring_slot(q, cons))->wr_id;
		wc[n].status = IB_WC_WR_FLUSH_ERR;
		wc[n].opcode = send ? IB_WC_SEND : IB_WC_RECV;
		wc[n].qp = &qp->ibqp;
		smp_store_release(&b->consumer_index, (cons + 1) & (q->num_slots - 1));
		n++;
	}
	return n;
}

static bool ring_empty(const struct vrdma_queue *q, u32 cons)
{
	return ((cons ^ READ_ONCE(q->buf->producer_index)) & (q->num_slots - 1)) == 0;
}

/* Flush completions for kernel QPs of @cq (num == 0: only say whether there are any). */
static int flush_dead(struct vrdma_dev *dev, struct vrdma_cq *cq, struct ib_wc *wc, int num)
{
	struct vrdma_qp *qp;
	unsigned long i, flags;
	int n = 0;

	/* QPs enter and leave dev->qps under ev_lock with interrupts off, and are freed only
	 * after leaving it: the xarray's lock keeps every QP found here alive */
	xa_lock_irqsave(&dev->qps, flags);
	xa_for_each(&dev->qps, i, qp) {
		if (qp->is_user)
			continue;
		if (qp->ibqp.send_cq == &cq->ibcq) {
			if (!num && !ring_empty(&qp->sq, READ_ONCE(qp->sq.buf->consumer_index))) {
				n = 1;
				break;
			}
			spin_lock(&qp->sq_lock);
			n += flush_ring(qp, &qp->sq, true, wc + n, num - n);
			spin_unlock(&qp->sq_lock);
		}
		if (qp->has_rq && qp->ibqp.recv_cq == &cq->ibcq) {
			if (!num && !ring_empty(&qp->rq, READ_ONCE(qp->rq.buf->consumer_index))) {
				n = 1;
				break;
			}
			spin_lock(&qp->rq_lock);
			n += flush_ring(qp, &qp->rq, false, wc + n, num - n);
			spin_unlock(&qp->rq_lock);
		}
		if (num && n == num)
			break;
	}
	xa_unlock_irqrestore(&dev->qps, flags);
	return n;
}

/* A dead device: run the completion handler of @ibcq if it is armed. */
static bool kick_cq(struct vrdma_cq *cq)
{
	if (cq->is_user || !cq->ibcq.comp_handler || !xchg(&cq->armed, false))
		return false;
	cq->ibcq.comp_handler(&cq->ibcq, cq->ibcq.cq_context);
	return true;
}

/*
 * User QPs of a dead device: the same flush, written into the CQ rings the applications poll
 * (they may never enter the kernel), as the device would have written it. Runs once, from the
 * DEVICE_FATAL work, before the device is removed and the rings unmapped.
 */
static void flush_user_ring(struct vrdma_qp *qp, struct vrdma_queue *q, bool send,
			    struct vrdma_cq *cq)
{
	struct rxe_queue_buf *b = q->buf, *c = cq->q.buf;
	u32 cmask = cq->q.num_slots - 1;

	for (;;) {
		u32 cons = READ_ONCE(b->consumer_index) & (q->num_slots - 1);
		u32 prod = READ_ONCE(c->producer_index) & cmask;
		struct ib_uverbs_wc *u;

		if (cons == (READ_ONCE(b->producer_index) & (q->num_slots - 1)))
			break;
		if (((prod + 1) & cmask) == (smp_load_acquire(&c->consumer_index) & cmask))
			break;	/* a full CQ: the application learns nothing more from it */
		u = (struct ib_uverbs_wc *)(c->data + ((size_t)prod << cq->q.log2));
		memset(u, 0, sizeof(*u));
		u->wr_id = send ? ((struct rxe_send_wqe *)ring_slot(q, cons))->wr.wr_id :
				  ((struct rxe_recv_wqe *)ring_slot(q, cons))->wr_id;
		u->status = IB_WC_WR_FLUSH_ERR;
		u->opcode = send ? IB_WC_SEND : IB_WC_RECV;
		u->qp_num = qp->qpn;
		smp_store_release(&c->producer_index, (prod + 1) & cmask);
		smp_store_release(&b->consumer_index, (cons + 1) & (q->num_slots - 1));
	}
}

void vrdma_flush_user(struct vrdma_dev *dev)
{
	struct vrdma_qp *qp;
	struct vrdma_cq *cq;
	unsigned long i, flags;

	xa_lock_irqsave(&dev->qps, flags);
	xa_for_each(&dev->qps, i, qp) {
		if (!qp->is_user)
			continue;
		if (qp->sq.buf)
			flush_user_ring(qp, &qp->sq, true,
					container_of(qp->ibqp.send_cq, struct vrdma_cq, ibcq));
		if (qp->has_rq)
			flush_user_ring(qp, &qp->rq, false,
					container_of(qp->ibqp.recv_cq, struct vrdma_cq, ibcq));
	}
	xa_unlock_irqrestore(&dev->qps, flags);
	/* an application waiting on a completion channel hears of it too */
	spin_lock_irqsave(&dev->ev_lock, flags);
	xa_for_each(&dev->cqs, i, cq) {
		u32 *notify = (u32 *)((u8 *)cq->q.buf + VRDMA_RING_CQ_NOTIFY);

		if (cq->is_user && cq->ibcq.comp_handler && xchg(notify, 0))
			cq->ibcq.comp_handler(&cq->ibcq, cq->ibcq.cq_context);
	}
	spin_unlock_irqrestore(&dev->ev_lock, flags);
}

void vrdma_kick_cqs(struct vrdma_dev *dev)
{
	struct vrdma_cq *cq;
	unsigned long i, flags;
	unsigned int n = 0, kicked = 0;

	spin_lock_irqsave(&dev->ev_lock, flags);
	xa_for_each(&dev->cqs, i, cq) {
		n++;
		kicked += kick_cq(cq);
	}
	spin_unlock_irqrestore(&dev->ev_lock, flags);
	dev_warn(&dev->vdev->dev, "device lost: kernel work requests complete as flushed (%u of %u CQs notified)\n",
		 kicked, n);
}

/*
 * Arming writes the notify word in the ring header (§8.1): store, full barrier, then look
 * for entries the device published before it could see the arm.
 */
static int vrdma_req_notify_cq(struct ib_cq *ibcq, enum ib_cq_notify_flags flags)
{
	struct vrdma_cq *cq = container_of(ibcq, struct vrdma_cq, ibcq);
	u32 *notify = (u32 *)((u8 *)cq->q.buf + VRDMA_RING_CQ_NOTIFY);
	u32 bits = (flags & IB_CQ_SOLICITED_MASK) == IB_CQ_SOLICITED ?
		   VRDMA_CQ_NOTIFY_SOLICITED : VRDMA_CQ_NOTIFY_NEXT_COMP;

	WRITE_ONCE(cq->armed, true);
	smp_store_release(notify, bits);
	smp_mb();
	if ((flags & IB_CQ_REPORT_MISSED_EVENTS) &&
	    READ_ONCE(cq->q.buf->producer_index) != READ_ONCE(cq->q.buf->consumer_index))
		return 1;
	if (READ_ONCE(to_vdev(ibcq->device)->dead) && !cq->is_user &&
	    flush_dead(to_vdev(ibcq->device), cq, NULL, 0)) {
		if (flags & IB_CQ_REPORT_MISSED_EVENTS)
			return 1;
		kick_cq(cq);
	}
	return 0;
}

static int vrdma_poll_cq(struct ib_cq *ibcq, int num, struct ib_wc *wc)
{
	struct vrdma_cq *cq = container_of(ibcq, struct vrdma_cq, ibcq);
	struct vrdma_dev *dev = to_vdev(ibcq->device);
	struct rxe_queue_buf *b;
	unsigned long flags;
	int n = 0;

	if (cq->is_user)
		return -EINVAL;
	spin_lock_irqsave(&cq->lock, flags);
	b = cq->q.buf;
	while (n < num && !cq->resizing) {
		u32 cons = b->consumer_index & (cq->q.num_slots - 1);
		struct ib_uverbs_wc *u;
		struct vrdma_qp *qp;

		if (cons == smp_load_acquire(&b->producer_index))
			break;
		u = (struct ib_uverbs_wc *)(b->data + ((size_t)cons << cq->q.log2));
		memset(&wc[n], 0, sizeof(wc[n]));
		wc[n].wr_id = u->wr_id;
		wc[n].status = u->status;
		wc[n].opcode = u->opcode;
		wc[n].vendor_err = u->vendor_err;
		wc[n].byte_len = u->byte_len;
		wc[n].ex.imm_data = (__force __be32)u->ex.imm_data;
		wc[n].src_qp = u->src_qp;
		wc[n].wc_flags = u->wc_flags;
		wc[n].pkey_index = u->pkey_index;
		wc[n].slid = u->slid;
		wc[n].sl = u->sl;
		wc[n].dlid_path_bits = u->dlid_path_bits;
		wc[n].port_num = u->port_num;
		qp = xa_load(&dev->qps, u->qp_num);
		wc[n].qp = qp ? &qp->ibqp : NULL;
		if (wc[n].wc_flags & IB_WC_GRH)
			wc[n].network_hdr_type = RDMA_NETWORK_IPV4;
		smp_store_release(&b->consumer_index, (cons + 1) & (cq->q.num_slots - 1));
		n++;
	}
	if (n < num && !cq->resizing && READ_ONCE(dev->dead))
		n += flush_dead(dev, cq, wc + n, num - n);
	spin_unlock_irqrestore(&cq->lock, flags);
	return n;
}

/* --- QP ------------------------------------------------------------------------------- */

static int vrdma_create_qp(struct ib_qp *ibqp, struct ib_qp_init_attr *init,
			   struct ib_udata *udata)
{
	struct vrdma_qp *qp = container_of(ibqp, struct vrdma_qp, ibqp);
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	const struct ib_device_attr *a = &dev->attrs;
	struct rxe_create_qp_resp uresp = {};
	struct vrdma_cmd_create_qp cmd = {};
	struct vrdma_resp_create_qp r;
	struct vrdma_pl sq_pl = {}, rq_pl = {};
	u32 wqe, send_wr, recv_wr, slots;
	unsigned long flags;
	int err;

	/* an RSS QP: no ring, a table of work queues (virtio_rdma_raw.c) */
	if (init->rwq_ind_tbl)
		return vrdma_create_rss_qp(qp, init, udata);
	/* ib_core creates XRC TGT QPs itself, with no udata, for user space too */
	if (init->qp_type == IB_QPT_XRC_TGT && !init->create_flags)
		return vrdma_create_xrc_tgt(qp, init);
	if (!udata && !kernel_verbs)
		return -EOPNOTSUPP;
	if (udata && udata->outlen < sizeof(uresp))
		return -EINVAL;
	if (init->create_flags)
		return -EOPNOTSUPP;
	switch (init->qp_type) {
	case IB_QPT_RC:
	case IB_QPT_UC:
	case IB_QPT_UD:
		break;
	case IB_QPT_XRC_INI:
		/* librxe's XRC SEND QPs; no kernel user posts XRC */
		if (!udata || !(le32_to_cpu(dev->cfg.caps) & VRDMA_CAP_XRC))
			return -EOPNOTSUPP;
		break;
	case IB_QPT_RAW_PACKET:
		/* whole Ethernet frames (§5.13): user space's (ib_core checks CAP_NET_RAW) */
		if (!udata || !(le32_to_cpu(dev->cfg.caps) & VRDMA_CAP_RAW_PACKET))
			return -EOPNOTSUPP;
		break;
	case IB_QPT_GSI:
		if (udata)
			return -EOPNOTSUPP;
		break;
	default:
		return -EOPNOTSUPP;
	}
	if (init->cap.max_send_wr > a->max_qp_wr || init->cap.max_recv_wr > a->max_qp_wr ||
	    init->cap.max_send_sge > a->max_send_sge ||
	    init->cap.max_recv_sge > a->max_recv_sge ||
	    init->cap.max_inline_data > le32_to_cpu(dev->cfg.max_inline))
		return -EINVAL;
	if (init->srq && !(le32_to_cpu(dev->cfg.caps) & VRDMA_CAP_SRQ))
		return -EOPNOTSUPP;

	qp->is_user = !!udata;
	qp->sq_sig_type = init->sq_sig_type;
	spin_lock_init(&qp->sq_lock);
	spin_lock_init(&qp->rq_lock);
	INIT_LIST_HEAD(&qp->db_node);

	/*
	 * rxe's sizes (rxe_qp.c): the send slot holds max(sge, inline) bytes after the WQE
	 * header, and the caps librxe is told are what that slot holds. The device is given
	 * exactly those caps, so it accepts every WQE librxe accepts.
	 */
	wqe = max_t(u32, init->cap.max_send_sge * sizeof(struct rxe_sge),
		    init->cap.max_inline_data);
	wqe = max_t(u32, wqe, sizeof(struct rxe_sge));
	wqe = min_t(u32, wqe, le32_to_cpu(dev->cfg.max_inline));
	send_wr = max_t(u32, init->cap.max_send_wr, 1);
	slots = roundup_pow_of_two(send_wr + 1);
	err = vrdma_queue_alloc(&qp->sq, slots, sizeof(struct rxe_send_wqe) + wqe);
	if (err)
		return err;
	err = vrdma_queue_describe(dev, &qp->sq, &sq_pl, &cmd.sq);
	if (err)
		goto err_q;
	cmd.max_send_wr = cpu_to_le32(slots - 1);
	cmd.max_send_sge = cpu_to_le32(min_t(u32, wqe / sizeof(struct rxe_sge), a->max_send_sge));
	cmd.max_inline_data = cpu_to_le32(wqe);

	if (init->qp_type == IB_QPT_XRC_INI) {
		/* a send queue alone: no receive queue, no SRQ */
	} else if (!init->srq) {
		qp->has_rq = true;
		recv_wr = max_t(u32, init->cap.max_recv_wr, 1);
		slots = roundup_pow_of_two(recv_wr + 1);
		err = vrdma_queue_alloc(&qp->rq, slots, sizeof(struct rxe_recv_wqe) +
				  max_t(u32, init->cap.max_recv_sge, 1) * sizeof(struct rxe_sge));
		if (err)
			goto err_q;
		err = vrdma_queue_describe(dev, &qp->rq, &rq_pl, &cmd.rq);
		if (err)
			goto err_q;
		cmd.max_recv_wr = cpu_to_le32(slots - 1);
		cmd.max_recv_sge = cpu_to_le32(max_t(u32, init->cap.max_recv_sge, 1));
	} else {
		cmd.flags |= cpu_to_le32(VRDMA_CREATE_QP_HAS_SRQ);
		cmd.srqn = cpu_to_le32(container_of(init->srq, struct vrdma_srq, ibsrq)->srqn);
	}
	if (init->sq_sig_type == IB_SIGNAL_ALL_WR)
		cmd.flags |= cpu_to_le32(VRDMA_CREATE_QP_SQ_SIG_ALL);
	/* rings user space never maps: the only QPs allowed to post REG_MR */
	if (!udata)
		cmd.flags |= cpu_to_le32(VRDMA_CREATE_QP_KERNEL);
	cmd.qp_type = cpu_to_le32(init->qp_type);
	cmd.pdn = cpu_to_le32(pdn_of(ibqp->pd));
	cmd.send_cqn = cpu_to_le32(container_of(init->send_cq, struct vrdma_cq, ibcq)->cqn);
	/* an XRC INI QP may have no receive CQ: the device ignores the field then */
	cmd.recv_cqn = init->recv_cq ? cpu_to_le32(container_of(init->recv_cq, struct vrdma_cq,
								 ibcq)->cqn) : cmd.send_cqn;

	err = vrdma_cmd(dev, VRDMA_CMD_CREATE_QP, &cmd, sizeof(cmd), &r, sizeof(r));
	vrdma_pl_free(&sq_pl);
	vrdma_pl_free(&rq_pl);
	if (err)
		goto err_q;
	qp->qpn = le32_to_cpu(r.qpn);
	ibqp->qp_num = qp->qpn;
	/* what the device echoes is what librxe is told */
	qp->cap.max_send_wr = le32_to_cpu(r.max_send_wr);
	qp->cap.max_send_sge = le32_to_cpu(r.max_send_sge);
	qp->cap.max_inline_data = le32_to_cpu(r.max_inline_data);
	qp->cap.max_recv_wr = qp->has_rq ? le32_to_cpu(r.max_recv_wr) : 0;
	qp->cap.max_recv_sge = qp->has_rq ? le32_to_cpu(r.max_recv_sge) : 0;
	init->cap = qp->cap;
	if (trace_verbs)
		pr_info("virtio_rdma: qp %u type %d sq %u slots log2 %u (wr %u sge %u inline %u) rq %u slots log2 %u (wr %u sge %u)\n",
			qp->qpn, init->qp_type, qp->sq.num_slots, qp->sq.log2, qp->cap.max_send_wr,
			qp->cap.max_send_sge, qp->cap.max_inline_data, qp->rq.num_slots, qp->rq.log2,
			qp->cap.max_recv_wr, qp->cap.max_recv_sge);

	if (udata && qp->has_rq) {
		err = vrdma_queue_mmap(udata, &qp->rq, &uresp.rq_mi);
		if (err)
			goto err_destroy;
	}
	if (udata) {
		err = vrdma_queue_mmap(udata, &qp->sq, &uresp.sq_mi);
		if (!err)
			err = ib_copy_to_udata(udata, &uresp, sizeof(uresp));
		if (err)
			goto err_destroy;
	}

	spin_lock_irqsave(&dev->ev_lock, flags);
	err = xa_err(xa_store(&dev->qps, qp->qpn, qp, GFP_ATOMIC));
	spin_unlock_irqrestore(&dev->ev_lock, flags);
	if (err)
		goto err_destroy;
	return 0;

err_destroy:
	vrdma_cmd_handle(dev, VRDMA_CMD_DESTROY_QP, qp->qpn);
err_q:
	vrdma_pl_free(&sq_pl);
	vrdma_pl_free(&rq_pl);
	if (qp->sq.buf)
		vrdma_queue_free(&qp->sq);
	if (qp->rq.buf)
		vrdma_queue_free(&qp->rq);
	return err;
}

static int vrdma_destroy_qp(struct ib_qp *ibqp, struct ib_udata *udata)
{
	struct vrdma_qp *qp = container_of(ibqp, struct vrdma_qp, ibqp);
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	unsigned long flags;
	int err;

	err = vrdma_cmd_handle(dev, VRDMA_CMD_DESTROY_QP, qp->qpn);
	if (err && err != -ENOENT && err != -EIO && err != -ETIMEDOUT)
		return err;
	spin_lock_irqsave(&dev->ev_lock, flags);
	xa_erase(&dev->qps, qp->qpn);
	spin_unlock_irqrestore(&dev->ev_lock, flags);
	vrdma_db_forget(dev, qp);
	vrdma_queue_free(&qp->sq);
	if (qp->has_rq)
		vrdma_queue_free(&qp->rq);
	return 0;
}

static void ah_attr_to_dev(const struct rdma_ah_attr *ah, struct vrdma_ah_attr *d)
{
	const struct ib_global_route *grh = rdma_ah_read_grh(ah);

	memset(d, 0, sizeof(*d));
	memcpy(d->dgid, grh->dgid.raw, sizeof(d->dgid));
	d->flow_label = cpu_to_le32(grh->flow_label);
	d->sgid_index = grh->sgid_index;
	d->hop_limit = grh->hop_limit;
	d->traffic_class = grh->traffic_class;
	d->sl = rdma_ah_get_sl(ah);
	if (ah->type == RDMA_AH_ATTR_TYPE_ROCE)
		memcpy(d->dmac, ah->roce.dmac, ETH_ALEN);
	d->port_num = 1;
	d->static_rate = rdma_ah_get_static_rate(ah);
}

/* Access bits the kernel passes through that only matter to hardware (HUGETLB, relaxed
 * ordering and the rest of the optional range): rxe ignores them, so does this driver. */
static u32 access_to_dev(int access)
{
	return access & ~(IB_ACCESS_HUGETLB | IB_ACCESS_OPTIONAL);
}

static int vrdma_modify_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask,
			   struct ib_udata *udata)
{
	struct vrdma_qp *qp = container_of(ibqp, struct vrdma_qp, ibqp);
	struct vrdma_qp_attrs c = {};
	int err;

	if (mask & ~IB_QP_ATTR_STANDARD_BITS)
		return -EOPNOTSUPP;
	if (READ_ONCE(to_vdev(ibqp->device)->dead)) {
		/* the device lost the QP: ERR is where it is (the driver flushes it) */
		if ((mask & IB_QP_STATE) && attr->qp_state == IB_QPS_ERR) {
			WRITE_ONCE(qp->state, IB_QPS_ERR);
			return 0;
		}
		return -EIO;
	}
	c.qpn = cpu_to_le32(qp->qpn);
	c.attr_mask = cpu_to_le32(mask);
	c.qp_state = cpu_to_le32(attr->qp_state);
	c.cur_qp_state = cpu_to_le32(attr->cur_qp_state);
	c.path_mtu = cpu_to_le32(attr->path_mtu);
	c.qkey = cpu_to_le32(attr->qkey);
	c.rq_psn = cpu_to_le32(attr->rq_psn);
	c.sq_psn = cpu_to_le32(attr->sq_psn);
	c.dest_qp_num = cpu_to_le32(attr->dest_qp_num);
	c.qp_access_flags = cpu_to_le32(access_to_dev(attr->qp_access_flags));
	c.pkey_index = cpu_to_le16(attr->pkey_index);
	c.en_sqd_async_notify = attr->en_sqd_async_notify;
	c.max_rd_atomic = attr->max_rd_atomic;
	c.max_dest_rd_atomic = attr->max_dest_rd_atomic;
	c.min_rnr_timer = attr->min_rnr_timer;
	c.port_num = attr->port_num;
	c.timeout = attr->timeout;
	c.retry_cnt = attr->retry_cnt;
	c.rnr_retry = attr->rnr_retry;
	if (mask & IB_QP_AV)
		ah_attr_to_dev(&attr->ah_attr, &c.ah);
	err = vrdma_cmd(to_vdev(ibqp->device), VRDMA_CMD_MODIFY_QP, &c, sizeof(c), NULL, 0);
	if (!err && (mask & IB_QP_STATE))
		WRITE_ONCE(qp->state, attr->qp_state);
	if (trace_verbs && qp->sq.buf)
		pr_info("virtio_rdma: qp %u modify mask %#x state %u: %d; sq log2 %u mask %u prod %u cons %u\n",
			qp->qpn, mask, attr->qp_state, err, qp->sq.buf->log2_elem_size,
			qp->sq.buf->index_mask, qp->sq.buf->producer_index,
			qp->sq.buf->consumer_index);
	return err;
}

static int vrdma_query_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask,
			  struct ib_qp_init_attr *init)
{
	struct vrdma_qp *qp = container_of(ibqp, struct vrdma_qp, ibqp);
	struct vrdma_qp_attrs c = { .qpn = cpu_to_le32(qp->qpn) }, r;
	union ib_gid dgid;
	int err;

	err = vrdma_cmd(to_vdev(ibqp->device), VRDMA_CMD_QUERY_QP, &c, sizeof(c), &r, sizeof(r));
	if (err)
		return err;
	memset(attr, 0, sizeof(*attr));
	attr->qp_state = le32_to_cpu(r.qp_state);
	attr->cur_qp_state = attr->qp_state;
	attr->path_mtu = le32_to_cpu(r.path_mtu);
	attr->path_mig_state = IB_MIG_MIGRATED;
	attr->qkey = le32_to_cpu(r.qkey);
	attr->rq_psn = le32_to_cpu(r.rq_psn);
	attr->sq_psn = le32_to_cpu(r.sq_psn);
	attr->dest_qp_num = le32_to_cpu(r.dest_qp_num);
	attr->qp_access_flags = le32_to_cpu(r.qp_access_flags);
	attr->pkey_index = le16_to_cpu(r.pkey_index);
	attr->en_sqd_async_notify = r.en_sqd_async_notify;
	attr->sq_draining = r.sq_draining;
	attr->max_rd_atomic = r.max_rd_atomic;
	attr->max_dest_rd_atomic = r.max_dest_rd_atomic;
	attr->min_rnr_timer = r.min_rnr_timer;
	attr->port_num = r.port_num;
	attr->timeout = r.timeout;
	attr->retry_cnt = r.retry_cnt;
	attr->rnr_retry = r.rnr_retry;
	attr->cap = qp->cap;
	attr->ah_attr.type = RDMA_AH_ATTR_TYPE_ROCE;
	memcpy(dgid.raw, r.ah.dgid, sizeof(dgid.raw));
	rdma_ah_set_grh(&attr->ah_attr, &dgid, le32_to_cpu(r.ah.flow_label), r.ah.sgid_index,
			r.ah.hop_limit, r.ah.traffic_class);
	rdma_ah_set_sl(&attr->ah_attr, r.ah.sl);
	rdma_ah_set_port_num(&attr->ah_attr, 1);
	memcpy(attr->ah_attr.roce.dmac, r.ah.dmac, ETH_ALEN);

	memset(init, 0, sizeof(*init));
	init->event_handler = ibqp->event_handler;
	init->qp_context = ibqp->qp_context;
	init->send_cq = ibqp->send_cq;
	init->recv_cq = ibqp->recv_cq;
	init->srq = ibqp->srq;
	init->cap = qp->cap;
	init->sq_sig_type = qp->sq_sig_type;
	init->qp_type = ibqp->qp_type;
	init->port_num = 1;
	return 0;
}

/*
 * Kernel users (ib_mad's QP1, the CM, kernel ULPs) hand the driver ib_send_wr/ib_recv_wr:
 * the driver writes them into the rings in the rxe ABI itself. ib_core uses virtual DMA
 * here, so an SGE under the PD's local DMA lkey carries a kernel virtual address; the
 * device's DMA MR takes guest-physical ones.
 */
static u64 sge_gpa(struct vrdma_qp *qp, const struct ib_sge *sge)
{
	if (sge->lkey == qp->ibqp.pd->local_dma_lkey)
		return virt_to_phys((void *)(uintptr_t)sge->addr);
	return sge->addr;
}


static int build_send_wqe(struct vrdma_qp *qp, const struct ib_send_wr *wr,
			  struct rxe_send_wqe *wqe)
{
	struct rxe_send_wr *w = &wqe->wr;
	u32 len = 0;
	int i;

	if (wr->num_sge > qp->cap.max_send_sge)
		return -EINVAL;
	memset(wqe, 0, sizeof(*wqe));
	w->wr_id = wr->wr_id;
	w->opcode = wr->opcode;
	w->send_flags = wr->send_flags;
	switch (wr->opcode) {
	case IB_WR_RDMA_WRITE_WITH_IMM:
		w->ex.imm_data = wr->ex.imm_data;
		fallthrough;
	case IB_WR_RDMA_WRITE:
	case IB_WR_RDMA_READ:
		w->wr.rdma.remote_addr = rdma_wr(wr)->remote_addr;
		w->wr.rdma.rkey = rdma_wr(wr)->rkey;
		break;
	case IB_WR_ATOMIC_CMP_AND_SWP:
	case IB_WR_ATOMIC_FETCH_AND_ADD:
		w->wr.atomic.remote_addr = atomic_wr(wr)->remote_addr;
		w->wr.atomic.compare_add = atomic_wr(wr)->compare_add;
		w->wr.atomic.swap = atomic_wr(wr)->swap;
		w->wr.atomic.rkey = atomic_wr(wr)->rkey;
		break;
	case IB_WR_SEND_WITH_IMM:
		w->ex.imm_data = wr->ex.imm_data;
		fallthrough;
	case IB_WR_SEND:
	case IB_WR_SEND_WITH_INV:
		if (wr->opcode == IB_WR_SEND_WITH_INV)
			w->ex.invalidate_rkey = wr->ex.invalidate_rkey;
		if (qp->ibqp.qp_type == IB_QPT_UD || qp->ibqp.qp_type == IB_QPT_GSI) {
			struct vrdma_ah *ah = container_of(ud_wr(wr)->ah, struct vrdma_ah, ibah);
			struct rxe_av *av = &w->wr.ud.av;

			w->wr.ud.remote_qpn = ud_wr(wr)->remote_qpn;
			w->wr.ud.remote_qkey = ud_wr(wr)->remote_qkey;
			w->wr.ud.pkey_index = ud_wr(wr)->pkey_index;
			/* the AV inline: kernel AHs have no device object (§11) */
			w->wr.ud.ah_num = 0;
			av->port_num = 1;
			av->network_type = ah->network_type == RDMA_NETWORK_IPV6 ?
					   RXE_NETWORK_TYPE_IPV6 : RXE_NETWORK_TYPE_IPV4;
			memcpy(av->dmac, ah->av.dmac, ETH_ALEN);
			memcpy(av->grh.dgid.raw, ah->av.dgid, 16);
			av->grh.flow_label = le32_to_cpu(ah->av.flow_label);
			av->grh.sgid_index = ah->av.sgid_index;
			av->grh.hop_limit = ah->av.hop_limit;
			av->grh.traffic_class = ah->av.traffic_class;
		}
		break;
	case IB_WR_LOCAL_INV:
		w->ex.invalidate_rkey = wr->ex.invalidate_rkey;
		break;
	case IB_WR_REG_MR: {
		/* the contract's REG_MR layout (§6.2) inside the rxe_send_wr union */
		const struct ib_reg_wr *rw = reg_wr(wr);
		struct vrdma_mr *mr = container_of(rw->mr, struct vrdma_mr, ibmr);
		u8 *p = (u8 *)wqe;

		if (!mr->pages || !mr->npages)
			return -EINVAL;
		put_unaligned_le64(mr->ibmr.iova, p + VRDMA_REG_MR_IOVA);
		put_unaligned_le64(mr->ibmr.length, p + VRDMA_REG_MR_LENGTH);
		put_unaligned_le32(mr->dev_key, p + VRDMA_REG_MR_MR_LKEY);
		put_unaligned_le32(rw->key, p + VRDMA_REG_MR_KEY);
		put_unaligned_le32(access_to_dev(rw->access), p + VRDMA_REG_MR_ACCESS);
		p[VRDMA_REG_MR_PAGE_SHIFT] = ilog2(mr->ibmr.page_size);
		p[VRDMA_REG_MR_LEVELS] = 0;
		put_unaligned_le64(virt_to_phys(mr->pages), p + VRDMA_REG_MR_PAGE_LIST);
		put_unaligned_le32(mr->npages, p + VRDMA_REG_MR_NUM_PAGES);
		/*
		 * The first byte's offset in the first page, as mapped: a device without
		 * MR_PAGE_OFFSET takes iova mod page, which is the same unless a ULP moved the
		 * IOVA after mapping.
		 */
		if (le32_to_cpu(to_vdev(qp->ibqp.device)->cfg.caps) & VRDMA_CAP_MR_PAGE_OFFSET) {
			p[VRDMA_REG_MR_FLAGS] = VRDMA_REG_MR_F_PAGE_OFFSET;
			put_unaligned_le32(mr->page_offset, p + VRDMA_REG_MR_PAGE_OFFSET);
		}
		mr->dev_key = rw->key;
		wqe->dma.num_sge = 0;
		return 0;
	}
	default:
		return -EOPNOTSUPP;	/* BIND_MW from kernel users: not yet */
	}
	for (i = 0; i < wr->num_sge; i++)
		len += wr->sg_list[i].length;
	if (wr->send_flags & IB_SEND_INLINE) {
		u8 *p = wqe->dma.inline_data;

		if (len > qp->cap.max_inline_data)
			return -EINVAL;
		for (i = 0; i < wr->num_sge; i++) {
			memcpy(p, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
			p += wr->sg_list[i].length;
		}
	} else {
		for (i = 0; i < wr->num_sge; i++) {
			wqe->dma.sge[i].addr = sge_gpa(qp, &wr->sg_list[i]);
			wqe->dma.sge[i].length = wr->sg_list[i].length;
			wqe->dma.sge[i].lkey = wr->sg_list[i].lkey;
		}
	}
	wqe->dma.length = len;
	wqe->dma.resid = len;
	wqe->dma.num_sge = wr->num_sge;
	return 0;
}

static int vrdma_post_send(struct ib_qp *ibqp, const struct ib_send_wr *wr,
			   const struct ib_send_wr **bad_wr)
{
	struct vrdma_qp *qp = container_of(ibqp, struct vrdma_qp, ibqp);
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	unsigned long flags;
	u32 prod;
	int err = 0;

	/* as rxe: sending needs RTS (or a later state, where the device flushes); an XRC TGT
	 * QP has no send queue */
	if (READ_ONCE(qp->state) < IB_QPS_RTS || !qp->sq.buf) {
		*bad_wr = wr;
		return -EINVAL;
	}
	if (qp->is_user) {
		if (trace_verbs)
			pr_info("virtio_rdma: qp %u sq doorbell prod %u cons %u\n", qp->qpn,
				READ_ONCE(qp->sq.buf->producer_index),
				READ_ONCE(qp->sq.buf->consumer_index));
		/* librxe's zero-WR IB_USER_VERBS_CMD_POST_SEND: the WQEs are in the ring */
		vrdma_ring_doorbell(dev, VRDMA_DB_SQ, qp->qpn,
				    READ_ONCE(qp->sq.buf->producer_index), qp);
		return 0;
	}
	spin_lock_irqsave(&qp->sq_lock, flags);
	prod = qp->sq.buf->producer_index & (qp->sq.num_slots - 1);
	for (; wr; wr = wr->next) {
		if (ring_full(&qp->sq, prod)) {
			err = -ENOMEM;
			break;
		}
		err = build_send_wqe(qp, wr, ring_slot(&qp->sq, prod));
		if (err)
			break;
		prod = (prod + 1) & (qp->sq.num_slots - 1);
		smp_store_release(&qp->sq.buf->producer_index, prod);
	}
	spin_unlock_irqrestore(&qp->sq_lock, flags);
	if (err)
		*bad_wr = wr;
	if (READ_ONCE(dev->dead))
		kick_cq(container_of(ibqp->send_cq, struct vrdma_cq, ibcq));
	else
		vrdma_ring_doorbell(dev, VRDMA_DB_SQ, qp->qpn, prod, qp);
	return err;
}

static int post_recv_ring(struct vrdma_qp *qp, struct vrdma_queue *q, u32 max_sge,
			  const struct ib_recv_wr *wr, const struct ib_recv_wr **bad_wr)
{
	u32 prod = q->buf->producer_index & (q->num_slots - 1);
	int err = 0, i;

	for (; wr; wr = wr->next) {
		struct rxe_recv_wqe *wqe;
		u32 len = 0;

		if (wr->num_sge > max_sge) {
			err = -EINVAL;
			break;
		}
		if (ring_full(q, prod)) {
			err = -ENOMEM;
			break;
		}
		wqe = ring_slot(q, prod);
		memset(wqe, 0, sizeof(*wqe));
		wqe->wr_id = wr->wr_id;
		for (i = 0; i < wr->num_sge; i++) {
			wqe->dma.sge[i].addr = sge_gpa(qp, &wr->sg_list[i]);
			wqe->dma.sge[i].length = wr->sg_list[i].length;
			wqe->dma.sge[i].lkey = wr->sg_list[i].lkey;
			len += wr->sg_list[i].length;
		}
		wqe->dma.length = len;
		wqe->dma.resid = len;
		wqe->dma.num_sge = wr->num_sge;
		prod = (prod + 1) & (q->num_slots - 1);
		smp_store_release(&q->buf->producer_index, prod);
	}
	if (err)
		*bad_wr = wr;
	return err;
}

static int vrdma_post_recv(struct ib_qp *ibqp, const struct ib_recv_wr *wr,
			   const struct ib_recv_wr **bad_wr)
{
	struct vrdma_qp *qp = container_of(ibqp, struct vrdma_qp, ibqp);
	unsigned long flags;
	int err;

	if (qp->is_user || !qp->has_rq) {
		*bad_wr = wr;
		return -EINVAL;
	}
	spin_lock_irqsave(&qp->rq_lock, flags);
	err = post_recv_ring(qp, &qp->rq, qp->cap.max_recv_sge, wr, bad_wr);
	spin_unlock_irqrestore(&qp->rq_lock, flags);
	/* the device reads RQs when packets arrive; a doorbell flushes them in ERR (§7) */
	if (READ_ONCE(to_vdev(ibqp->device)->dead))
		kick_cq(container_of(ibqp->recv_cq, struct vrdma_cq, ibcq));
	else
		vrdma_ring_doorbell(to_vdev(ibqp->device), VRDMA_DB_RQ, qp->qpn,
				    READ_ONCE(qp->rq.buf->producer_index), NULL);
	return err;
}

/* --- SRQ ------------------------------------------------------------------------------ */

static int vrdma_create_srq(struct ib_srq *ibsrq, struct ib_srq_init_attr *init,
			    struct ib_udata *udata)
{
	struct vrdma_srq *srq = container_of(ibsrq, struct vrdma_srq, ibsrq);
	struct vrdma_dev *dev = to_vdev(ibsrq->device);
	const struct ib_device_attr *a = &dev->attrs;
	struct rxe_create_srq_resp uresp = {};
	struct vrdma_cmd_create_xrc_srq xcmd = {};
	struct vrdma_cmd_create_srq *cmd = &xcmd.srq;
	bool xrc = init->srq_type == IB_SRQT_XRC;
	struct vrdma_resp_create_srq r;
	struct vrdma_pl pl;
	unsigned long flags;
	u32 slots;
	int err;

	if (!udata && !kernel_verbs)
		return -EOPNOTSUPP;
	if (udata && udata->outlen < sizeof(uresp))
		return -EINVAL;
	if (init->srq_type != IB_SRQT_BASIC &&
	    !(xrc && (le32_to_cpu(dev->cfg.caps) & VRDMA_CAP_XRC)))
		return -EOPNOTSUPP;
	if (!a->max_srq || init->attr.max_wr < 1 || init->attr.max_wr > a->max_srq_wr ||
	    init->attr.max_sge < 1 || init->attr.max_sge > a->max_srq_sge ||
	    init->attr.srq_limit > init->attr.max_wr)
		return -EINVAL;
	srq->is_user = !!udata;
	spin_lock_init(&srq->lock);
	slots = roundup_pow_of_two(init->attr.max_wr + 1);
	err = vrdma_queue_alloc(&srq->q, slots, sizeof(struct rxe_recv_wqe) +
			  init->attr.max_sge * sizeof(struct rxe_sge));
	if (err)
		return err;
	err = vrdma_queue_describe(dev, &srq->q, &pl, &cmd->queue);
	if (err)
		goto err_q;
	cmd->pdn = cpu_to_le32(pdn_of(ibsrq->pd));
	cmd->max_wr = cpu_to_le32(slots - 1);
	cmd->max_sge = cpu_to_le32(init->attr.max_sge);
	cmd->srq_limit = cpu_to_le32(init->attr.srq_limit);
	if (xrc) {
		/* its domain and the CQ its receive completions go to (§5.12) */
		xcmd.xrcdn = cpu_to_le32(container_of(init->ext.xrc.xrcd, struct vrdma_xrcd,
						      ibxrcd)->xrcdn);
		xcmd.cqn = cpu_to_le32(container_of(init->ext.cq, struct vrdma_cq, ibcq)->cqn);
		err = vrdma_cmd(dev, VRDMA_CMD_CREATE_XRC_SRQ, &xcmd, sizeof(xcmd), &r, sizeof(r));
	} else {
		err = vrdma_cmd(dev, VRDMA_CMD_CREATE_SRQ, cmd, sizeof(*cmd), &r, sizeof(r));
	}
	vrdma_pl_free(&pl);
	if (err)
		goto err_q;
	srq->srqn = le32_to_cpu(r.srqn);
	/* the number XRC requests name: user space reads it with ibv_get_srq_num */
	if (xrc)
		ibsrq->ext.xrc.srq_num = srq->srqn;
	srq->max_wr = le32_to_cpu(r.max_wr);
	srq->max_sge = le32_to_cpu(r.max_sge);
	init->attr.max_wr = srq->max_wr;
	init->attr.max_sge = srq->max_sge;
	if (udata) {
		err = vrdma_queue_mmap(udata, &srq->q, &uresp.mi);
		uresp.srq_num = srq->srqn;
		if (!err)
			err = ib_copy_to_udata(udata, &uresp, sizeof(uresp));
		if (err)
			goto err_destroy;
	}
	spin_lock_irqsave(&dev->ev_lock, flags);
	err = xa_err(xa_store(&dev->srqs, srq->srqn, srq, GFP_ATOMIC));
	spin_unlock_irqrestore(&dev->ev_lock, flags);
	if (err)
		goto err_destroy;
	return 0;

err_destroy:
	vrdma_cmd_handle(dev, VRDMA_CMD_DESTROY_SRQ, srq->srqn);
err_q:
	vrdma_queue_free(&srq->q);
	return err;
}

/*
 * RESIZE_SRQ (§5.7): a new ring; the device moves the receives it has not taken to its start.
 * A user SRQ's new ring is mapped as rxe does it: the mmap info goes to the address librxe
 * gave in its command (it holds its SRQ lock across the call and maps the new ring after).
 * A kernel SRQ's posters wait on the SRQ lock.
 */
static int resize_srq(struct vrdma_srq *srq, u32 max_wr, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(srq->ibsrq.device);
	struct vrdma_cmd_resize_srq cmd = {};
	struct rxe_modify_srq_cmd ucmd = {};
	struct vrdma_resp_query_srq r;
	struct vrdma_queue q, old;
	struct mminfo mi = {};
	unsigned long flags;
	struct vrdma_pl pl;
	u32 slots;
	int err;

	if (!(le32_to_cpu(dev->cfg.caps) & VRDMA_CAP_SRQ_RESIZE))
		return -EOPNOTSUPP;
	if (max_wr < 1 || max_wr > dev->attrs.max_srq_wr)
		return -EINVAL;
	if (udata) {
		if (udata->inlen < sizeof(ucmd))
			return -EINVAL;
		err = ib_copy_from_udata(&ucmd, udata, sizeof(ucmd));
		if (err)
			return err;
	}
	slots = roundup_pow_of_two(max_wr + 1);
	err = vrdma_queue_alloc(&q, slots, sizeof(struct rxe_recv_wqe) +
			  srq->max_sge * sizeof(struct rxe_sge));
	if (err)
		return err;
	err = vrdma_queue_describe(dev, &q, &pl, &cmd.queue);
	if (err)
		goto err_q;
	if (udata) {
		/* the mapping first: a failure after the device switched rings is unrecoverable */
		err = vrdma_queue_mmap(udata, &q, &mi);
		if (err) {
			vrdma_pl_free(&pl);
			goto err_q;
		}
	}
	cmd.srqn = cpu_to_le32(srq->srqn);
	cmd.max_wr = cpu_to_le32(slots - 1);
	/* vrdma_cmd sleeps: a kernel SRQ's posters are kept off the ring by a flag under the
	 * lock instead of the lock itself */
	spin_lock_irqsave(&srq->lock, flags);
	srq->resizing = true;
	spin_unlock_irqrestore(&srq->lock, flags);
	err = vrdma_cmd(dev, VRDMA_CMD_RESIZE_SRQ, &cmd, sizeof(cmd), &r, sizeof(r));
	vrdma_pl_free(&pl);
	spin_lock_irqsave(&srq->lock, flags);
	old = srq->q;
	if (!err) {
		srq->q = q;
		srq->max_wr = le32_to_cpu(r.max_wr);
	}
	srq->resizing = false;
	spin_unlock_irqrestore(&srq->lock, flags);
	if (err)
		goto err_q;
	vrdma_queue_free(&old);
	if (udata && copy_to_user(u64_to_user_ptr(ucmd.mmap_info_addr), &mi, sizeof(mi)))
		return -EFAULT;
	return 0;

err_q:
	vrdma_queue_free(&q);
	return err;
}

static int vrdma_modify_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr,
			    enum ib_srq_attr_mask mask, struct ib_udata *udata)
{
	struct vrdma_srq *srq = container_of(ibsrq, struct vrdma_srq, ibsrq);
	struct vrdma_cmd_modify_srq cmd = {};
	int err;

	if (mask & IB_SRQ_MAX_WR) {
		err = resize_srq(srq, attr->max_wr, udata);
		if (err)
			return err;
	}
	if (!(mask & IB_SRQ_LIMIT))
		return 0;
	cmd.srqn = cpu_to_le32(srq->srqn);
	cmd.attr_mask = cpu_to_le32(VRDMA_SRQ_ATTR_LIMIT);
	cmd.srq_limit = cpu_to_le32(attr->srq_limit);
	return vrdma_cmd(to_vdev(ibsrq->device), VRDMA_CMD_MODIFY_SRQ, &cmd, sizeof(cmd),
			 NULL, 0);
}

static int vrdma_query_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr)
{
	struct vrdma_srq *srq = container_of(ibsrq, struct vrdma_srq, ibsrq);
	struct vrdma_handle h = { .handle = cpu_to_le32(srq->srqn) };
	struct vrdma_resp_query_srq r;
	int err;

	err = vrdma_cmd(to_vdev(ibsrq->device), VRDMA_CMD_QUERY_SRQ, &h, sizeof(h), &r,
			sizeof(r));
	if (err)
		return err;
	attr->max_wr = le32_to_cpu(r.max_wr);
	attr->max_sge = le32_to_cpu(r.max_sge);
	attr->srq_limit = le32_to_cpu(r.srq_limit);
	return 0;
}

static int vrdma_destroy_srq(struct ib_srq *ibsrq, struct ib_udata *udata)
{
	struct vrdma_srq *srq = container_of(ibsrq, struct vrdma_srq, ibsrq);
	struct vrdma_dev *dev = to_vdev(ibsrq->device);
	unsigned long flags;
	int err;

	err = vrdma_cmd_handle(dev, VRDMA_CMD_DESTROY_SRQ, srq->srqn);
	if (err && err != -ENOENT && err != -EIO && err != -ETIMEDOUT)
		return err;
	spin_lock_irqsave(&dev->ev_lock, flags);
	xa_erase(&dev->srqs, srq->srqn);
	spin_unlock_irqrestore(&dev->ev_lock, flags);
	vrdma_queue_free(&srq->q);
	return 0;
}

static int vrdma_post_srq_recv(struct ib_srq *ibsrq, const struct ib_recv_wr *wr,
			       const struct ib_recv_wr **bad_wr)
{
	struct vrdma_srq *srq = container_of(ibsrq, struct vrdma_srq, ibsrq);
	unsigned long flags;
	int err = 0, i;
	u32 prod;

	if (srq->is_user) {
		*bad_wr = wr;
		return -EINVAL;
	}
	spin_lock_irqsave(&srq->lock, flags);
	if (srq->resizing) {
		spin_unlock_irqrestore(&srq->lock, flags);
		*bad_wr = wr;
		return -EBUSY;
	}
	prod = srq->q.buf->producer_index & (srq->q.num_slots - 1);
	for (; wr; wr = wr->next) {
		struct rxe_recv_wqe *wqe;
		u32 len = 0;

		if (wr->num_sge > srq->max_sge) {
			err = -EINVAL;
			break;
		}
		if (ring_full(&srq->q, prod)) {
			err = -ENOMEM;
			break;
		}
		wqe = ring_slot(&srq->q, prod);
		memset(wqe, 0, sizeof(*wqe));
		wqe->wr_id = wr->wr_id;
		for (i = 0; i < wr->num_sge; i++) {
			/* an SRQ has no QP to name the PD's DMA lkey: take the SRQ's PD */
			const struct ib_sge *sge = &wr->sg_list[i];

			wqe->dma.sge[i].addr = sge->lkey == ibsrq->pd->local_dma_lkey ?
				virt_to_phys((void *)(uintptr_t)sge->addr) : sge->addr;
			wqe->dma.sge[i].length = sge->length;
			wqe->dma.sge[i].lkey = sge->lkey;
			len += sge->length;
		}
		wqe->dma.length = len;
		wqe->dma.resid = len;
		wqe->dma.num_sge = wr->num_sge;
		prod = (prod + 1) & (srq->q.num_slots - 1);
		smp_store_release(&srq->q.buf->producer_index, prod);
	}
	spin_unlock_irqrestore(&srq->lock, flags);
	if (err)
		*bad_wr = wr;
	return err;
}

/* --- MR ------------------------------------------------------------------------------- */

struct umem_it {
	struct sg_page_iter piter;
};

static u64 umem_next(void *ctx)
{
	struct umem_it *it = ctx;

	__sg_page_iter_next(&it->piter);
	return page_to_phys(sg_page_iter_page(&it->piter));
}

#ifdef VRDMA_HAVE_RESIZE_USER_CQ
/* Kernels whose ops take the new size unsigned (resize_user_cq). */
static int vrdma_resize_user_cq(struct ib_cq *ibcq, unsigned int cqe, struct ib_udata *udata)
{
	return cqe > INT_MAX ? -EINVAL : vrdma_resize_cq(ibcq, cqe, udata);
}
#endif

/*
 * Hands mr->umem's pages (npages of them, from next(ctx)) to the device as a REG_USER_MR of
 * length bytes at iova, byte 0 at page_offset of the first page (§5.8); fills in the keys.
 */
static int vrdma_reg_pages(struct ib_pd *ibpd, struct vrdma_mr *mr, size_t npages,
			   u32 page_offset, u64 iova, u64 length, int access,
			   u64 (*next)(void *ctx), void *ctx)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct vrdma_cmd_reg_user_mr cmd = {};
	struct vrdma_resp_mr r;
	struct vrdma_pl pl;
	int err;

	if (!npages || npages > U32_MAX)
		return -EINVAL;
	err = vrdma_pl_build(dev, &pl, npages, next, ctx);
	if (err)
		return err;
	cmd.pdn = cpu_to_le32(pdn_of(ibpd));
	cmd.access = cpu_to_le32(access_to_dev(access));
	cmd.iova = cpu_to_le64(iova);
	cmd.length = cpu_to_le64(length);
	cmd.pages = pl.desc;
	cmd.page_offset = cpu_to_le32(page_offset);
	err = vrdma_cmd(dev, VRDMA_CMD_REG_USER_MR, &cmd, sizeof(cmd), &r, sizeof(r));
	vrdma_pl_free(&pl);
	if (err)
		return err;
	mr->ibmr.lkey = le32_to_cpu(r.lkey);
	mr->ibmr.rkey = le32_to_cpu(r.rkey);
	mr->dev_key = mr->ibmr.lkey;
	mr->ibmr.iova = iova;
	mr->ibmr.length = length;
	mr->access = access;
	return 0;
}

/* Pins user memory: ib_umem_get, named ib_umem_get_va in the kernels that have that. */
static struct ib_umem *vrdma_umem_get(struct ib_device *ibdev, u64 start, u64 length, int access)
{
#ifdef VRDMA_HAVE_UMEM_GET_VA
	return ib_umem_get_va(ibdev, start, length, access);
#else
	return ib_umem_get(ibdev, start, length, access);
#endif
}

/*
 * Byte x of the MR is at page_offset + x of the page list (§5.8), page_offset being where the
 * first byte lies in its page: any IOVA works (ibv_reg_mr_iova). A device without
 * MR_PAGE_OFFSET takes iova mod page instead, so there the IOVA must be congruent.
 */
static bool vrdma_iova_ok(struct vrdma_dev *dev, u64 start, u64 iova)
{
	return (le32_to_cpu(dev->cfg.caps) & VRDMA_CAP_MR_PAGE_OFFSET) ||
	       !((start ^ iova) & ~PAGE_MASK);
}

static struct ib_mr *vrdma_reg_user_mr(struct ib_pd *ibpd, u64 start, u64 length, u64 iova,
				       int access,
#ifdef VRDMA_HAVE_REG_MR_DMAH
				       struct ib_dmah *dmah,
#endif
				       struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct vrdma_mr *mr;
	struct umem_it it;
	int err;

	if (!vrdma_iova_ok(dev, start, iova))
		return ERR_PTR(-EINVAL);
	if (access & IB_ACCESS_ON_DEMAND)
		return vrdma_reg_odp_mr(ibpd, pdn_of(ibpd), start, length, iova, access);
	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	mr->umem = vrdma_umem_get(ibpd->device, start, length, access);
	if (IS_ERR(mr->umem)) {
		err = PTR_ERR(mr->umem);
		goto err_free;
	}
	__sg_page_iter_start(&it.piter, mr->umem->sgt_append.sgt.sgl,
			     mr->umem->sgt_append.sgt.orig_nents, 0);
	err = vrdma_reg_pages(ibpd, mr, ib_umem_num_pages(mr->umem), ib_umem_offset(mr->umem),
			      iova, length, access, umem_next, &it);
	if (err)
		goto err_umem;
	return &mr->ibmr;

err_umem:
	ib_umem_release(mr->umem);
err_free:
	kfree(mr);
	return ERR_PTR(err);
}

/*
 * ibv_rereg_mr in place (caps REREG_MR, §5.8): the device changes the MR's PD, access flags
 * and, with IB_MR_REREG_TRANS, its IOVA, length and pages, and keeps its keys, so a peer that
 * holds the rkey goes on using it. A new translation pins the new range first and unpins the
 * old one once the device has let go of it. Pinned user MRs only: on-demand-paging and
 * dma-buf MRs are refused (EOPNOTSUPP), as is everything on a device without the cap.
 */
static struct ib_mr *vrdma_rereg_user_mr(struct ib_mr *ibmr, int flags, u64 start, u64 length,
					 u64 iova, int access, struct ib_pd *pd,
					 struct ib_udata *udata)
{
	struct vrdma_mr *mr = container_of(ibmr, struct vrdma_mr, ibmr);
	struct vrdma_dev *dev = to_vdev(ibmr->device);
	struct vrdma_cmd_rereg_mr cmd = {};
	struct ib_umem *umem = NULL;
	struct vrdma_resp_mr r;
	struct vrdma_pl pl;
	struct umem_it it;
	size_t npages;
	int err;

	if (!(le32_to_cpu(dev->cfg.caps) & VRDMA_CAP_REREG_MR) || !mr->umem || mr->odp ||
	    mr->umem->is_dmabuf)
		return ERR_PTR(-EOPNOTSUPP);
	flags &= IB_MR_REREG_TRANS | IB_MR_REREG_PD | IB_MR_REREG_ACCESS;
	if (!(flags & IB_MR_REREG_ACCESS))
		access = mr->access;
	if (flags & IB_MR_REREG_TRANS) {
		if (!vrdma_iova_ok(dev, start, iova) || (access & IB_ACCESS_ON_DEMAND))
			return ERR_PTR(-EINVAL);
		umem = vrdma_umem_get(ibmr->device, start, length, access);
		if (IS_ERR(umem))
			return ERR_CAST(umem);
		npages = ib_umem_num_pages(umem);
		err = -EINVAL;
		if (npages && npages <= U32_MAX) {
			__sg_page_iter_start(&it.piter, umem->sgt_append.sgt.sgl,
					     umem->sgt_append.sgt.orig_nents, 0);
			err = vrdma_pl_build(dev, &pl, npages, umem_next, &it);
		}
		if (err) {
			ib_umem_release(umem);
			return ERR_PTR(err);
		}
		cmd.iova = cpu_to_le64(iova);
		cmd.length = cpu_to_le64(length);
		cmd.pages = pl.desc;
		cmd.page_offset = cpu_to_le32(ib_umem_offset(umem));
	}
	cmd.lkey = cpu_to_le32(mr->dev_key);
	cmd.flags = cpu_to_le32(flags);
	cmd.pdn = cpu_to_le32(pdn_of(pd));
	cmd.access = cpu_to_le32(access_to_dev(access));
	err = vrdma_cmd(dev, VRDMA_CMD_REREG_MR, &cmd, sizeof(cmd), &r, sizeof(r));
	if (umem)
		vrdma_pl_free(&pl);
	if (err) {
		if (umem)
			ib_umem_release(umem);
		return ERR_PTR(err);
	}
	if (umem) {
		/* the device answered: it reaches only the new pages now */
		ib_umem_release(mr->umem);
		mr->umem = umem;
		mr->ibmr.iova = iova;
		mr->ibmr.length = length;
	}
	mr->access = access;
	return NULL;
}

static u64 dma_block_next(void *ctx)
{
	struct ib_block_iter *biter = ctx;

	__rdma_block_iter_next(biter);
	return rdma_block_iter_dma_address(biter);
}

/*
 * A dma-buf MR (ibv_reg_dmabuf_mr): bytes offset .. offset + length of the dma-buf behind fd.
 * The buffer is attached pinned, so the exporter keeps it where it is while the MR lives; one
 * that must be able to move (it cannot be pinned) is refused by the attach. It is mapped for
 * the virtio function's PCI device: the device is given no IOMMU (no VIRTIO_F_ACCESS_PLATFORM),
 * so those DMA addresses are the guest-physical ones the page list carries (§5.8).
 */
static struct ib_mr *vrdma_reg_user_mr_dmabuf(struct ib_pd *ibpd, u64 offset, u64 length,
					      u64 iova, int fd, int access,
#ifdef VRDMA_HAVE_REG_MR_DMAH
					      struct ib_dmah *dmah,
#endif
					      struct uverbs_attr_bundle *attrs)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct ib_umem_dmabuf *umem_dmabuf;
	struct ib_block_iter biter;
	struct vrdma_mr *mr;
	int err;

	if (access & IB_ACCESS_ON_DEMAND)
		return ERR_PTR(-EOPNOTSUPP);
	if (!vrdma_iova_ok(dev, offset, iova))
		return ERR_PTR(-EINVAL);
	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	umem_dmabuf = ib_umem_dmabuf_get_pinned_with_dma_device(ibpd->device,
								dev->vdev->dev.parent, offset,
								length, fd, access);
	if (IS_ERR(umem_dmabuf)) {
		err = PTR_ERR(umem_dmabuf);
		goto err_free;
	}
	mr->umem = &umem_dmabuf->umem;
	/*
	 * ib_umem_dmabuf_get leaves the umem's iova 0, which the block count (and the block
	 * iterator, which stops at that count) then reads as if the buffer began on a page:
	 * one page short when offset's place in its page and the length cross one more. The
	 * pages are the dma-buf's from byte offset, so count them from there.
	 */
	mr->umem->iova = mr->umem->address;
	/* the mapped list starts at the page that holds byte offset of the buffer */
	__rdma_umem_block_iter_start(&biter, mr->umem, PAGE_SIZE);
	err = vrdma_reg_pages(ibpd, mr, ib_umem_num_dma_blocks(mr->umem, PAGE_SIZE),
			      ib_umem_offset(mr->umem), iova, length, access, dma_block_next,
			      &biter);
	if (err)
		goto err_umem;
	return &mr->ibmr;

err_umem:
	ib_umem_release(mr->umem);
err_free:
	kfree(mr);
	return ERR_PTR(err);
}

static struct ib_mr *vrdma_get_dma_mr(struct ib_pd *ibpd, int access)
{
	struct vrdma_cmd_reg_dma_mr cmd = {
		.pdn = cpu_to_le32(pdn_of(ibpd)),
		.access = cpu_to_le32(access_to_dev(access)),
	};
	struct vrdma_resp_mr r;
	struct vrdma_mr *mr;
	int err;

	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	err = vrdma_cmd(to_vdev(ibpd->device), VRDMA_CMD_REG_DMA_MR, &cmd, sizeof(cmd), &r,
			sizeof(r));
	if (err) {
		kfree(mr);
		return ERR_PTR(err);
	}
	mr->ibmr.lkey = le32_to_cpu(r.lkey);
	mr->ibmr.rkey = le32_to_cpu(r.rkey);
	mr->dev_key = mr->ibmr.lkey;
	return &mr->ibmr;
}

/*
 * Fast registration for kernel users (ib_alloc_mr + ib_map_mr_sg + IB_WR_REG_MR): up to 512
 * pages, whose GPAs live in one page the REG_MR WQE points to (§6.2).
 */
static struct ib_mr *vrdma_alloc_mr(struct ib_pd *ibpd, enum ib_mr_type type, u32 max_num_sg)
{
	struct vrdma_cmd_alloc_mr cmd = {
		.pdn = cpu_to_le32(pdn_of(ibpd)),
		.max_num_sg = cpu_to_le32(max_num_sg),
	};
	struct vrdma_resp_mr r;
	struct vrdma_mr *mr;
	int err;

	if (type != IB_MR_TYPE_MEM_REG || !max_num_sg || max_num_sg > PL_PER_PAGE)
		return ERR_PTR(-EINVAL);
	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	mr->pages = (__le64 *)get_zeroed_page(GFP_KERNEL);
	if (!mr->pages) {
		kfree(mr);
		return ERR_PTR(-ENOMEM);
	}
	err = vrdma_cmd(to_vdev(ibpd->device), VRDMA_CMD_ALLOC_MR, &cmd, sizeof(cmd), &r,
			sizeof(r));
	if (err) {
		free_page((unsigned long)mr->pages);
		kfree(mr);
		return ERR_PTR(err);
	}
	mr->max_pages = max_num_sg;
	mr->ibmr.lkey = le32_to_cpu(r.lkey);
	mr->ibmr.rkey = le32_to_cpu(r.rkey);
	mr->dev_key = mr->ibmr.lkey;
	return &mr->ibmr;
}

static int vrdma_set_page(struct ib_mr *ibmr, u64 addr)
{
	struct vrdma_mr *mr = container_of(ibmr, struct vrdma_mr, ibmr);

	if (mr->npages == mr->max_pages)
		return -ENOMEM;
	/* virtual DMA: the "DMA address" is a kernel virtual address */
	mr->pages[mr->npages++] = cpu_to_le64(virt_to_phys((void *)(uintptr_t)addr));
	return 0;
}

static int vrdma_map_mr_sg(struct ib_mr *ibmr, struct scatterlist *sg, int sg_nents,
			   unsigned int *sg_offset)
{
	struct vrdma_mr *mr = container_of(ibmr, struct vrdma_mr, ibmr);
	int n;

	mr->npages = 0;
	n = ib_sg_to_pages(ibmr, sg, sg_nents, sg_offset, vrdma_set_page);
	/*
	 * ib_sg_to_pages sets the IOVA to the first byte's (virtual DMA) address, sg_offset
	 * included, and the first page to that address rounded down: the offset is the IOVA's
	 * offset in a page now, and stays so even if the ULP changes the IOVA before posting.
	 */
	mr->page_offset = ibmr->iova & (ibmr->page_size - 1);
	return n;
}

static int vrdma_dereg_mr(struct ib_mr *ibmr, struct ib_udata *udata)
{
	struct vrdma_mr *mr = container_of(ibmr, struct vrdma_mr, ibmr);
	int err;

	err = vrdma_cmd_handle(to_vdev(ibmr->device), VRDMA_CMD_DEREG_MR, mr->dev_key);
	if (err && err != -ENOENT && err != -EIO && err != -ETIMEDOUT)
		return err;
	/* after DEREG_MR the device no longer touches the pages: unpin */
	if (mr->odp)
		vrdma_odp_forget(to_vdev(ibmr->device), mr);
	if (mr->umem)
		ib_umem_release(mr->umem);
	if (mr->pages)
		free_page((unsigned long)mr->pages);
	kfree(mr);
	return 0;
}

/* --- MW: user windows (librxe binds them with BIND_MW work requests) ------------------- */

static int vrdma_alloc_mw(struct ib_mw *ibmw, struct ib_udata *udata)
{
	struct vrdma_cmd_alloc_mw cmd = {
		.pdn = cpu_to_le32(pdn_of(ibmw->pd)),
		.mw_type = cpu_to_le32(ibmw->type == IB_MW_TYPE_2 ? 2 : 1),
	};
	struct vrdma_resp_mr r;
	int err;

	err = vrdma_cmd(to_vdev(ibmw->device), VRDMA_CMD_ALLOC_MW, &cmd, sizeof(cmd), &r,
			sizeof(r));
	if (err)
		return err;
	ibmw->rkey = le32_to_cpu(r.rkey);
	return 0;
}

static int vrdma_dealloc_mw(struct ib_mw *ibmw)
{
	int err = vrdma_cmd_handle(to_vdev(ibmw->device), VRDMA_CMD_DEALLOC_MW, ibmw->rkey);

	return err == -ENOENT || err == -EIO || err == -ETIMEDOUT ? 0 : err;
}

/* --- AH ------------------------------------------------------------------------------- */

/*
 * User AHs (librxe) get a device AH number; librxe also writes the AV into each UD WQE.
 * Kernel AHs may be created in atomic context (the CM), so they never use the control
 * queue: their AV goes inline into each WQE (ah_num 0).
 */
static int vrdma_create_ah(struct ib_ah *ibah, struct rdma_ah_init_attr *init,
			   struct ib_udata *udata)
{
	struct vrdma_ah *ah = container_of(ibah, struct vrdma_ah, ibah);
	struct vrdma_dev *dev = to_vdev(ibah->device);
	struct vrdma_cmd_create_ah cmd = {};
	struct rxe_create_ah_resp uresp = {};
	struct vrdma_handle h;
	int err;

	ah_attr_to_dev(init->ah_attr, &ah->av);
	ah->network_type = rdma_gid_attr_network_type(init->ah_attr->grh.sgid_attr);
	if (!udata)
		return 0;
	cmd.pdn = cpu_to_le32(pdn_of(ibah->pd));
	cmd.attr = ah->av;
	err = vrdma_cmd(dev, VRDMA_CMD_CREATE_AH, &cmd, sizeof(cmd), &h, sizeof(h));
	if (err)
		return err;
	ah->ah_num = le32_to_cpu(h.handle);
	if (udata->outlen >= sizeof(uresp)) {
		uresp.ah_num = ah->ah_num;
		err = ib_copy_to_udata(udata, &uresp, sizeof(uresp));
		if (err) {
			vrdma_cmd_handle(dev, VRDMA_CMD_DESTROY_AH, ah->ah_num);
			return err;
		}
	}
	return 0;
}

static int vrdma_destroy_ah(struct ib_ah *ibah, u32 flags)
{
	struct vrdma_ah *ah = container_of(ibah, struct vrdma_ah, ibah);

	if (ah->ah_num)
		vrdma_cmd_handle(to_vdev(ibah->device), VRDMA_CMD_DESTROY_AH, ah->ah_num);
	return 0;
}

/*
 * Device removal with user contexts open (module unload, or the re-probe after a device that
 * lost its state): ib_uverbs destroys their objects and zaps their mmaps itself; this op only
 * tells it not to wait for the processes to close their files.
 */
static void vrdma_disassociate_ucontext(struct ib_ucontext *ibuc)
{
}

static const struct rdma_stat_desc vrdma_stat_descs[] = {
	[VRDMA_STAT_SENT_PKTS].name = "sent_pkts",
	[VRDMA_STAT_RCVD_PKTS].name = "rcvd_pkts",
	[VRDMA_STAT_DUP_REQ].name = "duplicate_request",
	[VRDMA_STAT_OUT_OF_SEQ_REQ].name = "out_of_seq_request",
	[VRDMA_STAT_RCV_RNR].name = "rcvd_rnr_err",
	[VRDMA_STAT_SND_RNR].name = "send_rnr_err",
	[VRDMA_STAT_RCV_SEQ_ERR].name = "rcvd_seq_err",
	[VRDMA_STAT_RETRY_EXCEEDED].name = "retry_exceeded_err",
	[VRDMA_STAT_RNR_RETRY_EXCEEDED].name = "retry_rnr_exceeded_err",
	[VRDMA_STAT_COMP_RETRY].name = "completer_retry_err",
	[VRDMA_STAT_LINK_DOWNED].name = "link_downed",
};

static_assert(ARRAY_SIZE(vrdma_stat_descs) == VRDMA_STAT_NUM);
static_assert(VRDMA_STAT_NUM <= VRDMA_MAX_STATS);

static struct rdma_hw_stats *vrdma_alloc_hw_port_stats(struct ib_device *ib, u32 port)
{
	return rdma_alloc_hw_stats_struct(vrdma_stat_descs, ARRAY_SIZE(vrdma_stat_descs),
					  RDMA_HW_STATS_DEFAULT_LIFESPAN);
}

static int vrdma_get_hw_stats(struct ib_device *ib, struct rdma_hw_stats *stats, u32 port,
			      int index)
{
	struct vrdma_resp_query_stats *r;
	unsigned int i, n;
	int err;

	r = kzalloc(sizeof(*r), GFP_KERNEL);
	if (!r)
		return -ENOMEM;
	err = vrdma_cmd(to_vdev(ib), VRDMA_CMD_QUERY_STATS, NULL, 0, r, sizeof(*r));
	if (err)
		goto out;
	n = min_t(u32, le32_to_cpu(r->count), stats->num_counters);
	for (i = 0; i < n; i++)
		stats->value[i] = le64_to_cpu(r->values[i]);
	err = stats->num_counters;
out:
	kfree(r);
	return err;
}

const struct ib_device_ops vrdma_hw_stats_ops = {
	.alloc_hw_port_stats = vrdma_alloc_hw_port_stats,
	.get_hw_stats = vrdma_get_hw_stats,
};

const struct ib_device_ops vrdma_dev_ops = {
	.owner = THIS_MODULE,
	.driver_id = RDMA_DRIVER_RXE,
	.disassociate_ucontext = vrdma_disassociate_ucontext,
	.uverbs_abi_ver = VRDMA_UVERBS_ABI_VERSION,

	.add_gid = vrdma_add_gid,
	.alloc_mr = vrdma_alloc_mr,
	.alloc_mw = vrdma_alloc_mw,
	.alloc_pd = vrdma_alloc_pd,
	.alloc_ucontext = vrdma_alloc_ucontext,
	.attach_mcast = vrdma_attach_mcast,
	.create_ah = vrdma_create_ah,
	.create_cq = vrdma_create_cq,
	.create_qp = vrdma_create_qp,
	.create_srq = vrdma_create_srq,
	.create_user_ah = vrdma_create_ah,
	.dealloc_mw = vrdma_dealloc_mw,
	.dealloc_pd = vrdma_dealloc_pd,
	.dealloc_ucontext = vrdma_dealloc_ucontext,
	.query_ucontext = vrdma_query_ucontext,
	.del_gid = vrdma_del_gid,
	.dereg_mr = vrdma_dereg_mr,
	.destroy_ah = vrdma_destroy_ah,
	.destroy_cq = vrdma_destroy_cq,
	.destroy_qp = vrdma_destroy_qp,
	.destroy_srq = vrdma_destroy_srq,
	.detach_mcast = vrdma_detach_mcast,
	.get_dma_mr = vrdma_get_dma_mr,
	.get_link_layer = vrdma_get_link_layer,
	.get_netdev = vrdma_get_netdev,
	.get_port_immutable = vrdma_get_port_immutable,
	.map_mr_sg = vrdma_map_mr_sg,
	.mmap = vrdma_mmap,
	.mmap_free = vrdma_mmap_free,
	.modify_qp = vrdma_modify_qp,
	.modify_srq = vrdma_modify_srq,
	.poll_cq = vrdma_poll_cq,
	.post_recv = vrdma_post_recv,
	.post_send = vrdma_post_send,
	.post_srq_recv = vrdma_post_srq_recv,
	.query_device = vrdma_query_device,
	.query_pkey = vrdma_query_pkey,
	.query_port = vrdma_query_port,
	.query_qp = vrdma_query_qp,
	.query_srq = vrdma_query_srq,
	.reg_user_mr = vrdma_reg_user_mr,
	.reg_user_mr_dmabuf = vrdma_reg_user_mr_dmabuf,
	.rereg_user_mr = vrdma_rereg_user_mr,
	.advise_mr = vrdma_advise_mr,
	.req_notify_cq = vrdma_req_notify_cq,
#ifdef VRDMA_HAVE_RESIZE_USER_CQ
	.resize_user_cq = vrdma_resize_user_cq,
#else
	.resize_cq = vrdma_resize_cq,
#endif

	INIT_RDMA_OBJ_SIZE(ib_ah, vrdma_ah, ibah),
	INIT_RDMA_OBJ_SIZE(ib_cq, vrdma_cq, ibcq),
	INIT_RDMA_OBJ_SIZE(ib_mw, vrdma_mw, ibmw),
	INIT_RDMA_OBJ_SIZE(ib_pd, vrdma_pd, ibpd),
	INIT_RDMA_OBJ_SIZE(ib_qp, vrdma_qp, ibqp),
	INIT_RDMA_OBJ_SIZE(ib_srq, vrdma_srq, ibsrq),
	INIT_RDMA_OBJ_SIZE(ib_ucontext, vrdma_ucontext, ibuc),
};
