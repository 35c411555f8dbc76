//! What a sender sends: named tensors whose bytes lie in host or device
//! memory of the sending process.

use std::time::Duration;

use super::bucket::{check_announced, AnnouncedTensor};
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

/// What a sender announces of `tensors` before any bucket, checked as a
/// receiver checks it, with each tensor's bytes.
pub fn announce(tensors: &[SendTensor<'_>]) -> Result<(Vec<AnnouncedTensor>, Vec<u64>)> {
    let sizes = tensors
        .iter()
        .map(SendTensor::checked_bytes)
        .collect::<Result<Vec<u64>>>()?;
    let announced: Vec<AnnouncedTensor> = tensors
        .iter()
        .zip(&sizes)
        .map(|(t, &bytes)| AnnouncedTensor {
            name: t.name.clone(),
            dtype: t.dtype.name().to_string(),
            shape: t.shape.iter().map(|&d| d as u64).collect(),
            bytes,
        })
        .collect();
    check_announced(&announced)?;
    Ok((announced, sizes))
}

/// Run `f` over the tensors of a resident update source (whole tensors of
/// this process, [`crate::update::Tensors`]) as a sender takes them, then
/// hand the source's batch back.
pub fn with_source<R>(
    src: &mut dyn crate::update::Source,
    f: impl FnOnce(&[SendTensor<'_>]) -> Result<R>,
) -> Result<R> {
    use crate::update::Bytes;
    if !src.resident() {
        return Err(Error::InvalidArgument(
            "a sender sends tensors of this process (a resident source such as update::Tensors)"
                .into(),
        ));
    }
    let manifest = src.manifest().to_vec();
    let batch = src.next()?.unwrap_or_default();
    let mut at: Vec<Option<Bytes>> = vec![None; manifest.len()];
    for p in &batch.pieces {
        if p.offset != 0 || Some(p.len) != manifest[p.tensor].bytes() {
            let _ = src.release(batch.id);
            return Err(Error::InvalidArgument(format!(
                "tensor `{}`: a resident source delivers whole tensors",
                manifest[p.tensor].name.escape_debug()
            )));
        }
        at[p.tensor] = Some(p.at);
    }
    let tensors: Vec<SendTensor<'_>> = manifest
        .iter()
        .zip(&at)
        .map(|(t, a)| SendTensor {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
            data: match a {
                Some(Bytes::Device(p)) => SendData::Device(*p),
                // SAFETY: the source vouches its pieces stay readable until the
                // batch is released, which happens after `f` returns.
                Some(Bytes::Host(p)) => SendData::Host(unsafe {
                    std::slice::from_raw_parts(*p, t.bytes().unwrap_or(0) as usize)
                }),
                // An empty tensor has no piece.
                None => SendData::Host(&[]),
            },
        })
        .collect();
    let r = f(&tensors);
    let released = src.release(batch.id);
    let r = r?;
    released?;
    Ok(r)
}

/// Check the receiver count of a send to `path`: 1 to
/// [`super::MAX_RECEIVERS`], before anything is served or waited for.
pub(super) fn check_receivers(path: &std::path::Path, receivers: usize) -> Result<()> {
    if receivers == 0 || receivers > super::MAX_RECEIVERS {
        return Err(Error::InvalidArgument(format!(
            "update sender {}: {receivers} receivers asked; at least one, at most {} receivers",
            path.display(),
            super::MAX_RECEIVERS
        )));
    }
    Ok(())
}

/// What one send did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SendReport {
    /// The receiver's version after the update.
    pub version: u64,
    /// Buckets sent.
    pub buckets: u64,
    /// Bytes sent.
    pub bytes: u64,
    /// From accepting the receiver to its `Attached` (the one ring handshake).
    pub setup: Duration,
    /// The whole send, setup included.
    pub total: Duration,
}
