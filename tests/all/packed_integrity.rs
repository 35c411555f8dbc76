//! Packed checkpoints that must be refused or must fail loudly
//! (docs/PACKED.md): a corrupt frame fails the load naming the file, the
//! tensor and the frame, on every backend; hostile headers (truncated,
//! flipped, forged behind a valid checksum) are refused at open; a Reload
//! wake with content checks refuses frames rewritten in place; and the C
//! API's refusals. The round trips and loads are in `packed.rs`.

use crate::common;
use crate::packed::{every_dtype, opts, same_files, write_raw_safetensors, FRAME};

use std::path::Path;

use common::backend::on_each_backend;
use common::loader::*;
use vmmweights::codec::checksum::block_checksum;
use vmmweights::loader::pack::{pack, unpack};
use vmmweights::loader::packed::format::{self as pf, PREAMBLE_BYTES};
use vmmweights::loader::*;
use vmmweights::sleep::Policy;
use vmmweights::{tag, Pool, PoolConfig};

/// The packed file of one safetensors file, and its parsed index.
fn packed_one(dir: &Path) -> (std::path::PathBuf, Vec<u8>, pf::Index) {
    let src = dir.join("one.safetensors");
    write_raw_safetensors(&src, &every_dtype(), 3);
    let p = dir.join("one.packed");
    pack(&src, &p, &opts(None), None, None).unwrap();
    let bytes = std::fs::read(&p).unwrap();
    let ix = pf::parse(&bytes).unwrap();
    (p, bytes, ix)
}

#[test]
fn a_corrupt_frame_fails_the_load_naming_file_tensor_and_frame() {
    let dir = tempfile::tempdir().unwrap();
    let (p, mut bytes, ix) = packed_one(dir.path());
    let bf = Checkpoint::open(&p).unwrap().tensors["t.bf16"].clone();
    let piece = ix.pieces[ix.piece_at(bf.offset).unwrap()];
    let f = ix.frames[piece.first_frame as usize + 1];
    // A byte of the second frame's body (past its header and index).
    bytes[(f.at + f.len / 2) as usize] ^= 0x5A;
    std::fs::write(&p, &bytes).unwrap();
    on_each_backend(
        "a_corrupt_frame_fails_the_load_naming_file_tensor_and_frame",
        |b| {
            let d = &b.driver;
            let ckpt = Checkpoint::open(&p).unwrap();
            let rules = Rules::default();
            let (_a, reg) = allocate_for(d, &ckpt, &rules, 4 << 20);
            let e = load(
                d,
                ckpt,
                &rules,
                &reg,
                &LoadOptions::default(),
                &Control::default(),
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains("one.packed"), "{e}");
            assert!(e.contains("t.bf16"), "{e}");
            assert!(
                e.contains(&format!("frame {}", piece.first_frame + 1)),
                "{e}"
            );
        },
    );
    // The host decoder refuses it too (unpack and reads).
    let ck = Checkpoint::open(&p).unwrap();
    assert!(ck.read_tensor("t.bf16").is_err());
    assert!(unpack(&p, &dir.path().join("x"), 1, false, None, None).is_err());
    assert!(!dir.path().join("x").exists());
}

/// Rewrite the manifest of `bytes` with `edit` and a valid checksum, so the
/// checks behind the checksum are reached.
fn remanifest(bytes: &[u8], edit: impl FnOnce(&mut pf::Index)) -> Vec<u8> {
    let mut ix = pf::parse(bytes).unwrap();
    let old_start = ix.data_start as usize;
    edit(&mut ix);
    // Frames stay where they are relative to the data section.
    let m = ix.manifest();
    let start = pf::data_start_for(m.len() as u64);
    for f in &mut ix.frames {
        f.at = f.at + start - ix.data_start;
    }
    ix.data_start = start;
    let m = ix.manifest();
    let mut out = ix.preamble(&m).to_vec();
    out.extend(&m);
    out.resize(ix.data_start as usize, 0);
    out.extend(&bytes[old_start..]);
    out
}

#[test]
fn hostile_packed_headers_are_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let (_p, bytes, _) = packed_one(dir.path());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated preamble", bytes[..40].to_vec()),
        ("truncated frames", bytes[..bytes.len() - 1].to_vec()),
        ("one more byte", [bytes.clone(), vec![0]].concat()),
        ("manifest byte flipped", {
            let mut b = bytes.clone();
            b[PREAMBLE_BYTES + 3] ^= 1;
            b
        }),
        ("version 2", {
            let mut b = bytes.clone();
            b[8] = 2;
            b
        }),
        (
            "piece moved",
            remanifest(&bytes, |ix| ix.pieces[1].offset += 1),
        ),
        (
            "pieces short of the file",
            remanifest(&bytes, |ix| ix.orig_len += 1),
        ),
        (
            "frame outside the file",
            remanifest(&bytes, |ix| {
                let n = ix.frames.len() - 1;
                ix.frames[n].len += 1
            }),
        ),
        (
            "frames out of order",
            remanifest(&bytes, |ix| ix.frames.swap(0, 1)),
        ),
        (
            "kept header cut short",
            remanifest(&bytes, |ix| {
                ix.prefix.pop();
                ix.pieces[0].offset -= 1;
                ix.pieces[0].len += 1;
            }),
        ),
        (
            "a tensor split over two pieces",
            remanifest(&bytes, |ix| {
                // Valid tiling and frames, but no piece is exactly the tensor.
                let i = ix.pieces.iter().position(|p| p.frame_count() > 1).unwrap();
                let mut p = ix.pieces[i];
                let mut q = p;
                q.offset += p.frame_raw;
                q.len -= p.frame_raw;
                q.first_frame += 1;
                p.len = p.frame_raw;
                ix.pieces[i] = p;
                ix.pieces.insert(i + 1, q);
            }),
        ),
        (
            "frame size not a block multiple",
            remanifest(&bytes, |ix| ix.pieces[0].frame_raw = 1000),
        ),
    ];
    for (what, b) in cases {
        let p = dir.path().join("hostile.packed");
        std::fs::write(&p, &b).unwrap();
        let e = Checkpoint::open(&p).expect_err(what).to_string();
        assert!(e.contains("hostile.packed"), "{what}: {e}");
    }
    // A checksum that holds over a forged manifest is still checked field by
    // field: a frame index pointing past the file.
    let mut forged = bytes.clone();
    let ix = pf::parse(&bytes).unwrap();
    let m = ix.manifest();
    let at = PREAMBLE_BYTES + m.len() - 16;
    forged[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    let sum = block_checksum(
        &[
            &forged[..56],
            &forged[PREAMBLE_BYTES..PREAMBLE_BYTES + m.len()],
        ]
        .concat(),
    );
    forged[56..64].copy_from_slice(&sum.to_le_bytes());
    let p = dir.path().join("forged.packed");
    std::fs::write(&p, &forged).unwrap();
    assert!(Checkpoint::open(&p).is_err());
}

// ---------------------------------------------------------------- C API

mod c_api {
    use super::*;
    use std::ffi::{c_void, CString};
    use std::ptr;
    use vmmweights::ffi::error::{vmmw_error_free, vmmw_error_message, vmmw_error_t};
    use vmmweights::ffi::pack::*;

    unsafe extern "C" fn count(done: u64, total: u64, user: *mut c_void) -> i32 {
        // SAFETY: the test passes a live `Vec<(u64, u64)>`; calls come one at a time.
        unsafe { (*(user as *mut Vec<(u64, u64)>)).push((done, total)) };
        0
    }

    unsafe extern "C" fn stop(_: u64, _: u64, _: *mut c_void) -> i32 {
        1
    }

    fn message(e: *mut vmmw_error_t) -> String {
        if e.is_null() {
            return String::new();
        }
        // SAFETY: a live error from the call, freed once here.
        unsafe {
            let m = std::ffi::CStr::from_ptr(vmmw_error_message(e))
                .to_string_lossy()
                .into_owned();
            vmmw_error_free(e);
            m
        }
    }

    #[test]
    fn pack_and_unpack_through_the_c_api() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("m.safetensors");
        write_raw_safetensors(&src, &every_dtype(), 1);
        let c = |p: &Path| CString::new(p.to_str().unwrap()).unwrap();
        let (i, o, back) = (
            c(&src),
            c(&dir.path().join("m.packed")),
            c(&dir.path().join("back")),
        );
        let mut opts = vmmw_pack_options_t {
            size: std::mem::size_of::<vmmw_pack_options_t>(),
            frame_bytes: FRAME,
            threads: 2,
            cpu: 1,
            force: 0,
            device: 0,
        };
        let mut seen: Vec<(u64, u64)> = Vec::new();
        let mut rep = vmmw_pack_report_t::default();
        let mut err: *mut vmmw_error_t = ptr::null_mut();
        // SAFETY: valid strings, options, callback and out-pointers.
        let rc = unsafe {
            vmmw_pack(
                i.as_ptr(),
                o.as_ptr(),
                &opts,
                Some(count),
                &mut seen as *mut _ as *mut c_void,
                &mut rep,
                &mut err,
            )
        };
        assert_eq!(rc, 0, "{}", message(err));
        assert!(
            rep.packed_bytes > 0 && rep.packed_bytes < rep.original_bytes,
            "{rep:?}"
        );
        assert_eq!(seen.last().map(|x| x.0 == x.1), Some(true), "{seen:?}");
        // SAFETY: as above; default options (NULL).
        let rc = unsafe {
            vmmw_unpack(
                o.as_ptr(),
                back.as_ptr(),
                ptr::null(),
                None,
                ptr::null_mut(),
                ptr::null_mut(),
                &mut err,
            )
        };
        assert_eq!(rc, 0, "{}", message(err));
        same_files(&src, &dir.path().join("back"));
        // A progress callback that asks to stop: cancelled, nothing written.
        let stopped = c(&dir.path().join("stopped"));
        // SAFETY: as above.
        let rc = unsafe {
            vmmw_pack(
                i.as_ptr(),
                stopped.as_ptr(),
                &opts,
                Some(stop),
                ptr::null_mut(),
                ptr::null_mut(),
                &mut err,
            )
        };
        let m = message(err);
        assert_ne!(rc, 0);
        assert!(m.contains("cancel"), "{m}");
        assert!(!dir.path().join("stopped").exists());
        // Bad arguments: NULL paths, an option struct without its size, an
        // existing output; nothing changes.
        // SAFETY: NULL input is the case under test.
        let rc = unsafe {
            vmmw_pack(
                ptr::null(),
                o.as_ptr(),
                &opts,
                None,
                ptr::null_mut(),
                ptr::null_mut(),
                &mut err,
            )
        };
        assert_ne!(rc, 0);
        assert!(message(err).contains("input"));
        opts.size = 0;
        // SAFETY: valid pointers; the size field is the case under test.
        let rc = unsafe {
            vmmw_pack(
                i.as_ptr(),
                stopped.as_ptr(),
                &opts,
                None,
                ptr::null_mut(),
                ptr::null_mut(),
                &mut err,
            )
        };
        assert_ne!(rc, 0);
        assert!(message(err).contains("vmmw_pack_options_t"));
        // SAFETY: valid pointers; the existing output is the case under test.
        let rc = unsafe {
            vmmw_unpack(
                o.as_ptr(),
                back.as_ptr(),
                ptr::null(),
                None,
                ptr::null_mut(),
                ptr::null_mut(),
                &mut err,
            )
        };
        assert_ne!(rc, 0);
        assert!(message(err).contains("exists"));
        same_files(&src, &dir.path().join("back"));
    }
}

#[test]
fn a_reload_wake_with_content_checks_refuses_frames_rewritten_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let (p, mut bytes, ix) = packed_one(dir.path());
    let d = host();
    let pool = Pool::new(d.clone(), PoolConfig::default()).unwrap();
    let weights = tag::id("packed-reload-check").unwrap();
    let rules = Rules::default();
    let ckpt = Checkpoint::open(&p).unwrap();
    let mut reg = Registry::new();
    allocate_in_pool(
        &mut reg,
        &Plan::destinations(&ckpt, &rules).unwrap(),
        &pool,
        weights,
    )
    .unwrap();
    let o = LoadOptions {
        reload_check: true,
        ..Default::default()
    };
    let plan = load_into_pool(&pool, ckpt, &rules, &reg, &o, &Control::default()).unwrap();
    assert!(plan.has_checksums());
    pool.sleep(&[(weights, Policy::Reload)]).unwrap();
    pool.wake(&[weights]).unwrap();
    // One byte of a frame changed in place; size and modification time kept.
    let f = ix.frames[ix.frames.len() / 2];
    bytes[(f.at + f.len / 2) as usize] ^= 1;
    let mtime = std::fs::metadata(&p).unwrap().modified().unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .and_then(|mut h| {
            use std::io::Write;
            h.write_all(&bytes)?;
            h.set_modified(mtime)
        })
        .unwrap();
    pool.sleep(&[(weights, Policy::Reload)]).unwrap();
    let e = pool.wake(&[weights]).unwrap_err().to_string();
    assert!(e.contains("one.packed") && e.contains("rewritten"), "{e}");
    drop(plan);
}
