//! Control notices: what a failing rank tells its peers so they fail fast instead of waiting
//! for their deadline. Building a notice and reading one back into an [`Error`]; sending them
//! is the engine's job.
//!
//! A notice is one control message: a kind byte, then
//! - [`NOTICE_FAILED`]: the rank at the root of the failure (`u32`, little-endian), then what
//!   happened, as text;
//! - [`NOTICE_MISMATCH`]: the sender's descriptor, as text, then a zero byte and what the
//!   sender received from the peer it tells (its call as the sender saw it).

use super::descriptor::Descriptor;
use crate::error::Error;
use crate::types::Rank;

/// Control notice kinds (first byte of a control message).
const NOTICE_FAILED: u8 = 1;
const NOTICE_MISMATCH: u8 = 2;

/// Longest notice: a control message carries at most 4 KiB.
const MAX_BYTES: usize = 4096;

/// The notice `rank` sends when it fails: `origin` (the rank at the root of the failure) and
/// what happened.
pub(super) fn failed(rank: Rank, origin: Rank, text: &str) -> Vec<u8> {
    let mut msg = vec![NOTICE_FAILED];
    msg.extend((origin as u32).to_le_bytes());
    // Most errors name their rank first already: "rank 1: rank 1: ..." says nothing more.
    let prefix = format!("rank {rank}: ");
    if !text.starts_with(&prefix) {
        msg.extend(prefix.as_bytes());
    }
    msg.extend(text.as_bytes());
    msg.truncate(MAX_BYTES);
    msg
}

/// The notice a rank sends the peer whose call differs from its own (`ours`), having received
/// `seen` from it: the peer then names the call of its own that differed (which may not be the
/// one it runs now: a send it posted before, say), not whatever it runs.
pub(super) fn mismatch(ours: &Descriptor, seen: &str) -> Vec<u8> {
    let mut msg = vec![NOTICE_MISMATCH];
    msg.extend(ours.to_string().as_bytes());
    msg.push(0);
    msg.extend(seen.as_bytes());
    msg.truncate(MAX_BYTES);
    msg
}

/// The error that `peer`'s notice `bytes` stands for, seen by `rank` of `size` ranks while it
/// runs `op`, whose descriptor reads `ours`. A failure reported on behalf of another rank names
/// that rank (if it is a plausible one: a peer, not this rank) and says who reported it.
pub(super) fn decode(
    bytes: &[u8],
    (rank, size): (Rank, usize),
    peer: Rank,
    op: String,
    ours: String,
) -> Error {
    match bytes.first() {
        Some(&NOTICE_MISMATCH) => {
            let body = &bytes[1..];
            let (theirs, seen) = match body.iter().position(|&b| b == 0) {
                Some(i) => (&body[..i], Some(&body[i + 1..])),
                None => (body, None),
            };
            Error::Mismatch {
                rank,
                peer,
                op,
                ours: seen
                    .filter(|s| !s.is_empty())
                    .map_or(ours, |s| String::from_utf8_lossy(s).into_owned()),
                theirs: String::from_utf8_lossy(theirs).into_owned(),
            }
        }
        Some(&NOTICE_FAILED) => {
            let origin = bytes
                .get(1..5)
                .and_then(|b| b.try_into().ok())
                .map(|b| u32::from_le_bytes(b) as Rank)
                .filter(|&o| o < size && o != rank)
                .unwrap_or(peer);
            let text = String::from_utf8_lossy(bytes.get(5..).unwrap_or_default()).into_owned();
            let cause = if origin == peer {
                text
            } else {
                format!("reported by rank {peer}: {text}")
            };
            Error::PeerFailed {
                rank,
                peer: origin,
                op,
                cause,
            }
        }
        // Not a notice (a peer that speaks another protocol, or garbage): said as such, not
        // shown as the peer's failure text.
        kind => Error::Transport {
            rank,
            what: op,
            source: oxccl_transport::TransportError::Protocol {
                peer,
                what: format!(
                    "a control message that is not a notice ({} bytes, kind {kind:?})",
                    bytes.len()
                ),
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuzzed_notices_never_panic() {
        let d = Descriptor::PointToPoint {
            seq: 1,
            sends: 2,
            recvs: 3,
            tag: 4,
        };
        let seeds = vec![failed(2, 1, "it died"), mismatch(&d, "send #0 of 4 B")];
        crate::fuzz::run("notice::decode", &seeds, |b| {
            std::hint::black_box(decode(b, (0, 4), 1, "op".into(), "ours".into()));
        });
    }

    #[test]
    fn a_control_message_that_is_no_notice_is_a_protocol_error() {
        for bytes in [&b""[..], &[0x33, 0x58, 0x7d, 1, 2, 3][..]] {
            let e = decode(bytes, (0, 4), 2, "op".into(), "ours".into());
            let Error::Transport {
                rank: 0, source, ..
            } = &e
            else {
                panic!("{e:?}");
            };
            assert!(e.to_string().contains("not a notice"), "{e}");
            assert!(
                matches!(
                    source,
                    oxccl_transport::TransportError::Protocol { peer: 2, .. }
                ),
                "{source:?}"
            );
        }
    }

    #[test]
    fn a_notice_names_its_sender_once() {
        for text in ["it died", "rank 2: all_reduce #3 timed out after 1.0s"] {
            let e = decode(&failed(2, 2, text), (0, 4), 2, "op".into(), "ours".into());
            let Error::PeerFailed { peer, cause, .. } = e else {
                panic!("{e:?}");
            };
            assert_eq!(peer, 2);
            assert_eq!(cause.matches("rank 2: ").count(), 1, "{cause}");
            assert!(
                cause.ends_with(text.trim_start_matches("rank 2: ")),
                "{cause}"
            );
        }
    }
}
