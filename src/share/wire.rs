//! The bytes on a share's Unix socket, and the descriptors beside them.
//!
//! Importer to owner: one byte, `r` (read-only) or `w` (read-write), then
//! nothing until it closes.
//!
//! Owner to importer, in order:
//! 1. `MAGIC`, the JSON length (u64 little-endian), the JSON of a [`Hello`];
//! 2. for a manifest, the chunks' descriptors in batches of at most
//!    [`FDS_PER_MESSAGE`], each batch one byte with `SCM_RIGHTS` beside it;
//! 3. `E`: the handshake is over and the importer is counted (notices sent
//!    meanwhile come before it);
//! 4. later, notices: `V` + u64 (new weights version), `R` (revoked).
//!
//! Every read goes through `recvmsg` with a control buffer, so no descriptor
//! is ever dropped unseen: each one received becomes an [`OwnedFd`] and is
//! closed unless the caller keeps it.

use std::io::{self, Read, Write};
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use super::manifest::{Hello, MAX_MANIFEST_BYTES};

/// The first bytes of every connection.
pub const MAGIC: &[u8; 8] = b"VMMWSHR1";
/// Descriptors sent per message. Small, because the importer imports and
/// closes each message's descriptors before it receives the next: its file
/// table then never has to grow (see `client::receive_and_map`).
pub const FDS_PER_MESSAGE: usize = 16;
/// Descriptors accepted in one message (the kernel allows 253; owners of this
/// format send at most [`FDS_PER_MESSAGE`]).
pub const MAX_FDS_PER_MESSAGE: usize = 64;

/// A notice the owner sends to attached importers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// The owner published new weights under this version.
    Version(u64),
    /// The owner revoked the share.
    Revoked,
    /// End of the handshake (sent once).
    Ready,
}

/// The peer's credentials (`SO_PEERCRED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id.
    pub pid: i32,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// The credentials of the process at the other end of `sock`.
pub fn peer_cred(sock: &UnixStream) -> io::Result<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a writable ucred and `len` its size.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// The effective user id of this process.
pub fn own_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Send `MAGIC`, the length and the JSON of `hello`.
pub fn write_hello(sock: &mut UnixStream, hello: &Hello) -> io::Result<()> {
    let json = serde_json::to_vec(hello).map_err(io::Error::other)?;
    let mut msg = Vec::with_capacity(16 + json.len());
    msg.extend_from_slice(MAGIC);
    msg.extend_from_slice(&(json.len() as u64).to_le_bytes());
    msg.extend_from_slice(&json);
    sock.write_all(&msg)
}

/// Send `fds` in batches of [`FDS_PER_MESSAGE`], one byte each.
pub fn send_fds(sock: &UnixStream, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    for batch in fds.chunks(FDS_PER_MESSAGE) {
        send_batch(sock, batch)?;
    }
    Ok(())
}

fn send_batch(sock: &UnixStream, batch: &[BorrowedFd<'_>]) -> io::Result<()> {
    let raw: Vec<libc::c_int> = batch.iter().map(|f| f.as_raw_fd()).collect();
    let payload = size_of::<libc::c_int>() * raw.len();
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(payload as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut byte = [b'F'];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: an all-zero msghdr is valid; the fields used are set below.
    let mut msg: libc::msghdr = unsafe { MaybeUninit::zeroed().assume_init() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control points to `space` bytes, enough for one header and
    // `raw.len()` descriptors, so CMSG_FIRSTHDR is non-NULL and CMSG_DATA has room.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(payload as u32) as _;
        std::ptr::copy_nonoverlapping(raw.as_ptr().cast::<u8>(), libc::CMSG_DATA(cmsg), payload);
    }
    loop {
        // SAFETY: msg describes valid buffers that outlive the call; the
        // descriptors are borrowed and stay open for its duration.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n == 1 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if n < 0 && e.kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return Err(if n < 0 {
            e
        } else {
            io::Error::new(io::ErrorKind::WriteZero, "sendmsg sent no byte")
        });
    }
}

/// One `recvmsg` into `buf`; every descriptor that arrives is appended to `fds`.
/// Returns the bytes read (0 at end of stream). `dontwait` makes it non-blocking
/// (`WouldBlock` when nothing is queued).
pub fn recv(
    sock: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    dontwait: bool,
) -> io::Result<usize> {
    let max = size_of::<libc::c_int>() * MAX_FDS_PER_MESSAGE;
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(max as u32) } as usize;
    // u64 storage keeps the control buffer aligned for cmsghdr.
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is valid; the fields used are set below.
    let mut msg: libc::msghdr = unsafe { MaybeUninit::zeroed().assume_init() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    let mut flags = libc::MSG_CMSG_CLOEXEC;
    if dontwait {
        flags |= libc::MSG_DONTWAIT;
    }
    let n = loop {
        // SAFETY: msg describes `buf` and `control`, both live and writable.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, flags) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // Take ownership of every descriptor first, so an error below closes them.
    // SAFETY: the kernel filled msg's control area; CMSG_FIRSTHDR/NXTHDR walk
    // it within msg_controllen, and each SCM_RIGHTS payload holds c_ints.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let bytes = (*cmsg).cmsg_len as usize - (data as usize - cmsg as usize);
                for i in 0..bytes / size_of::<libc::c_int>() {
                    let fd = std::ptr::read_unaligned(
                        data.add(i * size_of::<libc::c_int>()).cast::<libc::c_int>(),
                    );
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the peer sent more than {MAX_FDS_PER_MESSAGE} descriptors in one message"),
        ));
    }
    Ok(n)
}

/// Fill `buf` completely (blocking), collecting descriptors into `fds`.
pub fn recv_exact(sock: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let n = recv(sock, &mut buf[got..], fds, false)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "the peer closed the connection after {got} of {} bytes",
                    buf.len()
                ),
            ));
        }
        got += n;
    }
    Ok(())
}

/// Read `MAGIC`, the length and the JSON of a [`Hello`]; descriptors that
/// arrive meanwhile go to `fds` (the caller refuses them: none are expected).
pub fn read_hello(sock: &UnixStream, fds: &mut Vec<OwnedFd>) -> io::Result<Hello> {
    let mut head = [0u8; 16];
    recv_exact(sock, &mut head, fds)?;
    if &head[..8] != MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the peer is not a vmmweights share (wrong magic bytes)",
        ));
    }
    let len = u64::from_le_bytes(head[8..].try_into().expect("8 bytes"));
    if len > MAX_MANIFEST_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the manifest claims {len} bytes; at most {MAX_MANIFEST_BYTES} are accepted"),
        ));
    }
    let mut json = vec![0u8; len as usize];
    recv_exact(sock, &mut json, fds)?;
    serde_json::from_slice(&json).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the manifest is not valid JSON for this format: {e}"),
        )
    })
}

/// Encode a notice.
pub fn notice_bytes(n: Notice) -> Vec<u8> {
    match n {
        Notice::Version(v) => {
            let mut b = vec![b'V'];
            b.extend_from_slice(&v.to_le_bytes());
            b
        }
        Notice::Revoked => vec![b'R'],
        Notice::Ready => vec![b'E'],
    }
}

/// Send a notice without blocking: a full socket buffer means the importer
/// stopped reading, which must not stall the owner (it is then disconnected).
pub fn send_notice(sock: &UnixStream, n: Notice) -> io::Result<()> {
    let b = notice_bytes(n);
    // SAFETY: `b` is a live buffer of `b.len()` bytes.
    let rc = unsafe {
        libc::send(
            sock.as_raw_fd(),
            b.as_ptr().cast(),
            b.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if rc == b.len() as isize {
        Ok(())
    } else if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Err(io::Error::new(io::ErrorKind::WriteZero, "notice cut short"))
    }
}

/// Read what the owner sent since the last call, without blocking. Returns the
/// notices in order and whether the owner has closed its end.
pub fn poll_notices(sock: &UnixStream, pending: &mut Vec<u8>) -> io::Result<(Vec<Notice>, bool)> {
    let mut closed = false;
    let mut stray = Vec::new();
    loop {
        let mut buf = [0u8; 256];
        match recv(sock, &mut buf, &mut stray, true) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(n) => pending.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                closed = true;
                break;
            }
            Err(e) => return Err(e),
        }
    }
    if !stray.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the owner sent {} unexpected descriptors", stray.len()),
        ));
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < pending.len() {
        match pending[i] {
            b'R' => {
                out.push(Notice::Revoked);
                i += 1;
            }
            b'E' => {
                out.push(Notice::Ready);
                i += 1;
            }
            b'V' if pending.len() - i >= 9 => {
                let v = u64::from_le_bytes(pending[i + 1..i + 9].try_into().expect("8 bytes"));
                out.push(Notice::Version(v));
                i += 9;
            }
            b'V' => break,
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("unknown notice byte {other:#04x} from the owner"),
                ))
            }
        }
    }
    pending.drain(..i);
    Ok((out, closed))
}

/// Read notices (blocking) up to and including the end of the handshake.
pub fn read_until_ready(sock: &UnixStream, fds: &mut Vec<OwnedFd>) -> io::Result<Vec<Notice>> {
    let mut out = Vec::new();
    loop {
        let mut b = [0u8; 1];
        recv_exact(sock, &mut b, fds)?;
        match b[0] {
            b'E' => return Ok(out),
            b'R' => out.push(Notice::Revoked),
            b'V' => {
                let mut v = [0u8; 8];
                recv_exact(sock, &mut v, fds)?;
                out.push(Notice::Version(u64::from_le_bytes(v)));
            }
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("unknown handshake byte {other:#04x} from the owner"),
                ))
            }
        }
    }
}

/// Read and discard whatever an importer sends (it sends nothing); returns
/// when it closes its end. Descriptors it sends are closed at once.
pub fn wait_for_close(sock: &UnixStream) {
    let mut buf = [0u8; 64];
    let mut reader = sock;
    loop {
        match reader.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
    }
}
