// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * vrdma_selftest: kernel verbs against one RDMA device (default vrdma0), for what no user
 * tool reaches — fast registration: an RC QP connected to itself, ib_alloc_mr +
 * ib_map_mr_sg + IB_WR_REG_MR over a kmalloc buffer, an RDMA WRITE through the new rkey
 * from a buffer under the PD's local DMA lkey, a byte check, then IB_WR_LOCAL_INV.
 * Then the same MR again, zero-based (what ib_map_mr_sg_zbva does: the IOVA set to 0 after
 * mapping) over a buffer 0x456 bytes into its page: the device must take the first page's
 * offset from the REG_MR work request, not from the IOVA (caps bit MR_PAGE_OFFSET: against
 * a device without it this part fails).
 * Loading it runs the test and prints "vrdma_selftest: PASS" or "FAIL: ..."; it unloads
 * itself (init returns -EAGAIN after the run so nothing stays behind).
 */
#include <linux/module.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/delay.h>
#include <net/ipv6.h>
#include <rdma/ib_cache.h>
#include <rdma/ib_verbs.h>

static char *devname = "vrdma0";
module_param(devname, charp, 0444);
MODULE_PARM_DESC(devname, "RDMA device to test");

static int poll_one(struct ib_cq *cq, enum ib_wc_opcode op)
{
	struct ib_wc wc;
	int i;

	for (i = 0; i < 5000; i++) {
		if (ib_poll_cq(cq, 1, &wc) == 1) {
			if (wc.status != IB_WC_SUCCESS || wc.opcode != op) {
				pr_err("vrdma_selftest: FAIL: completion status %d opcode %d (want %d)\n",
				       wc.status, wc.opcode, op);
				return -EIO;
			}
			return 0;
		}
		msleep(1);
	}
	pr_err("vrdma_selftest: FAIL: no completion for opcode %d within 5 s\n", op);
	return -ETIMEDOUT;
}

/*
 * Fills @buf with xorshift64 bytes: no period, so a page or segment placed at the wrong
 * offset cannot compare equal (a fill of period 256 repeats at every path MTU and page).
 */
static void prng_fill(u8 *buf, size_t len, u64 x)
{
	size_t i;

	for (i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		buf[i] = x >> 24;
	}
}

/* Maps @sg for the device and into the fast-reg @mr under a fresh key. */
static int fr_map(struct ib_device *dev, struct ib_mr *mr, struct scatterlist *sg,
		  const char *what)
{
	int n;

	if (ib_dma_map_sg(dev, sg, 1, DMA_BIDIRECTIONAL) != 1)
		return -EIO;
	ib_update_fast_reg_key(mr, ib_inc_rkey(mr->rkey));
	n = ib_map_mr_sg(mr, sg, 1, NULL, PAGE_SIZE);
	if (n != 1) {
		pr_err("vrdma_selftest: FAIL: map_mr_sg (%s) %d\n", what, n);
		return -EIO;
	}
	return 0;
}

/* Posts the REG_MR chained to the RDMA WRITE and waits for both completions. */
static int post_reg_write(struct ib_qp *qp, struct ib_cq *cq, struct ib_reg_wr *reg)
{
	const struct ib_send_wr *bad;
	int err = ib_post_send(qp, &reg->wr, &bad);

	if (!err)
		err = poll_one(cq, IB_WC_REG_MR);
	if (!err)
		err = poll_one(cq, IB_WC_RDMA_WRITE);
	return err;
}

static int run(struct ib_device *dev)
{
	struct ib_qp_init_attr ia = {};
	struct ib_qp_attr attr = {};
	const struct ib_gid_attr *ga = NULL;
	struct ib_pd *pd;
	struct ib_cq *cq;
	struct ib_qp *qp = NULL;
	struct ib_mr *mr = NULL;
	struct scatterlist sg, sg2;
	struct ib_reg_wr reg = {};
	struct ib_rdma_wr wr = {};
	struct ib_send_wr inv = {};
	const struct ib_send_wr *bad;
	struct ib_sge sge;
	u8 *src, *dst;
	u64 src_dma;
	int err, i;

	src = kmalloc(8192, GFP_KERNEL);
	dst = kzalloc(8192, GFP_KERNEL);
	pd = ib_alloc_pd(dev, 0);
	cq = ib_alloc_cq(dev, NULL, 16, 0, IB_POLL_DIRECT);
	if (!src || !dst || IS_ERR(pd) || IS_ERR(cq)) {
		pr_err("vrdma_selftest: FAIL: setup\n");
		err = -ENOMEM;
		goto out;
	}
	for (i = 0; i < 16; i++) {
		ga = rdma_get_gid_attr(dev, 1, i);
		if (!IS_ERR(ga) && ipv6_addr_v4mapped((const struct in6_addr *)ga->gid.raw))
			break;
		if (!IS_ERR(ga))
			rdma_put_gid_attr(ga);
		ga = NULL;
	}
	if (!ga) {
		pr_err("vrdma_selftest: FAIL: no IPv4 GID\n");
		err = -ENODEV;
		goto out;
	}
	ia.send_cq = cq;
	ia.recv_cq = cq;
	ia.cap.max_send_wr = 8;
	ia.cap.max_recv_wr = 8;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	ia.sq_sig_type = IB_SIGNAL_ALL_WR;
	ia.qp_type = IB_QPT_RC;
	qp = ib_create_qp(pd, &ia);
	if (IS_ERR(qp)) {
		err = PTR_ERR(qp);
		qp = NULL;
		pr_err("vrdma_selftest: FAIL: create_qp %d\n", err);
		goto out;
	}
	attr.qp_state = IB_QPS_INIT;
	attr.port_num = 1;
	attr.qp_access_flags = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	err = ib_modify_qp(qp, &attr, IB_QP_STATE | IB_QP_PKEY_INDEX | IB_QP_PORT |
			   IB_QP_ACCESS_FLAGS);
	if (err)
		goto bad_modify;
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IB_QPS_RTR;
	attr.path_mtu = IB_MTU_1024;
	attr.dest_qp_num = qp->qp_num;
	attr.max_dest_rd_atomic = 1;
	attr.min_rnr_timer = 12;
	attr.ah_attr.type = RDMA_AH_ATTR_TYPE_ROCE;
	rdma_ah_set_port_num(&attr.ah_attr, 1);
	rdma_ah_set_grh(&attr.ah_attr, (union ib_gid *)&ga->gid, 0, ga->index, 64, 0);
	err = ib_modify_qp(qp, &attr, IB_QP_STATE | IB_QP_AV | IB_QP_PATH_MTU | IB_QP_DEST_QPN |
			   IB_QP_RQ_PSN | IB_QP_MAX_DEST_RD_ATOMIC | IB_QP_MIN_RNR_TIMER);
	if (err)
		goto bad_modify;
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IB_QPS_RTS;
	attr.timeout = 14;
	attr.retry_cnt = 7;
	attr.rnr_retry = 7;
	attr.max_rd_atomic = 1;
	err = ib_modify_qp(qp, &attr, IB_QP_STATE | IB_QP_TIMEOUT | IB_QP_RETRY_CNT |
			   IB_QP_RNR_RETRY | IB_QP_SQ_PSN | IB_QP_MAX_QP_RD_ATOMIC);
	if (err)
		goto bad_modify;

	mr = ib_alloc_mr(pd, IB_MR_TYPE_MEM_REG, 4);
	if (IS_ERR(mr)) {
		err = PTR_ERR(mr);
		mr = NULL;
		pr_err("vrdma_selftest: FAIL: alloc_mr %d\n", err);
		goto out;
	}
	sg_init_one(&sg, dst, 8192);
	err = fr_map(dev, mr, &sg, "8 KiB");
	if (err)
		goto out;
	prng_fill(src, 8192, 0x9e3779b97f4a7c15ULL);
	src_dma = ib_dma_map_single(dev, src, 8192, DMA_TO_DEVICE);
	reg.wr.opcode = IB_WR_REG_MR;
	reg.wr.send_flags = IB_SEND_SIGNALED;
	reg.mr = mr;
	reg.key = mr->rkey;
	reg.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	sge.addr = src_dma;
	sge.length = 6000;
	sge.lkey = pd->local_dma_lkey;
	wr.wr.opcode = IB_WR_RDMA_WRITE;
	wr.wr.send_flags = IB_SEND_SIGNALED;
	wr.wr.sg_list = &sge;
	wr.wr.num_sge = 1;
	wr.remote_addr = mr->iova + 1000;
	wr.rkey = mr->rkey;
	reg.wr.next = &wr.wr;
	err = post_reg_write(qp, cq, &reg);
	if (err)
		goto out;
	if (memcmp(dst + 1000, src, 6000) || dst[999] || dst[7000]) {
		pr_err("vrdma_selftest: FAIL: the bytes written through the fast-reg MR differ\n");
		err = -EIO;
		goto out;
	}
	inv.opcode = IB_WR_LOCAL_INV;
	inv.send_flags = IB_SEND_SIGNALED;
	inv.ex.invalidate_rkey = mr->rkey;
	err = ib_post_send(qp, &inv, &bad);
	if (!err)
		err = poll_one(cq, IB_WC_LOCAL_INV);
	if (err)
		goto out;

	/* zero-based: IOVA 0 names dst + 0x456 (kmalloc(8192) is 8 KiB aligned) */
	memset(dst, 0, 8192);
	sg_init_one(&sg2, dst + 0x456, 4096);
	err = fr_map(dev, mr, &sg2, "offset 0x456");
	if (err)
		goto out;
	mr->iova = 0;
	reg.key = mr->rkey;
	sge.length = 3000;
	wr.remote_addr = 100;
	wr.rkey = mr->rkey;
	err = post_reg_write(qp, cq, &reg);
	if (err)
		goto out;
	if (memcmp(dst + 0x456 + 100, src, 3000) || dst[0x456 + 99] || dst[0x456 + 3100]) {
		pr_err("vrdma_selftest: FAIL: a zero-based fast-reg MR at page offset 0x456 maps the wrong bytes\n");
		err = -EIO;
		goto out;
	}
	inv.ex.invalidate_rkey = mr->rkey;
	err = ib_post_send(qp, &inv, &bad);
	if (!err)
		err = poll_one(cq, IB_WC_LOCAL_INV);
	if (!err)
		pr_info("vrdma_selftest: PASS (%s: REG_MR of an 8 KiB kmalloc buffer, 6000-byte RDMA WRITE through rkey %#x, LOCAL_INV; zero-based REG_MR at page offset 0x456)\n",
			devname, mr->rkey);
	goto out;

bad_modify:
	pr_err("vrdma_selftest: FAIL: modify_qp %d\n", err);
out:
	if (mr)
		ib_dereg_mr(mr);
	if (qp)
		ib_destroy_qp(qp);
	if (ga)
		rdma_put_gid_attr(ga);
	if (!IS_ERR_OR_NULL(cq))
		ib_free_cq(cq);
	if (!IS_ERR_OR_NULL(pd))
		ib_dealloc_pd(pd);
	kfree(src);
	kfree(dst);
	return err;
}

static int __init st_init(void)
{
	struct ib_device *dev = ib_device_get_by_name(devname, RDMA_DRIVER_UNKNOWN);

	if (!dev) {
		pr_err("vrdma_selftest: FAIL: no device %s\n", devname);
		return -ENODEV;
	}
	run(dev);
	ib_device_put(dev);
	return -EAGAIN;	/* ran; nothing to keep loaded */
}

module_init(st_init);
MODULE_LICENSE("Dual BSD/GPL");
MODULE_DESCRIPTION("kernel-verbs self test for virtio_rdma (fast registration)");
