//! A host-side RoCEv2 peer: the rxe-core engine on a UDP socket, plus the out-of-band (TCP)
//! exchanges of the stock rdma-core example programs, so that unmodified `ibv_*_pingpong` in a
//! VM running Linux `rdma_rxe` can be the other end.

pub mod oob;
pub mod peer;
pub mod perftest;
pub mod pingpong;
pub mod udp;
