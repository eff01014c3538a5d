//! One deadline for a whole conversation on a blocking socket. A socket timeout bounds each
//! read or write on its own, so a peer that trickles a byte per timeout can hold a handshake
//! for as long as it likes; [`Deadlined`] gives each call only what is left of the deadline,
//! and fails every call that would start after it with `TimedOut`.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// A blocking socket whose timeouts can be set (TCP and Unix streams).
pub trait TimedStream: Read + Write {
    /// Sets both the read and the write timeout.
    fn set_timeouts(&self, t: Duration) -> io::Result<()>;
}

impl TimedStream for TcpStream {
    fn set_timeouts(&self, t: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(t))?;
        self.set_write_timeout(Some(t))
    }
}

impl TimedStream for UnixStream {
    fn set_timeouts(&self, t: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(t))?;
        self.set_write_timeout(Some(t))
    }
}

/// `stream`, with every read and write ending by `deadline` (see the module docs).
#[derive(Debug)]
pub struct Deadlined<'a, S: TimedStream> {
    /// The socket.
    pub stream: &'a mut S,
    /// When everything must be over.
    pub deadline: Instant,
}

impl<S: TimedStream> Deadlined<'_, S> {
    /// Sets the socket's timeouts to what is left of the deadline (for calls made on the
    /// socket directly, such as `sendmsg`), or fails with `TimedOut` when nothing is left.
    pub fn arm(&self) -> io::Result<()> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the deadline passed",
            ));
        }
        self.stream.set_timeouts(left)
    }
}

/// A blocking socket whose timeout ran out says `WouldBlock` (EAGAIN): that is the deadline.
/// Without this, a call that the socket's timeout ended (rather than `arm`, when nothing was
/// left) failed with `WouldBlock`, depending on when the last byte came.
fn timed_out(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::WouldBlock {
        io::Error::new(io::ErrorKind::TimedOut, "the deadline passed")
    } else {
        e
    }
}

impl<S: TimedStream> Read for Deadlined<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.arm()?;
        self.stream.read(buf).map_err(timed_out)
    }
}

impl<S: TimedStream> Write for Deadlined<'_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.arm()?;
        self.stream.write(buf).map_err(timed_out)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_trickling_bytes_cannot_stretch_the_deadline() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        // The peer sends one byte every 50 ms, forever (until the socket closes).
        let trickle = std::thread::spawn(move || {
            while b.write_all(&[1]).is_ok() {
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let start = Instant::now();
        let mut d = Deadlined {
            stream: &mut a,
            deadline: start + Duration::from_millis(300),
        };
        let mut buf = [0u8; 64];
        let r = d.read_exact(&mut buf);
        let took = start.elapsed();
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert!(took < Duration::from_millis(450), "took {took:?}");
        drop(a);
        trickle.join().unwrap();
    }

    /// A peer that sends nothing: the socket's own timeout ends the read, and that is the
    /// deadline too (`TimedOut`, not the socket's `WouldBlock`).
    #[test]
    fn a_silent_peer_times_out() {
        let (mut a, _b) = UnixStream::pair().unwrap();
        let start = Instant::now();
        let mut d = Deadlined {
            stream: &mut a,
            deadline: start + Duration::from_millis(100),
        };
        let mut buf = [0u8; 8];
        assert_eq!(
            d.read_exact(&mut buf).unwrap_err().kind(),
            io::ErrorKind::TimedOut
        );
        assert!(start.elapsed() >= Duration::from_millis(100));
    }
}
