//! State shared by application threads and the engine thread: the STag table of PDs and
//! memory regions ([`stag_table`], siw_mem.c), the completion queues
//! ([`completion_queue`], siw_cq.c), the shared receive queues ([`shared_receive_queue`],
//! siw's SRQ), and the queues that carry events out of the engine
//! with how they end ([`DeviceEnd`](crate::DeviceEnd)).
//!
//! **Room.** Plain shared data behind short locks, with the checks that go with it (the
//! STag checks of RFC 5040/5041, CQ overflow); no threads, and no lock held across a call
//! out. It touches `link` only (the reason a device is gone). Public for the crate's
//! tests and benchmarks.

pub mod completion_queue;
pub(crate) mod event_queue;
pub mod shared_receive_queue;
pub mod stag_table;
pub mod user_memory;
