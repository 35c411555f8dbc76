//! The backup codec on the device: the kernels of `kernels/codec.cu`,
//! committed as `codec.ptx` beside this file (built by scripts/build-ptx.sh
//! on a machine with nvcc), loaded once per driver.
//!
//! A build whose `codec.ptx` is empty has no codec kernels: every codec call
//! returns [`Error::Unsupported`] naming the file, and nothing else changes.

use std::ffi::{c_void, CStr};

use super::{cu, CudaDriver};
use crate::codec::format::{self, Layout, BLOCK_BYTES, SLOT_BYTES};
use crate::driver::{DevicePtr, StreamId};
use crate::error::{Error, Result};

/// The kernels' PTX, NUL-terminated for `cuModuleLoadData`.
const PTX: &CStr =
    match CStr::from_bytes_with_nul(concat!(include_str!("codec.ptx"), "\0").as_bytes()) {
        Ok(ptx) => ptx,
        Err(_) => panic!("codec.ptx holds a NUL byte"),
    };
/// Threads per block: the kernels are written for exactly this many.
const THREADS: u32 = 256;
/// Most thread blocks launched; each loops over codec blocks.
const MAX_BLOCKS: u64 = 65_535;

/// The loaded module and its four functions.
#[derive(Debug)]
pub(super) struct CodecKernels {
    pub(super) module: cu::Module,
    encode: cu::Function,
    index: cu::Function,
    pack: cu::Function,
    decode: cu::Function,
}

fn grid(blocks: usize) -> u32 {
    (blocks as u64).clamp(1, MAX_BLOCKS) as u32
}

impl CudaDriver {
    fn codec_kernels(&self) -> Result<&CodecKernels> {
        if PTX.to_bytes().iter().all(u8::is_ascii_whitespace) {
            return Err(Error::Unsupported(
                "the backup codec's GPU kernels are not in this build: \
                 src/driver/cuda/codec.ptx is empty (run scripts/build-ptx.sh on a machine \
                 with nvcc and rebuild)"
                    .into(),
            ));
        }
        let loaded = self.codec_kernels.get_or_init(|| {
            // The context is current: callers bind first.
            let module = cu::module_load_data(PTX).map_err(|e| Error::from(e).to_string())?;
            let f = |name: &CStr| {
                cu::module_get_function(&module, name).map_err(|e| Error::from(e).to_string())
            };
            Ok(CodecKernels {
                encode: f(c"vmmw_codec_encode")?,
                index: f(c"vmmw_codec_index")?,
                pack: f(c"vmmw_codec_pack")?,
                decode: f(c"vmmw_codec_decode")?,
                module,
            })
        });
        loaded.as_ref().map_err(|e| Error::Driver {
            call: "cuModuleLoadData",
            code: -1,
            name: "backup-codec kernels failed to load".into(),
            detail: format!(": {e}"),
        })
    }

    /// Encode on the device; see [`crate::driver::Driver::codec_encode`].
    /// The caller has bound the context.
    ///
    /// # Safety
    /// As `Driver::codec_encode`.
    pub(super) unsafe fn codec_encode_on_device(
        &self,
        src: DevicePtr,
        len: usize,
        layout: Layout,
        dst: DevicePtr,
        scratch: DevicePtr,
        stream: StreamId,
    ) -> Result<usize> {
        let nb = format::block_count(len);
        let sizes = scratch + (nb * SLOT_BYTES) as u64;
        let frame_len_at = sizes + (4 * nb).next_multiple_of(8) as u64;
        // SAFETY: the caller's contract; the length word lies in the
        // scratch, after the slots and sizes (encode_scratch_bytes counts it).
        unsafe { self.codec_encode_queue(src, len, layout, dst, scratch, frame_len_at, stream) }?;
        let s = Self::stream(stream);
        cu::stream_synchronize(s)?;
        let mut frame_len = [0u64; 1];
        // SAFETY: u64 takes any bit pattern; the kernels have finished.
        unsafe { cu::memcpy_dtoh(&mut frame_len, frame_len_at) }?;
        let n = frame_len[0] as usize;
        if n > format::max_frame_bytes(len) {
            return Err(Error::InvalidState(format!(
                "vmmw_codec_index reports a frame of {n} bytes for {len} raw bytes, over the \
                 largest possible ({}); the codec PTX does not match this build",
                format::max_frame_bytes(len)
            )));
        }
        Ok(n)
    }

    /// Queue the encode's three launches on `stream`; the frame's length
    /// lands at `frame_len_at`. The caller has bound the context.
    ///
    /// # Safety
    /// As `Driver::codec_encode_async`.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn codec_encode_queue(
        &self,
        src: DevicePtr,
        len: usize,
        layout: Layout,
        dst: DevicePtr,
        scratch: DevicePtr,
        frame_len_at: DevicePtr,
        stream: StreamId,
    ) -> Result<()> {
        let k = self.codec_kernels()?;
        let nb = format::block_count(len);
        let s = Self::stream(stream);
        let sizes = scratch + (nb * SLOT_BYTES) as u64;
        let (mut p_src, mut p_len, mut p_width) = (src, len as u64, layout.width() as u32);
        let (mut p_slots, mut p_sizes, mut p_dst, mut p_flen) = (scratch, sizes, dst, frame_len_at);
        let mut encode = [
            &mut p_src as *mut u64 as *mut c_void,
            &mut p_len as *mut u64 as *mut c_void,
            &mut p_width as *mut u32 as *mut c_void,
            &mut p_slots as *mut u64 as *mut c_void,
            &mut p_sizes as *mut u64 as *mut c_void,
        ];
        // SAFETY: vmmw_codec_encode takes (const u8*, u64, u32, u8*, u32*),
        // which `encode` points at; the ranges are the caller's contract and
        // the scratch holds a slot per block and the sizes.
        unsafe { cu::launch_kernel(k.encode, grid(nb), THREADS, s, &mut encode) }
            .map_err(|e| e.detail(|| format!("vmmw_codec_encode over {len} bytes")))?;
        let mut index = [
            &mut p_sizes as *mut u64 as *mut c_void,
            &mut p_len as *mut u64 as *mut c_void,
            &mut p_width as *mut u32 as *mut c_void,
            &mut p_dst as *mut u64 as *mut c_void,
            &mut p_flen as *mut u64 as *mut c_void,
        ];
        // SAFETY: vmmw_codec_index takes (const u32*, u64, u32, u8*, u64*);
        // it writes the header and index inside the frame's room and the
        // length inside the scratch.
        unsafe { cu::launch_kernel(k.index, 1, THREADS, s, &mut index) }
            .map_err(|e| e.detail(|| format!("vmmw_codec_index over {nb} blocks")))?;
        let mut pack = [
            &mut p_slots as *mut u64 as *mut c_void,
            &mut p_sizes as *mut u64 as *mut c_void,
            &mut p_len as *mut u64 as *mut c_void,
            &mut p_dst as *mut u64 as *mut c_void,
        ];
        // SAFETY: vmmw_codec_pack takes (const u8*, const u32*, u64, u8*);
        // every block lands inside the frame's room (sizes sum to at most
        // the largest frame).
        unsafe { cu::launch_kernel(k.pack, grid(nb), THREADS, s, &mut pack) }
            .map_err(|e| e.detail(|| format!("vmmw_codec_pack over {nb} blocks")))
    }

    /// Queue a decode on the device; see
    /// [`crate::driver::Driver::codec_decode_async`]. The caller has bound
    /// the context.
    ///
    /// # Safety
    /// As `Driver::codec_decode_async`.
    pub(super) unsafe fn codec_decode_on_device(
        &self,
        frame: DevicePtr,
        frame_len: usize,
        dst: DevicePtr,
        raw_len: usize,
        status: DevicePtr,
        stream: StreamId,
    ) -> Result<()> {
        let k = self.codec_kernels()?;
        let nb = raw_len.div_ceil(BLOCK_BYTES);
        let (mut p_frame, mut p_flen, mut p_dst, mut p_len, mut p_status) =
            (frame, frame_len as u64, dst, raw_len as u64, status);
        let mut params = [
            &mut p_frame as *mut u64 as *mut c_void,
            &mut p_flen as *mut u64 as *mut c_void,
            &mut p_dst as *mut u64 as *mut c_void,
            &mut p_len as *mut u64 as *mut c_void,
            &mut p_status as *mut u64 as *mut c_void,
        ];
        // SAFETY: vmmw_codec_decode takes (const u8*, u64, u8*, u64, u32*),
        // which `params` points at; it reads only inside the frame (every
        // offset is checked against frame_len) and writes only the output
        // and the status word, the caller's contract.
        unsafe {
            cu::launch_kernel(
                k.decode,
                grid(nb),
                THREADS,
                Self::stream(stream),
                &mut params,
            )
        }
        .map_err(|e| e.detail(|| format!("vmmw_codec_decode of {raw_len} bytes")))
    }
}
