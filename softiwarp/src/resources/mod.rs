//! State shared by application threads and the engine thread: the STag table and the
//! completion queues.

pub mod completion_queue;
pub mod stag_table;
