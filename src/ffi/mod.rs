//! The C ABI.

pub mod torch;
