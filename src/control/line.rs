//! Lines on a control socket: requests read whole, bounded in length and
//! by one deadline each, however the peer cuts or drips them.

use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::time::Instant;

/// What reading one line gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A line, without its newline (a trailing `\r` removed too).
    Got(Vec<u8>),
    /// The peer closed its end (bytes after the last newline are dropped).
    Closed,
    /// More than the limit arrived without a newline.
    TooLong,
    /// The deadline passed before a whole line arrived.
    TimedOut,
}

/// Reads lines from one socket, keeping what arrived past a newline for the
/// next line (a client may send several requests at once).
#[derive(Debug, Default)]
pub struct LineReader {
    pending: Vec<u8>,
}

impl LineReader {
    /// A reader with nothing pending.
    pub fn new() -> LineReader {
        LineReader::default()
    }

    /// The next non-empty line of at most `max` bytes, before `deadline`.
    pub fn read(&mut self, sock: &UnixStream, max: usize, deadline: Instant) -> io::Result<Line> {
        let mut chunk = [0u8; 4096];
        let mut scanned = 0;
        loop {
            if let Some(i) = self.pending[scanned..].iter().position(|&b| b == b'\n') {
                let end = scanned + i;
                let mut line: Vec<u8> = self.pending.drain(..=end).collect();
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                if line.iter().all(u8::is_ascii_whitespace) {
                    scanned = 0;
                    continue;
                }
                return Ok(Line::Got(line));
            }
            scanned = self.pending.len();
            if self.pending.len() > max {
                return Ok(Line::TooLong);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Line::TimedOut);
            }
            sock.set_read_timeout(Some(left))?;
            match (&*sock).read(&mut chunk) {
                Ok(0) => return Ok(Line::Closed),
                Ok(n) => self.pending.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(Line::TimedOut)
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::Duration;

    fn soon() -> Instant {
        Instant::now() + Duration::from_millis(300)
    }

    #[test]
    fn lines_split_join_and_bound() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut r = LineReader::new();
        a.write_all(b"{\"op\":\"status\"}\n\r\n{\"op\"").unwrap();
        assert_eq!(
            r.read(&b, 100, soon()).unwrap(),
            Line::Got(b"{\"op\":\"status\"}".to_vec())
        );
        a.write_all(b":\"wake\"}\r\n").unwrap();
        assert_eq!(
            r.read(&b, 100, soon()).unwrap(),
            Line::Got(b"{\"op\":\"wake\"}".to_vec())
        );
        // Nothing more within the deadline.
        let t = Instant::now();
        assert_eq!(r.read(&b, 100, soon()).unwrap(), Line::TimedOut);
        assert!(t.elapsed() >= Duration::from_millis(250));
        // A line over the bound, cut in pieces.
        a.write_all(&[b'x'; 60]).unwrap();
        a.write_all(&[b'x'; 60]).unwrap();
        assert_eq!(r.read(&b, 100, soon()).unwrap(), Line::TooLong);
        drop(a);
        let mut r = LineReader::new();
        assert_eq!(r.read(&b, 100, soon()).unwrap(), Line::Closed);
    }
}
