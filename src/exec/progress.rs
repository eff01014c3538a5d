//! The dataflow state of one schedule on one rank: which steps are done, which may start, and
//! what must be posted on which link next. Pure: no I/O, no clocks, no transports — the driver
//! feeds it completions (`handle_*`) and asks it what to do (`poll_*`).
//!
//! It enforces the schedule's rules (see `algo::Schedule`): a step starts once its dependencies
//! are done, and the sends (and the receives) of one link are posted in step order.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::algo::{Op, Region, Schedule, StepId};
use crate::types::Rank;

/// Something the driver must do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Post a send of `src` to `peer`.
    Send {
        /// The step.
        step: StepId,
        /// Destination.
        peer: Rank,
        /// What to send.
        src: Region,
    },
    /// Post a receive from `peer`. For a plain receive the message goes straight into `dst`;
    /// for a reducing one (`reduce` is `Some`) the transport lends it and the driver stores
    /// `dst = src ⊕ message`.
    Recv {
        /// The step.
        step: StepId,
        /// Source.
        peer: Rank,
        /// The step's operation (`Recv` or `RecvReduce`).
        op: Op,
    },
    /// Run a local step (`Copy`, `Reduce`, `Divide`) and report it done.
    Local {
        /// The step.
        step: StepId,
        /// The operation.
        op: Op,
    },
}

/// One link's sends and receives, in step order.
#[derive(Debug)]
struct LinkSteps {
    peer: Rank,
    sends: Vec<StepId>,
    recvs: Vec<StepId>,
}

/// A schedule with the indexes [`Progress`] needs, computed once per schedule (the executor
/// caches it with the schedule) so that starting an operation allocates little.
#[derive(Debug)]
pub struct Compiled {
    schedule: Schedule,
    /// Unfinished dependencies of each step at the start.
    initial: Vec<u32>,
    /// Dependents in CSR form.
    offsets: Vec<u32>,
    dependents: Vec<StepId>,
    /// Link index of each message step (`u32::MAX` for local steps).
    link_of: Vec<u32>,
    links: Vec<LinkSteps>,
    peers: Vec<Rank>,
}

impl Compiled {
    /// Indexes `schedule`.
    pub fn new(schedule: Schedule) -> Compiled {
        let n = schedule.len();
        let mut initial = vec![0u32; n];
        let mut counts = vec![0u32; n + 1];
        let mut link_of = vec![u32::MAX; n];
        let mut links: Vec<LinkSteps> = Vec::new();
        for (i, step) in schedule.steps().iter().enumerate() {
            let deps = schedule.deps(i as StepId);
            initial[i] = deps.len() as u32;
            for &d in deps {
                counts[d as usize + 1] += 1;
            }
            if let Some(peer) = step.op.peer() {
                let li = match links.iter().position(|l| l.peer == peer) {
                    Some(li) => li,
                    None => {
                        links.push(LinkSteps {
                            peer,
                            sends: Vec::new(),
                            recvs: Vec::new(),
                        });
                        links.len() - 1
                    }
                };
                link_of[i] = li as u32;
                if step.op.is_receive() {
                    links[li].recvs.push(i as StepId);
                } else {
                    links[li].sends.push(i as StepId);
                }
            }
        }
        for i in 0..n {
            counts[i + 1] += counts[i];
        }
        let mut fill = counts.clone();
        let mut dependents = vec![0; counts[n] as usize];
        for i in 0..n {
            for &d in schedule.deps(i as StepId) {
                dependents[fill[d as usize] as usize] = i as StepId;
                fill[d as usize] += 1;
            }
        }
        let peers = schedule.peers();
        Compiled {
            schedule,
            initial,
            offsets: counts,
            dependents,
            link_of,
            links,
            peers,
        }
    }

    /// The schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The peers the schedule exchanges messages with, ascending.
    pub fn peers(&self) -> &[Rank] {
        &self.peers
    }
}

const READY: u8 = 1;
const DONE: u8 = 2;

/// Progress of one schedule.
#[derive(Debug)]
pub struct Progress {
    c: Arc<Compiled>,
    /// Unfinished dependencies per step.
    remaining: Vec<u32>,
    /// READY (dependencies done) and DONE bits per step.
    flags: Vec<u8>,
    /// Per link, sends and receives posted so far.
    posted: Vec<(u32, u32)>,
    /// Steps that can be acted on now.
    actionable: VecDeque<StepId>,
    left: usize,
}

impl Progress {
    /// Starts tracking a schedule: the steps without dependencies become actionable.
    pub fn new(c: Arc<Compiled>) -> Progress {
        let n = c.schedule.len();
        let mut p = Progress {
            remaining: c.initial.clone(),
            flags: vec![0; n],
            posted: vec![(0, 0); c.links.len()],
            actionable: VecDeque::new(),
            left: n,
            c,
        };
        for i in 0..n {
            if p.remaining[i] == 0 {
                p.became_ready(i as StepId);
            }
        }
        p
    }

    /// The schedule being run.
    pub fn schedule(&self) -> &Schedule {
        &self.c.schedule
    }

    /// Whether every step is done.
    pub fn is_done(&self) -> bool {
        self.left == 0
    }

    /// The next thing to do, if any. Message steps come out in link order.
    pub fn poll_action(&mut self) -> Option<Action> {
        let step = self.actionable.pop_front()?;
        let op = self.c.schedule.steps()[step as usize].op;
        Some(match op {
            Op::Send { to, src } => {
                self.posted(step);
                Action::Send {
                    step,
                    peer: to,
                    src,
                }
            }
            Op::Recv { from, .. } | Op::RecvReduce { from, .. } => {
                self.posted(step);
                Action::Recv {
                    step,
                    peer: from,
                    op,
                }
            }
            _ => Action::Local { step, op },
        })
    }

    /// Records that `step` finished (its send left, its receive was applied, its local work
    /// ran); its dependents may become actionable.
    pub fn handle_done(&mut self, step: StepId) {
        let s = step as usize;
        if self.flags[s] & DONE != 0 {
            return;
        }
        self.flags[s] |= DONE;
        self.left -= 1;
        let c = self.c.clone();
        for &d in &c.dependents[c.offsets[s] as usize..c.offsets[s + 1] as usize] {
            self.remaining[d as usize] -= 1;
            if self.remaining[d as usize] == 0 {
                self.became_ready(d);
            }
        }
    }

    /// Steps finished so far.
    pub fn done_steps(&self) -> usize {
        self.c.schedule.len() - self.left
    }

    /// Peers this rank still expects messages from: whom a stuck rank is waiting for.
    pub fn waiting_for(&self) -> impl Iterator<Item = Rank> + '_ {
        self.c
            .links
            .iter()
            .filter(|l| l.recvs.iter().any(|&s| self.flags[s as usize] & DONE == 0))
            .map(|l| l.peer)
    }

    /// A step's dependencies are done: local steps are actionable at once, message steps when
    /// they are next on their link.
    fn became_ready(&mut self, step: StepId) {
        self.flags[step as usize] |= READY;
        let li = self.c.link_of[step as usize];
        if li == u32::MAX {
            self.actionable.push_back(step);
            return;
        }
        let (l, (sent, received)) = (&self.c.links[li as usize], self.posted[li as usize]);
        let next = if self.c.schedule.steps()[step as usize].op.is_receive() {
            l.recvs.get(received as usize)
        } else {
            l.sends.get(sent as usize)
        };
        if next == Some(&step) {
            self.actionable.push_back(step);
        }
    }

    /// A message step was handed to the driver: advance its link and release the next step of
    /// the same direction if it is already ready.
    fn posted(&mut self, step: StepId) {
        let li = self.c.link_of[step as usize] as usize;
        let receive = self.c.schedule.steps()[step as usize].op.is_receive();
        let l = &self.c.links[li];
        let cursor = &mut self.posted[li];
        let next = if receive {
            cursor.1 += 1;
            l.recvs.get(cursor.1 as usize).copied()
        } else {
            cursor.0 += 1;
            l.sends.get(cursor.0 as usize).copied()
        };
        if let Some(n) = next
            && self.flags[n as usize] & READY != 0
        {
            self.actionable.push_back(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{self, Algorithm, Buffer, Choice, Collective, Plan};
    use crate::types::DataType;

    fn region(off: usize) -> Region {
        Region::new(Buffer::Output, off, 4)
    }

    #[test]
    fn sends_of_a_link_are_posted_in_order_even_when_later_ones_are_ready_first() {
        // Step 0: a local copy; step 1: a send that waits for it; step 2: a send with no deps.
        let s = Schedule::from_steps(
            [
                (
                    Op::Copy {
                        dst: region(0),
                        src: Region::new(Buffer::Input, 0, 4),
                    },
                    vec![],
                ),
                (
                    Op::Send {
                        to: 1,
                        src: region(0),
                    },
                    vec![0],
                ),
                (
                    Op::Send {
                        to: 1,
                        src: region(8),
                    },
                    vec![],
                ),
            ],
            0,
        );
        let mut p = Progress::new(Arc::new(Compiled::new(s)));
        assert!(matches!(
            p.poll_action(),
            Some(Action::Local { step: 0, .. })
        ));
        assert_eq!(
            p.poll_action(),
            None,
            "step 2 must wait for step 1 on the same link"
        );
        p.handle_done(0);
        assert!(matches!(
            p.poll_action(),
            Some(Action::Send {
                step: 1,
                peer: 1,
                ..
            })
        ));
        assert!(matches!(
            p.poll_action(),
            Some(Action::Send {
                step: 2,
                peer: 1,
                ..
            })
        ));
        assert!(!p.is_done());
        p.handle_done(1);
        p.handle_done(2);
        assert!(p.is_done());
    }

    #[test]
    fn receives_wait_for_their_dependencies_and_report_whom_they_wait_for() {
        let s = Schedule::from_steps(
            [
                (
                    Op::Recv {
                        from: 2,
                        dst: region(0),
                    },
                    vec![],
                ),
                (
                    Op::Recv {
                        from: 3,
                        dst: region(4),
                    },
                    vec![0],
                ),
            ],
            0,
        );
        let mut p = Progress::new(Arc::new(Compiled::new(s)));
        assert!(matches!(
            p.poll_action(),
            Some(Action::Recv {
                step: 0,
                peer: 2,
                ..
            })
        ));
        assert_eq!(p.poll_action(), None);
        assert_eq!(p.waiting_for().collect::<Vec<_>>(), vec![2, 3]);
        p.handle_done(0);
        assert!(matches!(
            p.poll_action(),
            Some(Action::Recv {
                step: 1,
                peer: 3,
                ..
            })
        ));
        assert_eq!(p.waiting_for().collect::<Vec<_>>(), vec![3]);
    }

    #[test]
    fn a_real_schedule_runs_to_completion_when_every_action_completes_at_once() {
        // With every posted operation completing immediately (a perfect partner), every step
        // must eventually be offered exactly once.
        let plan = Plan::new(Collective::AllReduce, 1000, DataType::F32);
        for algorithm in Algorithm::ALL {
            let choice = Choice::new(algorithm).slice_bytes(256);
            let s = Arc::new(Compiled::new(algo::schedule(&plan, &choice, 1, 5).unwrap()));
            let mut p = Progress::new(s.clone());
            let mut seen = vec![false; s.schedule().len()];
            while let Some(a) = p.poll_action() {
                let step = match a {
                    Action::Send { step, .. }
                    | Action::Recv { step, .. }
                    | Action::Local { step, .. } => step,
                };
                assert!(
                    !seen[step as usize],
                    "{algorithm}: step {step} offered twice"
                );
                seen[step as usize] = true;
                p.handle_done(step);
            }
            assert!(p.is_done(), "{algorithm}: stuck");
        }
    }
}
