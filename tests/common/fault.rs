//! The driver steps the fault tests fail one at a time: every step a
//! single-device alloc, free, trim, sleep, wake or load takes (peer copies
//! have their own tests in `replica_wake.rs` and `loader_multi.rs`).

use vmmweights::driver::fault::FaultOp;

/// Every single-device step, file reads included.
pub const OPS: [FaultOp; 14] = [
    FaultOp::Reserve,
    FaultOp::Create,
    FaultOp::Map,
    FaultOp::SetAccess,
    FaultOp::Unmap,
    FaultOp::Release,
    FaultOp::CopyHtod,
    FaultOp::CopyDtoh,
    FaultOp::Memset,
    FaultOp::Convert,
    FaultOp::HostRegister,
    FaultOp::Synchronize,
    FaultOp::FileRead,
    FaultOp::Codec,
];
