//! The control channel of the IPC transport: length-prefixed JSON messages on
//! a Unix socket, one per bucket each way. The bytes themselves travel in the
//! shared ring; this channel says which slot holds which bucket and when a
//! slot may be written again. A closed socket is how a dead peer shows.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::bucket::{AnnouncedTensor, BucketManifest};
use crate::error::{Error, Result};

/// Longest message accepted (a header for a million tensors fits).
pub const MAX_MESSAGE_BYTES: u32 = 256 << 20;

/// Most shares one direct update may name (a bound on what a hostile sender
/// makes a receiver attach).
pub const MAX_SHARES: usize = 64;

/// One tensor of a direct update: what it is and where it lies in the
/// memory a share exports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectTensor {
    /// Checkpoint name.
    pub name: String,
    /// Element type as safetensors spells it.
    pub dtype: String,
    /// Shape of the full tensor.
    pub shape: Vec<u64>,
    /// Index of the share that holds it.
    pub share: u32,
    /// Which of the share's segments holds it (`segment.K` in the share).
    pub segment: u32,
    /// Offset of element 0 from that segment's base.
    pub offset: u64,
}

/// One share of a direct update: a sender's segments of one tag, served
/// whole (tensor `segment.K` spans segment K's committed bytes), and what
/// tells a receiver whether an import it keeps still maps the same memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectShare {
    /// Socket path of the share.
    pub path: String,
    /// The sending process's identity, drawn when it started sending.
    pub sender: String,
    /// Moves whenever the memory behind the share changes (a segment freed,
    /// created, grown, shrunk, or remapped by a wake); the same generation
    /// from the same sender is the same physical memory.
    pub generation: u64,
    /// Bytes of each segment, in share order.
    pub segments: Vec<u64>,
}

/// What the sender says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FromSender {
    /// First message: where the ring is served and its shape.
    Ring {
        /// Socket path of the share that serves the ring's slots.
        share: String,
        /// Slots in the ring.
        slots: u32,
        /// Bytes of each slot.
        slot_bytes: u64,
    },
    /// First message of a direct update: the tensors already lie in memory
    /// the sender serves as shares (one per tag); the receiver attaches
    /// them (or reuses its imports of the same generation) and copies each
    /// tensor straight out of the imported memory.
    Direct {
        /// The shares, as `DirectTensor::share` indexes them.
        shares: Vec<DirectShare>,
        /// Every tensor, naming its share, segment and offset.
        tensors: Vec<DirectTensor>,
    },
    /// The next message is a direct update's manifest offered ahead of any
    /// update (`IpcSender::offer_direct_to`): the receiver attaches its
    /// shares and checks it, keeps the imports and the manifest for the
    /// updates that follow, writes nothing, and answers `Attached` (or
    /// `Failed`); the sender then waits for nothing more.
    Offer,
    /// An update begins: its tensors, in the order its buckets carry them.
    Begin {
        /// The announced tensors.
        tensors: Vec<AnnouncedTensor>,
        /// Buckets that will follow.
        buckets: u64,
    },
    /// Bucket `manifest.seq` is in slot `slot`, written and visible.
    Bucket {
        /// Ring slot holding it.
        slot: u32,
        /// Its pieces.
        manifest: BucketManifest,
    },
    /// Every bucket of the update was sent.
    End,
    /// The sender gives up this update; the receiver keeps its last version.
    Abort {
        /// Why.
        reason: String,
    },
}

/// What the receiver says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FromReceiver {
    /// The ring is mapped; send.
    Attached,
    /// Bucket `seq` was applied: its slot may be written again.
    Applied {
        /// The bucket.
        seq: u64,
    },
    /// The update was committed at `version`.
    Committed {
        /// The destinations' version after it.
        version: u64,
    },
    /// The receiver refused or failed the update; nothing of it was committed.
    Failed {
        /// Why, as the receiver's error says it.
        reason: String,
    },
}

/// One end of the control channel.
#[derive(Debug)]
pub struct Channel {
    sock: UnixStream,
    peer: String,
}

impl Channel {
    /// Wrap a connected socket; `peer` names the other side in errors.
    pub fn new(sock: UnixStream, peer: impl Into<String>, timeout: Duration) -> Result<Channel> {
        let peer = peer.into();
        let io = |e| Error::io(Path::new(&peer), e);
        sock.set_read_timeout(Some(timeout)).map_err(io)?;
        sock.set_write_timeout(Some(timeout)).map_err(io)?;
        Ok(Channel { sock, peer })
    }

    /// Send one message.
    pub fn send<T: Serialize>(&mut self, msg: &T) -> Result<()> {
        let frame = Self::encode(msg)?;
        self.send_encoded(&frame)
    }

    /// Send a message [`Self::encode`] made, so a sender can encode while it
    /// waits for its receivers instead of after one connected.
    pub fn send_encoded(&mut self, frame: &[u8]) -> Result<()> {
        self.sock
            .write_all(frame)
            .map_err(|e| self.gone(format!("sending: {e}")))
    }

    /// `msg` as it goes on the wire: its length, then its JSON.
    pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>> {
        let body = serde_json::to_vec(msg)
            .map_err(|e| Error::InvalidState(format!("encoding a control message: {e}")))?;
        let len = u32::try_from(body.len())
            .ok()
            .filter(|&l| l <= MAX_MESSAGE_BYTES)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "control message of {} bytes, more than {MAX_MESSAGE_BYTES}",
                    body.len()
                ))
            })?;
        let mut frame = Vec::with_capacity(4 + body.len());
        frame.extend_from_slice(&len.to_le_bytes());
        frame.extend_from_slice(&body);
        Ok(frame)
    }

    /// Receive one message; a closed socket or a timeout is an error naming the peer.
    pub fn recv<T: for<'de> Deserialize<'de>>(&mut self) -> Result<T> {
        let body = self.recv_body()?;
        self.decode(&body)
    }

    /// Receive one message's JSON without decoding it (a receiver that
    /// recognizes a message it decoded before skips the decoding).
    pub fn recv_body(&mut self) -> Result<Vec<u8>> {
        let mut len = [0u8; 4];
        self.sock
            .read_exact(&mut len)
            .map_err(|e| self.gone(format!("waiting for its next message: {}", describe(&e))))?;
        let len = u32::from_le_bytes(len);
        if len > MAX_MESSAGE_BYTES {
            return Err(Error::InvalidArgument(format!(
                "{}: control message of {len} bytes announced, more than {MAX_MESSAGE_BYTES}",
                self.peer
            )));
        }
        let mut body = vec![0u8; len as usize];
        self.sock
            .read_exact(&mut body)
            .map_err(|e| self.gone(format!("reading a message: {}", describe(&e))))?;
        Ok(body)
    }

    /// Decode a message [`Self::recv_body`] received.
    pub fn decode<T: for<'de> Deserialize<'de>>(&self, body: &[u8]) -> Result<T> {
        serde_json::from_slice(body).map_err(|e| {
            Error::InvalidArgument(format!("{}: malformed control message: {e}", self.peer))
        })
    }

    fn gone(&self, what: String) -> Error {
        Error::InvalidState(format!("{}: {what}", self.peer))
    }
}

fn describe(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => {
            "the connection closed (the peer exited or died)".into()
        }
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            "timed out (the peer is stuck or gone)".into()
        }
        _ => e.to_string(),
    }
}

/// Block until `listener` has a connection waiting or `left` has passed
/// (then the caller's accept finds none and checks its deadline).
fn wait_for_connection(listener: &UnixListener, left: Duration) -> std::io::Result<()> {
    let mut fd = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // At most a second per wait, rounded up so a wait never spins at 0 ms.
    let ms = left.as_micros().div_ceil(1000).clamp(1, 1000) as libc::c_int;
    // SAFETY: `fd` is one valid pollfd for the call; the listener outlives it.
    let r = unsafe { libc::poll(&mut fd, 1, ms) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// Wait up to `timeout` for one receiver on `listener` (bound at `path`).
pub(super) fn accept(listener: &UnixListener, path: &Path, timeout: Duration) -> Result<Channel> {
    let deadline = Instant::now() + timeout;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io(path, e))?;
    loop {
        match listener.accept() {
            Ok((sock, _)) => {
                sock.set_nonblocking(false)
                    .map_err(|e| Error::io(path, e))?;
                return Channel::new(
                    sock,
                    format!("update receiver on {}", path.display()),
                    timeout,
                );
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Error::InvalidState(format!(
                        "update sender {}: no receiver connected within {:?}",
                        path.display(),
                        timeout
                    )));
                }
                // Sleep in the kernel until a receiver connects, so it is
                // answered at once: its setup is part of every update.
                wait_for_connection(listener, left).map_err(|e| Error::io(path, e))?;
            }
            Err(e) => return Err(Error::io(path, e)),
        }
    }
}
