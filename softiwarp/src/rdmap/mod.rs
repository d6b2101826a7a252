//! The sans-IO per-QP RDMAP/DDP engine and its binding to a connection.

pub mod binding;
pub mod engine;
