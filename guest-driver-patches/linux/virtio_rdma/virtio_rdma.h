/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * virtio_rdma: a driver for the virtio-rdma device (virtio ID 42), a RoCEv2 soft-RDMA NIC
 * whose transport runs in the device. Queue rings live in guest memory in the Linux rxe
 * user ABI, so the driver registers as RDMA_DRIVER_RXE and unmodified librxe binds to it.
 */
#ifndef VIRTIO_RDMA_H
#define VIRTIO_RDMA_H

#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/netdevice.h>
#include <linux/spinlock.h>
#include <linux/virtio.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>
#include <rdma/ib_umem.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_user_rxe.h>

#include "virtio_rdma_abi.h"

struct vrdma_dev {
	struct ib_device ib;
	struct virtio_device *vdev;
	struct virtqueue *ctrl_vq;
	struct virtqueue *db_vq;
	struct virtqueue *ev_vq;

	/* the config space as read at probe (little-endian fields) */
	struct vrdma_config cfg;
	u8 mac[ETH_ALEN];
	/* the GIDs the device's transport sends from (QUERY_GID_SOURCES) */
	struct vrdma_resp_gid_sources sources;
	/* what query_device answers (ib_core zeroes dev->ib.attrs before asking) */
	struct ib_device_attr attrs;

	/* control queue: one command at a time */
	struct mutex ctrl_lock;
	struct completion ctrl_done;
	void *ctrl_req;
	void *ctrl_resp;
	u64 seq;
	bool broken;

	/* doorbell queue */
	spinlock_t db_lock;
	struct vrdma_doorbell *db_bufs;
	u16 *db_free;
	unsigned int db_num;
	unsigned int db_nfree;
	struct list_head db_backlog;

	/* event queue; ev_lock also guards object lookups from event context */
	spinlock_t ev_lock;
	struct vrdma_event *ev_bufs;
	unsigned int ev_num;
	struct work_struct port_work;
	bool reprobing; /* a re-probe after DEVICE_FATAL is scheduled */
	/* DEVICE_FATAL: the device has lost every object and completes nothing; the driver
	 * completes kernel QPs' outstanding work requests itself (vrdma_poll_cq) */
	bool dead;
	unsigned long port_events; /* bit n: ib_event_type n pending for the port */

	struct xarray cqs;
	struct xarray qps;
	struct xarray srqs;
	/* on-demand-paging MRs by key index (lkey >> 8), and the queue their faults run on */
	struct xarray odp_mrs;
	struct workqueue_struct *odp_wq;

	/* netdev pairing by MAC: ib_core reads it through the get_netdev op */
	struct notifier_block nb;
	struct net_device __rcu *netdev; /* written under rtnl */
	struct work_struct rescan_work;   /* GIDs of a netdev paired after registration */
	bool registered;
	bool nb_registered;
};

static inline struct vrdma_dev *to_vdev(struct ib_device *ib)
{
	return container_of(ib, struct vrdma_dev, ib);
}

struct vrdma_ucontext {
	struct ib_ucontext ibuc;
};

struct vrdma_mmap_entry {
	struct rdma_user_mmap_entry rdma;
	void *buf;
};

/* one rxe_queue_buf ring */
struct vrdma_queue {
	struct rxe_queue_buf *buf;	/* vmalloc_user */
	size_t size;			/* bytes, page aligned */
	u32 num_slots;
	u32 log2;
	struct vrdma_mmap_entry *mmap;	/* user rings: owns buf */
};

struct vrdma_pd {
	struct ib_pd ibpd;
	u32 pdn;
};

struct vrdma_cq {
	struct ib_cq ibcq;
	u32 cqn;
	bool is_user;
	bool armed;		/* req_notify_cq since the last completion event */
	bool resizing;		/* RESIZE_CQ in flight: kernel pollers keep off the ring */
	spinlock_t lock;	/* kernel CQs: poll vs. poll */
	struct vrdma_queue q;
};

struct vrdma_srq {
	struct ib_srq ibsrq;
	u32 srqn;
	bool is_user;
	u32 max_wr;
	u32 max_sge;
	bool resizing;		/* RESIZE_SRQ in flight: kernel posters keep off the ring */
	spinlock_t lock;
	struct vrdma_queue q;
};

struct vrdma_qp {
	struct ib_qp ibqp;
	u32 qpn;
	bool is_user;
	struct ib_qp_cap cap;
	enum ib_sig_type sq_sig_type;
	enum ib_qp_state state;	/* as last set by modify_qp (the device may move it to ERR) */
	spinlock_t sq_lock;
	spinlock_t rq_lock;
	struct vrdma_queue sq;
	struct vrdma_queue rq;
	bool has_rq;
	/* doorbell backlog, under dev->db_lock */
	struct list_head db_node;
	bool db_pending;
};

/* librxe's create_qp_ex payload for an RSS QP (guest-driver-patches/rdma-core 0009) */
struct vrdma_create_qp_rss {
	__aligned_u64 rx_hash_fields_mask;
	__u8 rx_hash_function;
	__u8 rx_key_len;
	__u8 reserved[6];
	__u8 rx_hash_key[128];
};

/* create_wq's answer to librxe: where the work queue's receive ring is */
struct vrdma_create_wq_resp {
	struct mminfo mi;
};

struct vrdma_xrcd {
	struct ib_xrcd ibxrcd;
	u32 xrcdn;
};

struct vrdma_ah {
	struct ib_ah ibah;
	u32 ah_num;	/* 0: kernel AH, the AV goes inline into each WQE */
	struct vrdma_ah_attr av;
	u8 network_type;
};

struct vrdma_mr {
	struct ib_mr ibmr;
	struct ib_umem *umem;
	/* the key the device knows the MR by (fast-reg MRs change it with each REG_MR) */
	u32 dev_key;
	/* fast-reg MRs: one page of page GPAs (levels 0), read when a REG_MR WQE is taken */
	__le64 *pages;
	u32 max_pages;
	u32 npages;
	/* where the first mapped byte lies in pages[0], kept apart from ibmr.iova (a ULP may
	 * change the IOVA after ib_map_mr_sg, e.g. ib_map_mr_sg_zbva sets it to 0) */
	u32 page_offset;
	/* an on-demand-paging MR (caps ODP): umem is an ib_umem_odp, pages mapped on faults */
	bool odp;
	/* user MRs: the access flags they were registered with (ibv_rereg_mr keeps them) */
	int access;
	/* an implicit ODP MR: umem is the implicit root; its children (2 MiB each, made as
	 * pages are faulted in) by va >> VRDMA_ODP_CHILD_SHIFT */
	bool implicit;
	struct xarray children;
};

/* a page list for a command: the list pages it holds (freed after the command) */
struct vrdma_pl {
	struct vrdma_page_list desc;
	void **pages;
	unsigned int npages;
};

struct vrdma_mw {
	struct ib_mw ibmw;
};

/* virtio_rdma_main.c */
struct net_device *vrdma_get_netdev(struct ib_device *ibdev, u32 port);
int vrdma_cmd(struct vrdma_dev *dev, u32 opcode, const void *cmd, size_t cmd_len,
	      void *resp, size_t resp_len);
int vrdma_cmd_handle(struct vrdma_dev *dev, u32 opcode, u32 handle);
void vrdma_ring_doorbell(struct vrdma_dev *dev, u32 kind, u32 object, u32 index,
			 struct vrdma_qp *qp);
void vrdma_db_forget(struct vrdma_dev *dev, struct vrdma_qp *qp);

/* virtio_rdma_verbs.c */
extern const struct ib_device_ops vrdma_dev_ops;
extern const struct ib_device_ops vrdma_hw_stats_ops;
extern const struct ib_device_ops vrdma_xrc_ops;
extern const struct ib_device_ops vrdma_raw_ops;
extern const struct ib_device_ops vrdma_rss_ops;
int vrdma_create_xrc_tgt(struct vrdma_qp *qp, struct ib_qp_init_attr *init);
void vrdma_kick_cqs(struct vrdma_dev *dev);
void vrdma_flush_user(struct vrdma_dev *dev);
void vrdma_init_attrs(struct vrdma_dev *dev);
void vrdma_pl_free(struct vrdma_pl *pl);
/* rings in the rxe ABI, as the verbs make them (virtio_rdma_verbs.c) */
int vrdma_queue_alloc(struct vrdma_queue *q, u32 num_slots, u32 elem_size);
void vrdma_queue_free(struct vrdma_queue *q);
int vrdma_queue_describe(struct vrdma_dev *dev, struct vrdma_queue *q, struct vrdma_pl *pl,
			 struct vrdma_queue_desc *d);
int vrdma_queue_mmap(struct ib_udata *udata, struct vrdma_queue *q, struct mminfo *mi);
int vrdma_create_rss_qp(struct vrdma_qp *qp, struct ib_qp_init_attr *init,
			struct ib_udata *udata);
int vrdma_pl_build(struct vrdma_dev *dev, struct vrdma_pl *pl, u32 n,
		   u64 (*next)(void *ctx), void *ctx);

/* virtio_rdma_odp.c */
void vrdma_odp_attrs(struct vrdma_dev *dev, struct ib_device_attr *a);
struct ib_mr *vrdma_reg_odp_mr(struct ib_pd *ibpd, u32 pdn, u64 start, u64 length, u64 iova,
			       int access);
void vrdma_odp_forget(struct vrdma_dev *dev, struct vrdma_mr *mr);
void vrdma_odp_fault(struct vrdma_dev *dev, u32 lkey, u64 page, bool write);
int vrdma_advise_mr(struct ib_pd *pd, enum ib_uverbs_advise_mr_advice advice, u32 flags,
		    struct ib_sge *sg_list, u32 num_sge, struct uverbs_attr_bundle *attrs);
int vrdma_odp_init(struct vrdma_dev *dev);
void vrdma_odp_fini(struct vrdma_dev *dev);

#endif
