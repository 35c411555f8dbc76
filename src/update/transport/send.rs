//! What a sender sends: named tensors whose bytes lie in host or device
//! memory of the sending process.

use crate::driver::DevicePtr;
use crate::error::{Error, Result};
use crate::loader::dtype::Dtype;

/// Where the bytes of one tensor to send are, in the sender's process.
#[derive(Debug, Clone, Copy)]
pub enum SendData<'a> {
    /// Host memory.
    Host(&'a [u8]),
    /// Device memory on the sender pool's device, `len` bytes at the address.
    Device(DevicePtr),
}

/// One tensor to send.
#[derive(Debug, Clone)]
pub struct SendTensor<'a> {
    /// Checkpoint name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape of the full tensor.
    pub shape: Vec<usize>,
    /// Its bytes.
    pub data: SendData<'a>,
}

impl SendTensor<'_> {
    /// Bytes of the full tensor, checked against the host slice's length.
    pub fn checked_bytes(&self) -> Result<u64> {
        let b = crate::loader::registry::byte_size(&self.shape, self.dtype).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "tensor `{}`: shape {:?} overflows",
                self.name.escape_debug(),
                self.shape
            ))
        })?;
        if let SendData::Host(h) = self.data {
            if h.len() != b {
                return Err(Error::InvalidArgument(format!(
                    "tensor `{}`: {} bytes given, shape {:?} of {} is {b}",
                    self.name.escape_debug(),
                    h.len(),
                    self.shape,
                    self.dtype.name()
                )));
            }
        }
        Ok(b as u64)
    }
}
