//! What the group area uses of the engine while it runs a collective outside the engine's
//! loop: watching the links for dead peers, failure notices and peers that started another
//! call, and failing the communicator the way the engine would.

use std::time::{Duration, Instant};

use oxccl_transport::{Completion, RecvBuf, RecvInto};

use super::descriptor::{self, Descriptor};
use super::driver::Engine;
use super::notice;
use super::op::OpName;
use crate::error::{Error, Result};
use crate::types::Rank;

/// Why [`Engine::check_outside`] asks whether a peer has settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Look {
    /// Its next call's descriptor waits on its link.
    Ahead,
    /// Its link closed, or the liveness monitor lost it.
    Gone,
}

impl Engine {
    /// While this rank runs a collective outside the engine (the shared-area path), checks
    /// that no peer died, sent a failure notice, or started a different collective (its
    /// descriptor waiting on the link). On any of these the communicator fails, peers are
    /// told, and the error is returned.
    ///
    /// A descriptor waiting on a peer's link is a mismatch only if `settled(peer,
    /// Look::Ahead)` says that the peer has not finished this collective's part that this rank
    /// waits on: a peer that finished it (through the area, one that published this turn with
    /// our descriptor: it may read nothing from a rank this one still waits for) may already
    /// have started the next call, whose descriptor then stays on the link for the engine.
    ///
    /// A peer whose link closed, or that the liveness monitor lost, fails the call unless
    /// `settled(peer, Look::Gone)`, asked after its departure was seen, says that what this
    /// rank waits for is there after all: a peer that finished its part returns and may exit
    /// at once (the area keeps what it published). 3 ranks on 2 cores, a direct all-reduce:
    /// rank 1 waited for rank 0 to finish, was descheduled between two looks, and by its look
    /// at the links rank 0 had finished and rank 2 had returned and exited, so rank 1 reported
    /// rank 2 failed. Having published this turn is not enough there (a two-shot rank killed
    /// after publishing its copies never publishes its reduced slice).
    pub(super) fn check_outside(
        &mut self,
        name: &OpName,
        ours: &Descriptor,
        settled: &mut dyn FnMut(Rank, Look) -> bool,
    ) -> Result<()> {
        let lost = self
            .flags
            .lost()
            .filter(|&(peer, _)| !settled(peer, Look::Gone));
        let mut found: Option<Error> = lost.map(|(peer, cause)| Error::PeerFailed {
            rank: self.rank,
            peer,
            op: name.to_string(),
            cause,
        });
        for peer in (0..self.links.len()).take_while(|_| found.is_none()) {
            let Some(link) = self.links[peer].as_mut() else {
                continue;
            };
            self.polled.clear();
            let polled = link.poll(&mut self.polled);
            if let Some(Completion::Control(bytes)) = self
                .polled
                .iter()
                .find(|c| matches!(c, Completion::Control(_)))
            {
                let at = (self.rank, self.links.len());
                let (op, ours) = (name.to_string(), ours.to_string());
                found = Some(notice::decode(bytes, at, peer, op, ours));
                break;
            }
            if let Err(e) = polled {
                found = Some(Error::PeerFailed {
                    rank: self.rank,
                    peer,
                    op: name.to_string(),
                    cause: e.to_string(),
                });
                break;
            }
            if link.peer_gone() {
                if settled(peer, Look::Gone) {
                    continue;
                }
                found = Some(Error::PeerFailed {
                    rank: self.rank,
                    peer,
                    op: name.to_string(),
                    cause: "its connection closed".into(),
                });
                break;
            }
            if link.has_incoming() {
                if settled(peer, Look::Ahead) {
                    // The peer is ahead, rightly.
                    continue;
                }
                let theirs = self
                    .read_descriptor(peer)
                    .map_or("a call that is not a collective".into(), |d| d.to_string());
                if let Some(link) = self.links[peer].as_mut() {
                    let _ = link.post_control(&notice::mismatch(ours, &theirs));
                }
                let e = Error::Mismatch {
                    rank: self.rank,
                    peer,
                    op: name.to_string(),
                    ours: ours.to_string(),
                    theirs,
                };
                found = Some(e);
                break;
            }
        }
        match found {
            None => Ok(()),
            Some(e) => {
                self.fail_outside(&e);
                Err(e)
            }
        }
    }

    /// Receives the descriptor that waits on `peer`'s link (briefly; `None` if it is not one).
    fn read_descriptor(&mut self, peer: Rank) -> Option<Descriptor> {
        let link = self.links[peer].as_mut()?;
        let mut buf = [0u8; descriptor::LEN];
        // SAFETY: `buf` outlives the receive: we poll until it completes or give up, and a
        // receive given up on is cancelled (the communicator fails right after).
        unsafe {
            link.post_recv(
                u64::MAX,
                RecvInto::Memory(RecvBuf::new(buf.as_mut_ptr(), buf.len())),
            )
            .ok()?
        };
        let until = Instant::now() + Duration::from_millis(100);
        let mut out = Vec::new();
        while Instant::now() < until {
            if link.poll(&mut out).is_err() {
                break;
            }
            if out
                .iter()
                .any(|c| matches!(c, Completion::Received(u64::MAX)))
            {
                return Descriptor::decode(&buf);
            }
        }
        link.cancel();
        None
    }

    /// Fails the communicator because of `e`, found outside the engine.
    pub(super) fn fail_outside(&mut self, e: &Error) {
        let origin = match e {
            Error::PeerFailed { peer, .. } => *peer,
            _ => self.rank,
        };
        let why = e.to_string();
        self.fail(None, why.clone(), Some((origin, why)));
        self.recorder.failed(e);
    }
}
