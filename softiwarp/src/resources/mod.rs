//! State shared by application threads and the engine thread: the STag table, the
//! completion queues and the event queues.

pub mod completion_queue;
pub(crate) mod event_queue;
pub mod stag_table;
