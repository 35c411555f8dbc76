//! The owner's watch over attached importers: one `poll` over every attached
//! connection and a wake socket, blocking without a timeout, so the server
//! uses no CPU between events. An importer that closes its end is no longer
//! counted; one that sends anything after its request (the protocol has it
//! send nothing) is evicted and only its hang-up is watched from then on.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use super::connections::Shared;
use super::wire::{self, Notice};

/// Run until the server stops; `wake` is woken by every new attach and by stop.
pub(super) fn run(shared: &Shared, wake: UnixStream) {
    let mut buf = [0u8; 64];
    loop {
        let (ids, mut fds) = {
            let c = shared.conns();
            if c.stopping {
                return;
            }
            let mut ids = Vec::with_capacity(c.attached.len());
            let mut fds = Vec::with_capacity(c.attached.len() + 1);
            for (&id, a) in &c.attached {
                ids.push(id);
                fds.push(libc::pollfd {
                    fd: a.sock.as_raw_fd(),
                    // POLLHUP and POLLERR are reported whatever is asked.
                    events: if a.reading { libc::POLLIN } else { 0 },
                    revents: 0,
                });
            }
            (ids, fds)
        };
        fds.push(libc::pollfd {
            fd: wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        // SAFETY: `fds` is a live array of `fds.len()` pollfds. Only this
        // thread removes attached connections, so every descriptor polled
        // stays open until the loop comes round again.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            continue; // EINTR; poll's other errors cannot happen with valid arguments
        }
        if fds.last().is_some_and(|w| w.revents != 0) {
            let mut stray = Vec::new();
            while matches!(wire::recv(&wake, &mut buf, &mut stray, true), Ok(n) if n > 0) {}
        }
        for (id, p) in ids.iter().zip(&fds) {
            if p.revents != 0 {
                event(shared, *id, p.revents, &mut buf);
            }
        }
    }
}

fn event(shared: &Shared, id: u64, revents: libc::c_short, buf: &mut [u8]) {
    let mut c = shared.conns();
    let Some(a) = c.attached.get_mut(&id) else {
        return;
    };
    let closed = if a.reading && revents & libc::POLLIN != 0 {
        let mut stray = Vec::new();
        match wire::recv(&a.sock, buf, &mut stray, true) {
            Ok(0) => true,
            Ok(n) => {
                a.reading = false;
                a.evicted = true;
                if !a.done {
                    let _ = wire::send_notice(&a.sock, Notice::Evicted);
                    a.done = true;
                }
                let line = format!(
                    "evicted pid={} uid={}: sent {n} bytes and {} descriptors after its request",
                    a.cred.pid,
                    a.cred.uid,
                    stray.len()
                );
                drop(c);
                shared.log(line);
                return;
            }
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        }
    } else {
        revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
    };
    if closed {
        let a = c.attached.remove(&id).expect("present above");
        drop(c);
        shared.log(format!(
            "detached pid={} uid={}{}",
            a.cred.pid,
            a.cred.uid,
            if a.evicted { " (evicted)" } else { "" }
        ));
    }
}
