//! Entry points for oxccl's fuzz tests (`src/fuzz.rs`): the link's parsing of received bytes,
//! driven without a socket. Not an API.

use oxccl_transport::{Completion, RecvBuf, RecvInto};

use crate::inbox::Inbox;
use crate::link::Broken;

/// An inbox fed from memory.
#[derive(Debug)]
pub struct InboxProbe {
    inbox: Inbox,
    memory: Vec<u8>,
    out: Vec<Completion>,
}

impl InboxProbe {
    /// An inbox for messages of up to `max_message` bytes, with room for receives of up to
    /// `memory` bytes in all.
    pub fn new(max_message: usize, memory: usize) -> std::io::Result<InboxProbe> {
        Ok(InboxProbe {
            inbox: Inbox::new(max_message)?,
            memory: vec![0; memory],
            out: Vec::new(),
        })
    }

    /// From a fresh state: posts one receive per entry of `posts` (its length, and whether it
    /// is lent; memory receives that do not fit in this probe's memory are skipped), then
    /// delivers `bytes` `chunk` bytes at a time, releasing lent messages as they complete.
    /// Returns the completions, or the inbox's protocol error.
    pub fn feed(
        &mut self,
        bytes: &[u8],
        posts: &[(usize, bool)],
        chunk: usize,
    ) -> Result<usize, String> {
        self.inbox.reset();
        self.out.clear();
        let mut used = 0;
        for (i, &(len, lend)) in posts.iter().enumerate() {
            let into = if lend {
                RecvInto::Lend { len }
            } else if used + len <= self.memory.len() {
                // SAFETY: `used..used + len` lies in `memory`, which outlives every use here
                // (the inbox is reset before the next feed), and no two receives share bytes.
                let buf = unsafe { RecvBuf::new(self.memory.as_mut_ptr().add(used), len) };
                used += len;
                RecvInto::Memory(buf)
            } else {
                continue;
            };
            self.inbox.post(i as u64, into);
        }
        let mut at = 0;
        let mut completions = 0;
        while at < bytes.len() {
            let piece = &bytes[at..(at + chunk.max(1)).min(bytes.len())];
            let taken = match self.inbox.deliver(piece, &mut self.out) {
                Ok(Some(n)) => n,
                Ok(None) => break,
                Err(Broken::Protocol(what)) => return Err(what),
                Err(Broken::Closed) => return Err("closed".into()),
                Err(Broken::Io(doing, e)) => return Err(format!("{doing}: {e}")),
            };
            for c in self.out.drain(..) {
                completions += 1;
                if let Completion::Lent { token, .. } = c {
                    self.inbox.release(token);
                }
            }
            if taken == 0 {
                break;
            }
            at += taken;
        }
        Ok(completions)
    }
}
