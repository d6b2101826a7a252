//! The iWARP CM over soft devices (`softiwarp::cm::iwcm::SoftProvider`): interop shapes and
//! a seeded connect/accept/destroy stress.

#[path = "../support/mod.rs"]
mod support;

mod interop;
mod stress;
