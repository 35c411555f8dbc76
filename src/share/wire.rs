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
//! 4. later, notices: `V` + u64 (new weights version), `R` (revoked: the
//!    tag sleeps), `X` (this importer evicted: it left its notices unread or
//!    sent bytes after its request). After `R` or `X` nothing more is sent.
//!
//! The owner may refuse before reading the request (a peer it does not
//! accept, too many connections): it writes a refusal `Hello` and closes, so
//! the importer's request may fail to send and the refusal is still there to read.
//!
//! Every read goes through `recvmsg` with a control buffer, so no descriptor
//! is ever dropped unseen: each one received becomes an [`OwnedFd`] and is
//! closed unless the caller keeps it. Blocking reads and writes take one
//! deadline for the whole exchange, not one per call.

use std::io;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Instant;

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
    /// The owner revoked the share (its tag sleeps).
    Revoked,
    /// The owner revoked this importer alone: it left its notices unread past
    /// the bound the owner keeps per importer, or broke the protocol.
    Evicted,
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

/// Bound the next blocking call on `sock` by `deadline` (`SO_RCVTIMEO` or
/// `SO_SNDTIMEO`); `TimedOut` when it has passed.
fn arm(sock: &UnixStream, deadline: Option<Instant>, write: bool) -> io::Result<()> {
    let Some(d) = deadline else {
        return Ok(());
    };
    let left = d.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(timed_out());
    }
    if write {
        sock.set_write_timeout(Some(left))
    } else {
        sock.set_read_timeout(Some(left))
    }
}

fn timed_out() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "the deadline for this exchange passed",
    )
}

/// A timeout of `SO_RCVTIMEO`/`SO_SNDTIMEO` surfaces as `EAGAIN`; with a
/// deadline armed that means the deadline passed.
fn deadline_error(e: io::Error, deadline: Option<Instant>) -> io::Error {
    if deadline.is_some() && e.kind() == io::ErrorKind::WouldBlock {
        timed_out()
    } else {
        e
    }
}

/// Write all of `bytes` before `deadline`, never raising SIGPIPE.
pub fn send_all(sock: &UnixStream, mut bytes: &[u8], deadline: Option<Instant>) -> io::Result<()> {
    while !bytes.is_empty() {
        arm(sock, deadline, true)?;
        // SAFETY: `bytes` is a live buffer of `bytes.len()` bytes.
        let n = unsafe {
            libc::send(
                sock.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(deadline_error(e, deadline));
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

/// The bytes of a framed `hello`: `MAGIC`, the JSON length, the JSON.
pub fn hello_bytes(hello: &Hello) -> io::Result<Vec<u8>> {
    let json = serde_json::to_vec(hello).map_err(io::Error::other)?;
    let mut msg = Vec::with_capacity(16 + json.len());
    msg.extend_from_slice(MAGIC);
    msg.extend_from_slice(&(json.len() as u64).to_le_bytes());
    msg.extend_from_slice(&json);
    Ok(msg)
}

/// Send `MAGIC`, the length and the JSON of `hello` before `deadline`.
pub fn write_hello(sock: &UnixStream, hello: &Hello, deadline: Option<Instant>) -> io::Result<()> {
    send_all(sock, &hello_bytes(hello)?, deadline)
}

/// Send `fds` in batches of [`FDS_PER_MESSAGE`], one byte each, before `deadline`.
pub fn send_fds(
    sock: &UnixStream,
    fds: &[BorrowedFd<'_>],
    deadline: Option<Instant>,
) -> io::Result<()> {
    for batch in fds.chunks(FDS_PER_MESSAGE) {
        arm(sock, deadline, true)?;
        send_batch(sock, batch).map_err(|e| deadline_error(e, deadline))?;
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

/// Fill `buf` completely (blocking, until `deadline`), collecting descriptors into `fds`.
pub fn recv_exact(
    sock: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    deadline: Option<Instant>,
) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        arm(sock, deadline, false)?;
        let n = recv(sock, &mut buf[got..], fds, false).map_err(|e| deadline_error(e, deadline))?;
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

/// Read `MAGIC`, the length and the JSON of a [`Hello`] before `deadline`;
/// descriptors that arrive meanwhile go to `fds` (the caller refuses them:
/// none are expected).
pub fn read_hello(
    sock: &UnixStream,
    fds: &mut Vec<OwnedFd>,
    deadline: Option<Instant>,
) -> io::Result<Hello> {
    let mut head = [0u8; 16];
    recv_exact(sock, &mut head, fds, deadline)?;
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
    // Grown as bytes arrive, so a claimed length costs nothing until it is sent.
    let mut json = Vec::new();
    let mut chunk = vec![0u8; (len as usize).min(1 << 20)];
    while json.len() < len as usize {
        let want = (len as usize - json.len()).min(chunk.len());
        recv_exact(sock, &mut chunk[..want], fds, deadline)?;
        json.extend_from_slice(&chunk[..want]);
    }
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
        Notice::Evicted => vec![b'X'],
        Notice::Ready => vec![b'E'],
    }
}

/// Send a notice without blocking: a full socket buffer means the importer
/// stopped reading, which must not stall the owner (the server evicts it
/// before that happens, see [`unread_bytes`]).
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
            b'X' => {
                out.push(Notice::Evicted);
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

/// Read notices (blocking, until `deadline`) up to and including the end of the handshake.
pub fn read_until_ready(
    sock: &UnixStream,
    fds: &mut Vec<OwnedFd>,
    deadline: Option<Instant>,
) -> io::Result<Vec<Notice>> {
    let mut out = Vec::new();
    loop {
        let mut b = [0u8; 1];
        recv_exact(sock, &mut b, fds, deadline)?;
        match b[0] {
            b'E' => return Ok(out),
            b'R' => out.push(Notice::Revoked),
            b'X' => out.push(Notice::Evicted),
            b'V' => {
                let mut v = [0u8; 8];
                recv_exact(sock, &mut v, fds, deadline)?;
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

/// Bytes sent on `sock` that the peer has not read yet (`SIOCOUTQ`; for a
/// Unix socket, counted as the kernel charges them against `SO_SNDBUF`).
pub fn unread_bytes(sock: &UnixStream) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one int to the pointer given.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::TIOCOUTQ, &mut n) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n.max(0) as usize)
}

/// The send buffer size of `sock` (`SO_SNDBUF`).
pub fn send_buffer(sock: &UnixStream) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `n` is a writable int and `len` its size.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&mut n as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n.max(0) as usize)
}

/// `SO_PEERGROUPS` (Linux 4.13; 59 on every architecture but parisc and
/// sparc, which this library does not build for); not in the libc crate.
const SO_PEERGROUPS: libc::c_int = 59;

/// The supplementary groups of the process at the other end of `sock`
/// (`SO_PEERGROUPS`); empty where the kernel does not report them.
pub fn peer_groups(sock: &UnixStream) -> Vec<u32> {
    let mut groups = vec![0 as libc::gid_t; 64];
    for _ in 0..2 {
        let mut len = (groups.len() * size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: `groups` is writable for `len` bytes.
        let rc = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(n);
            return groups;
        }
        if io::Error::last_os_error().raw_os_error() != Some(libc::ERANGE) || n <= groups.len() {
            break;
        }
        groups.resize(n, 0);
    }
    Vec::new()
}

/// Read and discard whatever the peer sends; returns when it closes its end.
/// Descriptors it sends are closed at once.
pub fn wait_for_close(sock: &UnixStream) {
    let mut buf = [0u8; 64];
    loop {
        let mut stray = Vec::new();
        match recv(sock, &mut buf, &mut stray, false) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
    }
}
