//! The driver structs the CUDA backend passes to the driver, each built field
//! by field by one small function.
//!
//! None is zero-initialised (clippy.toml forbids it): several hold C enums whose first
//! value is 1 (`CUmemorytype`), and zero-initialising such a struct panics
//! without unwinding, which aborts the host process before CUDA is called.
//! These functions call no CUDA, so the unit tests below run them on every
//! machine (CI included); the driver contract suite runs the calls that use
//! them on a GPU.

use std::ffi::c_void;

use cudarc::driver::sys;

use crate::driver::{AccessMode, DevicePtr};

/// A device location (`CUmemLocation`) for device `device`.
pub(super) fn device_location(device: sys::CUdevice) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: device,
    }
}

/// The allocation properties of every `cuMemCreate` and granularity query:
/// pinned device memory on `device`, exportable as a POSIX file descriptor
/// when `shareable`.
pub(super) fn alloc_prop(device: sys::CUdevice, shareable: bool) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: if shareable {
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        } else {
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
        },
        location: device_location(device),
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// The access flag for `mode`.
pub(super) fn access_flags(mode: AccessMode) -> sys::CUmemAccess_flags {
    match mode {
        AccessMode::None => sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE,
        AccessMode::Read => sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ,
        AccessMode::ReadWrite => sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    }
}

/// One `cuMemSetAccess` descriptor: `mode` for device `device`.
pub(super) fn access_desc(device: sys::CUdevice, mode: AccessMode) -> sys::CUmemAccessDesc {
    sys::CUmemAccessDesc {
        location: device_location(device),
        flags: access_flags(mode),
    }
}

/// A 2D copy from host memory to device memory: `height` rows of `width`
/// bytes, rows `src_pitch` apart at `src` and `dst_pitch` apart at `dst`.
pub(super) fn memcpy_2d_htod(
    dst: DevicePtr,
    dst_pitch: usize,
    src: *const u8,
    src_pitch: usize,
    width: usize,
    height: usize,
) -> sys::CUDA_MEMCPY2D {
    sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_HOST,
        srcHost: src as *const c_void,
        srcDevice: 0,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: width,
        Height: height,
    }
}

/// A 2D copy within device memory: `height` rows of `width` bytes, rows
/// `src_pitch` apart at `src` and `dst_pitch` apart at `dst`.
pub(super) fn memcpy_2d_dtod(
    dst: DevicePtr,
    dst_pitch: usize,
    src: DevicePtr,
    src_pitch: usize,
    width: usize,
    height: usize,
) -> sys::CUDA_MEMCPY2D {
    sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: width,
        Height: height,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memcpy_2d_htod_names_both_sides() {
        let host = [0u8; 64];
        let p = memcpy_2d_htod(0x1000, 256, host.as_ptr(), 64, 48, 3);
        assert_eq!(p.srcMemoryType, sys::CUmemorytype::CU_MEMORYTYPE_HOST);
        assert_eq!(p.dstMemoryType, sys::CUmemorytype::CU_MEMORYTYPE_DEVICE);
        assert_eq!(p.srcHost, host.as_ptr() as *const c_void);
        assert_eq!(p.dstDevice, 0x1000);
        assert_eq!((p.srcPitch, p.dstPitch), (64, 256));
        assert_eq!((p.WidthInBytes, p.Height), (48, 3));
        assert_eq!((p.srcXInBytes, p.srcY, p.dstXInBytes, p.dstY), (0, 0, 0, 0));
        assert!(p.srcArray.is_null() && p.dstArray.is_null() && p.dstHost.is_null());
        assert_eq!(p.srcDevice, 0);
    }

    #[test]
    fn memcpy_2d_dtod_names_device_on_both_sides() {
        let p = memcpy_2d_dtod(0x1000, 256, 0x9000, 64, 48, 3);
        assert_eq!(p.srcMemoryType, sys::CUmemorytype::CU_MEMORYTYPE_DEVICE);
        assert_eq!(p.dstMemoryType, sys::CUmemorytype::CU_MEMORYTYPE_DEVICE);
        assert_eq!((p.srcDevice, p.dstDevice), (0x9000, 0x1000));
        assert_eq!((p.srcPitch, p.dstPitch), (64, 256));
        assert_eq!((p.WidthInBytes, p.Height), (48, 3));
        assert_eq!((p.srcXInBytes, p.srcY, p.dstXInBytes, p.dstY), (0, 0, 0, 0));
        assert!(p.srcArray.is_null() && p.dstArray.is_null());
        assert!(p.srcHost.is_null() && p.dstHost.is_null());
    }

    #[test]
    fn alloc_prop_is_pinned_on_the_device() {
        for shareable in [false, true] {
            let p = alloc_prop(3, shareable);
            assert_eq!(
                p.type_,
                sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED
            );
            assert_eq!(
                p.location.type_,
                sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE
            );
            assert_eq!(p.location.id, 3);
            assert_eq!(
                p.requestedHandleTypes,
                if shareable {
                    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                } else {
                    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
                }
            );
            assert!(p.win32HandleMetaData.is_null());
            assert_eq!(p.allocFlags.gpuDirectRDMACapable, 0);
        }
    }

    #[test]
    fn access_desc_maps_every_mode() {
        let cases = [
            (
                AccessMode::None,
                sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE,
            ),
            (
                AccessMode::Read,
                sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ,
            ),
            (
                AccessMode::ReadWrite,
                sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            ),
        ];
        for (mode, flags) in cases {
            let d = access_desc(1, mode);
            assert_eq!(d.flags, flags);
            assert_eq!(d.location.id, 1);
            assert_eq!(
                d.location.type_,
                sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE
            );
        }
    }
}
