//! Forwarding the ranks' output: every line a rank writes to stdout or stderr is re-emitted on
//! oxrun's own stdout or stderr with a `[rank] ` prefix, as one write under the stream's lock,
//! so lines of different ranks never interleave. It must not interpret the bytes (non-UTF-8 is
//! passed through).

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Longest line forwarded in one piece; longer ones are cut into prefixed pieces of this size.
const MAX_LINE: u64 = 64 << 10;

/// Which of oxrun's streams a rank's stream goes to.
#[derive(Clone, Copy, Debug)]
pub enum Target {
    /// oxrun's stdout.
    Stdout,
    /// oxrun's stderr.
    Stderr,
}

/// The forwarding threads, counted so oxrun can wait for the last lines before it exits.
#[derive(Clone, Default)]
pub struct Forwarders {
    open: Arc<(Mutex<usize>, Condvar)>,
}

impl Forwarders {
    /// Starts a thread that forwards `src` (a rank's pipe) line by line to `target`.
    pub fn spawn(
        &self,
        rank: usize,
        src: impl Read + Send + 'static,
        target: Target,
    ) -> std::io::Result<()> {
        *self.open.0.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        let open = self.open.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("oxrun-rank{rank}-{target:?}"))
            .spawn(move || {
                forward(&format!("[{rank}] "), src, target);
                let (count, cv) = &*open;
                *count.lock().unwrap_or_else(PoisonError::into_inner) -= 1;
                cv.notify_all();
            });
        if spawned.is_err() {
            *self.open.0.lock().unwrap_or_else(PoisonError::into_inner) -= 1;
        }
        spawned.map(drop)
    }

    /// Waits until every forwarded stream has ended (its writers all exited), or `limit`
    /// passes: a rank's background process may hold a pipe open indefinitely.
    pub fn wait(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let (count, cv) = &*self.open;
        let mut open = count.lock().unwrap_or_else(PoisonError::into_inner);
        while *open > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            open = cv
                .wait_timeout(open, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

fn forward(prefix: &str, src: impl Read, target: Target) {
    let mut reader = BufReader::new(src);
    let mut line = Vec::new();
    loop {
        line.clear();
        line.extend_from_slice(prefix.as_bytes());
        match (&mut reader).take(MAX_LINE).read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        // A closed oxrun stdout (`oxrun ... | head`) must not stop the ranks: keep draining.
        let _ = match target {
            Target::Stdout => std::io::stdout().lock().write_all(&line),
            Target::Stderr => std::io::stderr().lock().write_all(&line),
        };
    }
}
