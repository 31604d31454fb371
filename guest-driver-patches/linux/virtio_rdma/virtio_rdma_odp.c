// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * virtio_rdma: on-demand-paging MRs (caps ODP, docs/virtio-rdma.md §5.10).
 *
 * An ODP MR is registered with no page list: the device asks for each page it needs with a
 * PAGE_FAULT event, and the driver faults the page in (hmm, through ib_umem_odp) and hands
 * the device its GPA with UPDATE_ODP. When the process's page tables change, the MMU
 * notifier's invalidation unmaps the range on the device (UPDATE_ODP with UNMAP, answered
 * before the invalidation returns, so the pages may be freed at once). Nothing is pinned.
 */

#include <linux/hmm.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <rdma/ib_umem_odp.h>

#include "virtio_rdma.h"

/* Pages mapped per fault at most, from the faulting one on (fault-around). */
#define VRDMA_ODP_FAULT_AROUND	16
/* An implicit MR's children: 2 MiB of the address space each, made as pages are faulted in */
#define VRDMA_ODP_CHILD_SHIFT	21

struct vrdma_odp_work {
	struct work_struct work;
	struct vrdma_dev *dev;
	u32 lkey;
	u64 page;
	bool write;
};

void vrdma_odp_attrs(struct vrdma_dev *dev, struct ib_device_attr *a)
{
	if (!(le32_to_cpu(dev->cfg.caps) & VRDMA_CAP_ODP) ||
	    !IS_ENABLED(CONFIG_INFINIBAND_ON_DEMAND_PAGING))
		return;
	a->kernel_cap_flags |= IBK_ON_DEMAND_PAGING;
	a->odp_caps.general_caps = IB_ODP_SUPPORT;
	a->odp_caps.per_transport_caps.rc_odp_caps =
		IB_ODP_SUPPORT_SEND | IB_ODP_SUPPORT_RECV | IB_ODP_SUPPORT_WRITE |
		IB_ODP_SUPPORT_READ | IB_ODP_SUPPORT_ATOMIC | IB_ODP_SUPPORT_SRQ_RECV;
	a->odp_caps.per_transport_caps.ud_odp_caps =
		IB_ODP_SUPPORT_SEND | IB_ODP_SUPPORT_RECV | IB_ODP_SUPPORT_SRQ_RECV;
	/* XRC moves data as RC does, its receives from XRC SRQs */
	if (le32_to_cpu(dev->cfg.caps) & VRDMA_CAP_XRC)
		a->odp_caps.per_transport_caps.xrc_odp_caps =
			a->odp_caps.per_transport_caps.rc_odp_caps;
	if (le32_to_cpu(dev->cfg.caps) & VRDMA_CAP_IMPLICIT_ODP)
		a->odp_caps.general_caps |= IB_ODP_SUPPORT_IMPLICIT;
}

static int update_odp(struct vrdma_dev *dev, u32 lkey, u32 flags, u64 first, u64 count,
		      struct vrdma_pl *pl)
{
	struct vrdma_cmd_update_odp cmd = {
		.lkey = cpu_to_le32(lkey),
		.flags = cpu_to_le32(flags),
		.first_page = cpu_to_le64(first),
		.count = cpu_to_le64(count),
	};

	if (pl)
		cmd.pages = pl->desc;
	return vrdma_cmd(dev, VRDMA_CMD_UPDATE_ODP, &cmd, sizeof(cmd), NULL, 0);
}

#ifdef ODP_READ_ALLOWED_BIT
/* kernels before hmm_dma_map (6.12): the hmm pfns in pfn_list, access by ODP_*_ALLOWED */
#define odp_pfns(odp)		((odp)->pfn_list)
#define odp_access(write)	(ODP_READ_ALLOWED_BIT | ((write) ? ODP_WRITE_ALLOWED_BIT : 0))
#else
#define odp_pfns(odp)		((odp)->map.pfn_list)
#define odp_access(write)	((write) ? HMM_PFN_WRITE : 0)
#endif

/*
 * MMU-notifier invalidation: the device stops using the range before the pages go. Runs
 * under umem_mutex, as faults map under it, so a fault that raced with it maps again.
 */
static bool vrdma_odp_invalidate(struct mmu_interval_notifier *mni,
				 const struct mmu_notifier_range *range, unsigned long cur_seq)
{
	struct ib_umem_odp *odp = container_of(mni, struct ib_umem_odp, notifier);
	struct vrdma_mr *mr = odp->private;
	unsigned long start, end;

	if (!mmu_notifier_range_blockable(range))
		return false;
	mutex_lock(&odp->umem_mutex);
	mmu_interval_set_seq(mni, cur_seq);
	start = max_t(u64, ib_umem_start(odp), range->start);
	end = min_t(u64, ib_umem_end(odp), range->end);
	if (start < end) {
		unsigned int noreclaim = memalloc_noreclaim_save();

		/*
		 * lkey 0: the MR is being registered, the device has no page of it yet. An
		 * explicit MR's pages count from its first page, an implicit one's (this a child
		 * of it) from address 0.
		 */
		if (mr && mr->ibmr.lkey)
			update_odp(to_vdev(mr->ibmr.device), mr->ibmr.lkey, VRDMA_ODP_UNMAP,
				   (start - (mr->implicit ? 0 : ib_umem_start(odp))) >> PAGE_SHIFT,
				   (end - start) >> PAGE_SHIFT, NULL);
		ib_umem_odp_unmap_dma_pages(odp, start, end);
		memalloc_noreclaim_restore(noreclaim);
	}
	mutex_unlock(&odp->umem_mutex);
	return true;
}

static const struct mmu_interval_notifier_ops vrdma_odp_ops = {
	.invalidate = vrdma_odp_invalidate,
};

struct ib_mr *vrdma_reg_odp_mr(struct ib_pd *ibpd, u32 pdn, u64 start, u64 length, u64 iova,
			       int access)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct vrdma_cmd_reg_user_mr cmd = {};
	struct vrdma_resp_mr r;
	struct ib_umem_odp *odp;
	struct vrdma_mr *mr;
	int err;

	if (!(dev->attrs.kernel_cap_flags & IBK_ON_DEMAND_PAGING))
		return ERR_PTR(-EOPNOTSUPP);
	if ((start ^ iova) & ~PAGE_MASK)
		return ERR_PTR(-EINVAL);
	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	xa_init(&mr->children);
	if (!start && length == U64_MAX) {
		/* implicit: the whole address space, children made on faults */
		if (!(dev->attrs.odp_caps.general_caps & IB_ODP_SUPPORT_IMPLICIT) || iova) {
			err = -EOPNOTSUPP;
			goto err_free;
		}
		odp = ib_umem_odp_alloc_implicit(ibpd->device, access & ~IB_ACCESS_HUGETLB);
		mr->implicit = true;
	} else {
		/*
		 * 4 KiB entries whatever backs the range: without IB_ACCESS_HUGETLB the umem
		 * keeps PAGE_SHIFT, and a huge page is mapped as its 4 KiB parts.
		 */
		odp = ib_umem_odp_get(ibpd->device, start, length, access & ~IB_ACCESS_HUGETLB,
				      &vrdma_odp_ops);
	}
	if (IS_ERR(odp)) {
		err = PTR_ERR(odp);
		goto err_free;
	}
	mr->umem = &odp->umem;
	mr->odp = true;
	mr->ibmr.device = ibpd->device;
	odp->private = mr;
	cmd.pdn = cpu_to_le32(pdn);
	cmd.access = cpu_to_le32(access & ~(IB_ACCESS_HUGETLB | IB_ACCESS_OPTIONAL));
	cmd.iova = cpu_to_le64(iova);
	cmd.length = cpu_to_le64(length);
	cmd.page_offset = cpu_to_le32(start & ~PAGE_MASK);
	err = vrdma_cmd(dev, VRDMA_CMD_REG_USER_MR, &cmd, sizeof(cmd), &r, sizeof(r));
	if (err)
		goto err_umem;
	mr->ibmr.rkey = le32_to_cpu(r.rkey);
	mr->dev_key = le32_to_cpu(r.lkey);
	mr->ibmr.iova = iova;
	mr->ibmr.length = length;
	err = xa_err(xa_store(&dev->odp_mrs, mr->dev_key >> 8, mr, GFP_KERNEL));
	if (err) {
		vrdma_cmd_handle(dev, VRDMA_CMD_DEREG_MR, mr->dev_key);
		goto err_umem;
	}
	/* from now on invalidations reach the device (and faults find the MR) */
	mutex_lock(&odp->umem_mutex);
	mr->ibmr.lkey = mr->dev_key;
	mutex_unlock(&odp->umem_mutex);
	return &mr->ibmr;

err_umem:
	ib_umem_release(mr->umem);
err_free:
	kfree(mr);
	return ERR_PTR(err);
}

/*
 * After DEREG_MR: no fault handler runs for the MR once this returns, and an implicit MR's
 * children are gone (their notifiers removed); the caller releases the MR's own umem.
 */
void vrdma_odp_forget(struct vrdma_dev *dev, struct vrdma_mr *mr)
{
	struct ib_umem_odp *child;
	unsigned long i;

	xa_erase(&dev->odp_mrs, mr->dev_key >> 8);
	flush_workqueue(dev->odp_wq);
	xa_for_each(&mr->children, i, child)
		ib_umem_odp_release(child);
	xa_destroy(&mr->children);
}

static u64 pfn_next(void *ctx)
{
	unsigned long **p = ctx;

	return page_to_phys(hmm_pfn_to_page(*(*p)++));
}

/*
 * Maps up to count pages of an ODP MR on the device, from page on: hmm faults them in first
 * when fault is set (for writing when write is), and takes only those already present
 * otherwise. Stops at the first page it did not get; one UPDATE_ODP for the run, writable
 * only if every page of it is. Returns the pages mapped, or a negative errno when the
 * process could not fault the first one in (or the device refused the run).
 */
static int vrdma_odp_map(struct vrdma_dev *dev, struct vrdma_mr *mr, struct ib_umem_odp *odp,
			 u64 va, u64 page, u32 count, bool write, bool fault)
{
	unsigned long *pfns, *p;
	unsigned int noreclaim;
	bool writable = true;
	struct vrdma_pl pl;
	int got, err;
	u64 i;

	got = ib_umem_odp_map_dma_and_lock(odp, va, (u64)count << PAGE_SHIFT, odp_access(write),
					   fault);
	if (got < 0)
		return got;
	/*
	 * umem_mutex held: no invalidation until the device has the pages. Nothing below may
	 * enter reclaim, which could invalidate this MR and wait for the mutex.
	 */
	noreclaim = memalloc_noreclaim_save();
	pfns = &odp_pfns(odp)[(va - ib_umem_start(odp)) >> PAGE_SHIFT];
	for (i = 0; i < count; i++) {
		if (!(pfns[i] & HMM_PFN_VALID))
			break;
		if (!(pfns[i] & HMM_PFN_WRITE))
			writable = false;
	}
	err = 0;
	if (i) {
		p = pfns;
		err = vrdma_pl_build(dev, &pl, i, pfn_next, &p);
		if (!err) {
			err = update_odp(dev, mr->dev_key, writable ? VRDMA_ODP_WRITABLE : 0, page, i,
					 &pl);
			vrdma_pl_free(&pl);
		}
	} else if (fault) {
		err = -EFAULT;
	}
	memalloc_noreclaim_restore(noreclaim);
	mutex_unlock(&odp->umem_mutex);
	return err ? err : i;
}

/*
 * The child of implicit MR mr that covers va: made (2 MiB, its notifier registered) the first
 * time a page of it is needed. Only the fault work queue calls this, so children are made
 * one at a time; DEREG_MR releases them after flushing the queue.
 */
static struct ib_umem_odp *vrdma_odp_child(struct vrdma_mr *mr, u64 va)
{
	unsigned long idx = va >> VRDMA_ODP_CHILD_SHIFT;
	struct ib_umem_odp *child;
	int err;

	child = xa_load(&mr->children, idx);
	if (child)
		return child;
	child = ib_umem_odp_alloc_child(to_ib_umem_odp(mr->umem),
					(u64)idx << VRDMA_ODP_CHILD_SHIFT,
					1UL << VRDMA_ODP_CHILD_SHIFT, &vrdma_odp_ops);
	if (IS_ERR(child))
		return child;
	child->private = mr;
	err = xa_err(xa_store(&mr->children, idx, child, GFP_KERNEL));
	if (err) {
		ib_umem_odp_release(child);
		return ERR_PTR(err);
	}
	return child;
}

/*
 * Maps up to count pages of an ODP MR from page on (vrdma_odp_map): an explicit MR's through
 * its umem, an implicit one's through the child that holds page, no further than its end.
 */
static int vrdma_odp_map_pages(struct vrdma_dev *dev, struct vrdma_mr *mr, u64 page, u32 count,
			       bool write, bool fault)
{
	struct ib_umem_odp *odp = to_ib_umem_odp(mr->umem);
	u64 va, left;

	if (!mr->implicit)
		return vrdma_odp_map(dev, mr, odp, ib_umem_start(odp) + (page << PAGE_SHIFT), page,
				     count, write, fault);
	if (page >> (64 - PAGE_SHIFT))
		return -EFAULT;
	va = page << PAGE_SHIFT;
	odp = vrdma_odp_child(mr, va);
	if (IS_ERR(odp))
		return PTR_ERR(odp);
	left = (ib_umem_end(odp) - va) >> PAGE_SHIFT;
	return vrdma_odp_map(dev, mr, odp, va, page, min_t(u64, count, left), write, fault);
}

/*
 * A PAGE_FAULT: fault in up to VRDMA_ODP_FAULT_AROUND pages from the one the device asked
 * for (that one alone if the run cannot be), and map them on the device (writable only if
 * every one is). A page the process
 * cannot fault in (not mapped, no write right), or one that could not be mapped on the
 * device, is marked FAILED: the access fails rather than waiting for a fault nobody answers.
 */
static void vrdma_odp_fault_work(struct work_struct *w)
{
	struct vrdma_odp_work *f = container_of(w, struct vrdma_odp_work, work);
	struct vrdma_dev *dev = f->dev;
	struct vrdma_mr *mr;
	u64 n;
	int got;

	mr = xa_load(&dev->odp_mrs, f->lkey >> 8);
	if (!mr || mr->dev_key != f->lkey)
		goto out;
	n = VRDMA_ODP_FAULT_AROUND;
	if (!mr->implicit) {
		n = ib_umem_odp_num_pages(to_ib_umem_odp(mr->umem));
		if (f->page >= n)
			goto out;
		n = min_t(u64, VRDMA_ODP_FAULT_AROUND, n - f->page);
	}
	if (f->write && !mr->umem->writable)
		goto failed;
	got = vrdma_odp_map_pages(dev, mr, f->page, n, f->write, true);
	/*
	 * The pages around may not be the process's to fault in (past the end of its mapping,
	 * read-only for a write: an implicit MR's neighbours are anything): the page asked for
	 * alone decides.
	 */
	if (got <= 0 && n > 1)
		got = vrdma_odp_map_pages(dev, mr, f->page, 1, f->write, true);
	if (got > 0)
		goto out;
	dev_dbg_ratelimited(&dev->vdev->dev, "ODP map of page %llu of %#x: %d\n", f->page,
			    f->lkey, got);
failed:
	update_odp(dev, f->lkey, VRDMA_ODP_FAILED, f->page, 1, NULL);
out:
	kfree(f);
}

/* Pages one prefetch maps per UPDATE_ODP at most. */
#define VRDMA_ODP_PREFETCH_RUN	256

struct vrdma_prefetch {
	struct work_struct work;
	struct vrdma_dev *dev;
	struct ib_pd *pd;
	bool write, fault;
	int err;
	u32 num_sge;
	struct ib_sge sge[];
};

/*
 * On the fault work queue, as faults are: DEREG_MR takes the MR out of odp_mrs and then
 * flushes the queue, so an MR found here lives until this returns.
 */
static void vrdma_prefetch_work(struct work_struct *w)
{
	struct vrdma_prefetch *pf = container_of(w, struct vrdma_prefetch, work);
	struct vrdma_dev *dev = pf->dev;
	u32 i;

	for (i = 0; i < pf->num_sge; i++) {
		const struct ib_sge *sge = &pf->sge[i];
		struct vrdma_mr *mr;
		u64 first, last, off;
		int got;

		mr = xa_load(&dev->odp_mrs, sge->lkey >> 8);
		if (!mr || mr->dev_key != sge->lkey || mr->ibmr.pd != pf->pd ||
		    (pf->write && !mr->umem->writable) || sge->addr < mr->ibmr.iova ||
		    sge->addr - mr->ibmr.iova > mr->ibmr.length ||
		    sge->length > mr->ibmr.length - (sge->addr - mr->ibmr.iova)) {
			pf->err = -EINVAL;
			return;
		}
		if (!sge->length)
			continue;
		/* the IOVA and the address share their offset in the page (ODP MRs, §5.10) */
		off = ib_umem_offset(mr->umem) + (sge->addr - mr->ibmr.iova);
		first = off >> PAGE_SHIFT;
		last = (off + sge->length - 1) >> PAGE_SHIFT;
		while (first <= last) {
			got = vrdma_odp_map_pages(dev, mr, first,
						  min_t(u64, VRDMA_ODP_PREFETCH_RUN,
							last - first + 1),
						  pf->write, pf->fault);
			if (got <= 0)
				break;
			first += got;
		}
	}
}

/*
 * ibv_advise_mr: PREFETCH (for reading), PREFETCH_WRITE (for writing) or PREFETCH_NO_FAULT
 * (the pages already present, none faulted in) of ranges of ODP MRs of this PD, mapped on the
 * device before this returns, with or without IB_UVERBS_ADVISE_MR_FLAG_FLUSH. A range not
 * in an ODP MR of the PD is EINVAL; a page the process cannot fault in ends its range
 * (advice, not an access: nothing fails on the device).
 */
int vrdma_advise_mr(struct ib_pd *pd, enum ib_uverbs_advise_mr_advice advice, u32 flags,
		    struct ib_sge *sg_list, u32 num_sge, struct uverbs_attr_bundle *attrs)
{
	struct vrdma_dev *dev = to_vdev(pd->device);
	struct vrdma_prefetch *pf;
	int err;

	if (!dev->odp_wq)
		return -EOPNOTSUPP;
	if (advice != IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH &&
	    advice != IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
	    advice != IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
		return -EOPNOTSUPP;
	pf = kzalloc(struct_size(pf, sge, num_sge), GFP_KERNEL);
	if (!pf)
		return -ENOMEM;
	INIT_WORK(&pf->work, vrdma_prefetch_work);
	pf->dev = dev;
	pf->pd = pd;
	pf->write = advice == IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE;
	pf->fault = advice != IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT;
	pf->num_sge = num_sge;
	memcpy(pf->sge, sg_list, flex_array_size(pf, sge, num_sge));
	queue_work(dev->odp_wq, &pf->work);
	flush_work(&pf->work);
	err = pf->err;
	kfree(pf);
	return err;
}

/* From the event queue (interrupt context, ev_lock held). */
void vrdma_odp_fault(struct vrdma_dev *dev, u32 lkey, u64 page, bool write)
{
	struct vrdma_odp_work *f;

	if (!dev->odp_wq)
		return;
	f = kmalloc(sizeof(*f), GFP_ATOMIC);
	if (!f) {
		/* the access asks again when its packet comes again (an RNR NAK's retry) */
		dev_warn_ratelimited(&dev->vdev->dev, "ODP fault dropped (no memory)\n");
		return;
	}
	INIT_WORK(&f->work, vrdma_odp_fault_work);
	f->dev = dev;
	f->lkey = lkey;
	f->page = page;
	f->write = write;
	queue_work(dev->odp_wq, &f->work);
}

int vrdma_odp_init(struct vrdma_dev *dev)
{
	if (!(dev->attrs.kernel_cap_flags & IBK_ON_DEMAND_PAGING))
		return 0;
	/* faults of one device in order; reclaim may wait on them (MMU notifiers) */
	dev->odp_wq = alloc_ordered_workqueue("vrdma_odp", WQ_MEM_RECLAIM);
	return dev->odp_wq ? 0 : -ENOMEM;
}

void vrdma_odp_fini(struct vrdma_dev *dev)
{
	if (dev->odp_wq)
		destroy_workqueue(dev->odp_wq);
	dev->odp_wq = NULL;
	xa_destroy(&dev->odp_mrs);
}
