//! The descriptor every rank sends on each link a collective uses, before its data: what the
//! sender called. A receiver that finds a different call than its own fails at once with both
//! descriptors in the error, instead of hanging or reducing the wrong bytes.

use std::fmt;

use crate::algo::{Algorithm, Collective, Plan};
use crate::types::{DataType, ReduceOp};

/// Wire size of a descriptor.
pub const LEN: usize = 48;

const MAGIC: u32 = 0x4F58_4344; // "OXCD"

/// The names of [`Descriptor::Collective`]'s `area` codes, by code (0: not through the area).
pub const AREA_WAYS: [&str; 4] = ["", "one-shot", "in pieces", "the direct way's agreement"];

// The wire form names a collective and an algorithm by their place in `ALL`, which `decode`
// indexes: the discriminants `encode` writes must be those places.
const _: () = {
    let mut i = 0;
    while i < Collective::ALL.len() {
        assert!(Collective::ALL[i] as usize == i);
        i += 1;
    }
    let mut i = 0;
    while i < Algorithm::ALL.len() {
        assert!(Algorithm::ALL[i] as usize == i);
        i += 1;
    }
};

/// What a rank called, as its peers see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Descriptor {
    /// A collective: the per-communicator sequence number and everything that shapes the
    /// messages.
    Collective {
        /// Sequence number among this communicator's collectives.
        seq: u64,
        /// The collective.
        collective: Collective,
        /// Element type.
        dtype: DataType,
        /// Operator (only compared for reducing collectives).
        op: ReduceOp,
        /// Root (only compared for rooted collectives).
        root: u32,
        /// Element count.
        count: u64,
        /// Algorithm.
        algorithm: Algorithm,
        /// Message slice size.
        slice_bytes: u32,
        /// The way through the shared group area ([`AREA_WAYS`]; 0 on links): ways whose
        /// slice sizes coincide for some sizes are still told apart.
        area: u8,
    },
    /// A point-to-point message: a send's descriptor travels ahead of its bytes; a receive's
    /// is what that one must match.
    PointToPoint {
        /// The message's number among the sender's messages to the receiver.
        seq: u64,
        /// Bytes the describing rank sends (a send's length, 0 for a receive).
        sends: u64,
        /// Bytes the describing rank receives (a receive's length, 0 for a send).
        recvs: u64,
        /// The caller's tag (torch's; 0 for NCCL's calls): a receive whose tag differs from
        /// the message's fails instead of taking another message's bytes.
        tag: u32,
    },
}

impl Descriptor {
    /// The descriptor of collective number `seq`.
    pub fn collective(
        seq: u64,
        plan: &Plan,
        algorithm: Algorithm,
        slice_bytes: usize,
    ) -> Descriptor {
        Descriptor::Collective {
            seq,
            collective: plan.collective,
            dtype: plan.dtype,
            op: if plan.collective.reduces() {
                plan.op
            } else {
                ReduceOp::Sum
            },
            root: if plan.collective.rooted() {
                plan.root as u32
            } else {
                0
            },
            count: plan.count as u64,
            algorithm,
            slice_bytes: slice_bytes as u32,
            area: 0,
        }
    }

    /// The same collective's descriptor through the group area, way `code` (an index of
    /// [`AREA_WAYS`]).
    pub fn through_area(mut self, code: u8) -> Descriptor {
        if let Descriptor::Collective { area, .. } = &mut self {
            *area = code;
        }
        self
    }

    /// Whether `theirs`, received from a peer, is consistent with `self`, this rank's call.
    pub fn matches(&self, theirs: &Descriptor) -> bool {
        match (self, theirs) {
            (
                Descriptor::PointToPoint {
                    seq,
                    sends,
                    recvs,
                    tag,
                },
                Descriptor::PointToPoint {
                    seq: s2,
                    sends: sends2,
                    recvs: recvs2,
                    tag: t2,
                },
            ) => seq == s2 && sends == recvs2 && recvs == sends2 && tag == t2,
            (a, b) => a == b,
        }
    }

    /// The wire form.
    pub fn encode(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        match *self {
            Descriptor::Collective {
                seq,
                collective,
                dtype,
                op,
                root,
                count,
                algorithm,
                slice_bytes,
                area,
            } => {
                b[4] = 1;
                // Each one's place in `ALL` (asserted at the top of this file), not searched for.
                b[5] = collective as u8;
                b[6] = dtype as u8;
                b[7] = op as u8;
                b[8] = algorithm as u8;
                b[9] = area;
                b[12..16].copy_from_slice(&root.to_le_bytes());
                b[16..24].copy_from_slice(&seq.to_le_bytes());
                b[24..32].copy_from_slice(&count.to_le_bytes());
                b[32..36].copy_from_slice(&slice_bytes.to_le_bytes());
            }
            Descriptor::PointToPoint {
                seq,
                sends,
                recvs,
                tag,
            } => {
                b[4] = 2;
                b[8..12].copy_from_slice(&tag.to_le_bytes());
                b[16..24].copy_from_slice(&seq.to_le_bytes());
                b[24..32].copy_from_slice(&sends.to_le_bytes());
                b[32..40].copy_from_slice(&recvs.to_le_bytes());
            }
        }
        b
    }

    /// Parses the wire form; `None` for anything that is not a descriptor.
    pub fn decode(b: &[u8]) -> Option<Descriptor> {
        if b.len() != LEN || b[0..4] != MAGIC.to_le_bytes() {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        match b[4] {
            1 => Some(Descriptor::Collective {
                collective: *Collective::ALL.get(b[5] as usize)?,
                dtype: DataType::from_raw(b[6] as i64)?,
                op: ReduceOp::from_raw(b[7] as i64)?,
                algorithm: *Algorithm::ALL.get(b[8] as usize)?,
                root: u32_at(12),
                seq: u64_at(16),
                count: u64_at(24),
                slice_bytes: u32_at(32),
                area: b[9],
            }),
            2 => Some(Descriptor::PointToPoint {
                seq: u64_at(16),
                sends: u64_at(24),
                recvs: u64_at(32),
                tag: u32_at(8),
            }),
            _ => None,
        }
    }
}

impl fmt::Display for Descriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Descriptor::Collective {
                seq,
                collective,
                dtype,
                op,
                root,
                count,
                algorithm,
                slice_bytes,
                area,
            } => {
                write!(f, "{collective} #{seq} of {count} × {dtype}")?;
                if collective.reduces() {
                    write!(f, " op {op}")?;
                }
                if collective.rooted() {
                    write!(f, " root {root}")?;
                }
                match AREA_WAYS.get(area as usize) {
                    Some(&"") => {
                        write!(f, " (algorithm {algorithm}, slices of {slice_bytes} B)")
                    }
                    Some(way) => write!(
                        f,
                        " (through the group area, {way}, units of {slice_bytes} B)"
                    ),
                    None => write!(
                        f,
                        " (through the group area, way {area}, units of {slice_bytes} B)"
                    ),
                }
            }
            Descriptor::PointToPoint {
                seq,
                sends,
                recvs,
                tag,
            } => {
                match (sends, recvs) {
                    (s, 0) => write!(f, "send #{seq} of {s} B")?,
                    (0, r) => write!(f, "receive #{seq} of {r} B")?,
                    (s, r) => write!(
                        f,
                        "point-to-point message #{seq} sending {s} B and receiving {r} B"
                    )?,
                }
                if tag != 0 {
                    write!(f, " with tag {tag}")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn fuzzed_descriptors_never_panic() {
        let seeds = vec![
            Descriptor::PointToPoint {
                seq: 3,
                sends: 9,
                recvs: 1 << 40,
                tag: 0,
            }
            .encode()
            .to_vec(),
            Descriptor::collective(
                12,
                &crate::algo::Plan::new(Collective::AllGather, 77, DataType::BF16).root(2),
                Algorithm::Ring,
                4096,
            )
            .encode()
            .to_vec(),
        ];
        crate::fuzz::run("Descriptor::decode", &seeds, |b| {
            std::hint::black_box(Descriptor::decode(b));
        });
    }

    use super::*;

    #[test]
    fn round_trips_and_rejects_garbage() {
        let plan = Plan::new(Collective::Broadcast, 77, DataType::BF16).root(3);
        let d = Descriptor::collective(9, &plan, Algorithm::Tree, 4096);
        assert_eq!(Descriptor::decode(&d.encode()), Some(d));
        let p = Descriptor::PointToPoint {
            seq: 2,
            sends: 10,
            recvs: 20,
            tag: 0,
        };
        assert_eq!(Descriptor::decode(&p.encode()), Some(p));
        assert_eq!(Descriptor::decode(&[0u8; LEN]), None);
        assert_eq!(Descriptor::decode(&[1u8; 3]), None);
        let mut bad = d.encode();
        bad[6] = 200;
        assert_eq!(Descriptor::decode(&bad), None);
    }

    /// Ways through the group area whose units coincide (a 128 KiB all-reduce one-shot and
    /// the direct way's agreement, of part 128 KiB) are told apart by the way's code, which
    /// travels and is named.
    #[test]
    fn ways_through_the_area_are_told_apart() {
        let plan = Plan::new(Collective::AllReduce, 32 << 10, DataType::F32);
        let base = Descriptor::collective(4, &plan, Algorithm::Direct, 128 << 10);
        let (one_shot, agree) = (base.through_area(1), base.through_area(3));
        assert!(!one_shot.matches(&agree));
        assert_ne!(one_shot.encode(), agree.encode());
        assert_eq!(Descriptor::decode(&agree.encode()), Some(agree));
        assert!(!base.matches(&one_shot));
        let text = format!("{one_shot} vs {agree}");
        assert!(
            text.contains("through the group area, one-shot")
                && text.contains("through the group area, the direct way's agreement"),
            "{text}"
        );
        assert!(
            base.to_string().contains("algorithm direct, slices of"),
            "{base}"
        );
    }

    #[test]
    fn point_to_point_matches_mirror_image() {
        let a = Descriptor::PointToPoint {
            seq: 1,
            sends: 10,
            recvs: 0,
            tag: 0,
        };
        let b = Descriptor::PointToPoint {
            seq: 1,
            sends: 0,
            recvs: 10,
            tag: 0,
        };
        assert!(a.matches(&b));
        assert!(!a.matches(&a) || a == b);
        let other_count = Plan::new(Collective::AllReduce, 5, DataType::F32);
        let mine = Descriptor::collective(
            0,
            &Plan::new(Collective::AllReduce, 4, DataType::F32),
            Algorithm::Ring,
            8,
        );
        assert!(!mine.matches(&Descriptor::collective(0, &other_count, Algorithm::Ring, 8)));
        assert!(mine.matches(&mine));
    }
}
