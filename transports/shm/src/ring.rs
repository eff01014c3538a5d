//! The single-producer single-consumer slot ring between two ranks: the protocol only (which
//! slot may be written or read when), not the bytes. The header lives in shared memory; each
//! side keeps its own cursor and a cached copy of the other side's.
//!
//! - The producer may write slot `tail % N` while `tail − head < N`, then publishes it by
//!   storing `tail + 1` (release). The consumer may read slot `head % N` while `head < tail`
//!   (acquire), then frees it by storing `head + 1` (release); the producer's acquire load of
//!   `head` orders its next write of that slot after the consumer's reads.
//! - `posted` counts the receives the consumer has posted, so the producer can tell whether the
//!   receiver is already waiting for the next message (then it may hand over an address instead
//!   of a copy: see the link).
//!
//! - `revoked` and `reading` guard messages handed over by address (the receiver reads the
//!   sender's memory): the consumer says which message it is reading before it looks whether
//!   the producer withdrew it, and the producer withdraws before it looks whether the consumer
//!   is reading (Dekker's pattern, all four accesses sequentially consistent). So a producer
//!   that withdrew its messages and then saw no read in progress knows none will start.
//!
//! Nothing here blocks, allocates or touches payload memory.

use crossbeam_utils::CachePadded;

use crate::primitive::{AtomicU64, Ordering};

/// The shared part of a ring: three counters, each on its own cache line.
#[repr(C)]
#[derive(Debug, Default)]
pub struct RingHeader {
    /// Messages published by the producer.
    pub tail: CachePadded<AtomicU64>,
    /// Messages consumed (slots freed) by the consumer.
    pub head: CachePadded<AtomicU64>,
    /// Receives posted by the consumer.
    pub posted: CachePadded<AtomicU64>,
    /// Messages before this one are withdrawn by the producer: their memory must not be read.
    pub revoked: CachePadded<AtomicU64>,
    /// `seq + 1` while the consumer reads message `seq` from the producer's memory; 0 otherwise.
    pub reading: CachePadded<AtomicU64>,
}

/// The producer's view of a ring.
#[derive(Debug)]
pub struct Producer {
    slots: u64,
    tail: u64,
    head_seen: u64,
}

impl Producer {
    /// A producer for a fresh ring of `slots` slots.
    pub fn new(slots: u64) -> Producer {
        Producer {
            slots,
            tail: 0,
            head_seen: 0,
        }
    }

    /// The slot the next message may be written to, if one is free.
    pub fn reserve(&mut self, h: &RingHeader) -> Option<u64> {
        if self.tail - self.head_seen >= self.slots {
            self.head_seen = h.head.load(Ordering::Acquire);
            if self.tail - self.head_seen >= self.slots {
                return None;
            }
        }
        Some(self.tail % self.slots)
    }

    /// Publishes the reserved slot; returns the message's sequence number (0, 1, ...).
    pub fn publish(&mut self, h: &RingHeader) -> u64 {
        let seq = self.tail;
        self.tail += 1;
        h.tail.store(self.tail, Ordering::Release);
        seq
    }

    /// Messages the consumer has finished with (refreshed from shared memory).
    pub fn consumed(&mut self, h: &RingHeader) -> u64 {
        self.head_seen = h.head.load(Ordering::Acquire);
        self.head_seen
    }

    /// Messages published so far.
    pub fn published(&self) -> u64 {
        self.tail
    }

    /// Whether the consumer has posted a receive for message `seq`.
    pub fn receiver_waiting_for(&self, h: &RingHeader, seq: u64) -> bool {
        h.posted.load(Ordering::Acquire) > seq
    }

    /// Withdraws every message published so far: the consumer will not start reading one from
    /// this side's memory. Returns whether a read may still be under way (then wait until
    /// [`Producer::read_in_progress`] says no).
    pub fn revoke(&mut self, h: &RingHeader) -> bool {
        h.revoked.store(self.tail, Ordering::SeqCst);
        self.read_in_progress(h)
    }

    /// Whether the consumer is reading one of this side's messages from its memory.
    pub fn read_in_progress(&self, h: &RingHeader) -> bool {
        h.reading.load(Ordering::SeqCst) != 0
    }
}

/// The consumer's view of a ring.
#[derive(Debug)]
pub struct Consumer {
    slots: u64,
    head: u64,
    tail_seen: u64,
    posted: u64,
}

impl Consumer {
    /// A consumer for a fresh ring of `slots` slots.
    pub fn new(slots: u64) -> Consumer {
        Consumer {
            slots,
            head: 0,
            tail_seen: 0,
            posted: 0,
        }
    }

    /// The slot of the next unread message, if one has been published.
    pub fn peek(&mut self, h: &RingHeader) -> Option<u64> {
        if self.head == self.tail_seen {
            self.tail_seen = h.tail.load(Ordering::Acquire);
            if self.head == self.tail_seen {
                return None;
            }
        }
        Some(self.head % self.slots)
    }

    /// Frees the slot of the oldest message: the producer may reuse it.
    pub fn release(&mut self, h: &RingHeader) {
        self.head += 1;
        h.head.store(self.head, Ordering::Release);
    }

    /// Messages consumed so far.
    pub fn consumed(&self) -> u64 {
        self.head
    }

    /// Before reading the oldest message from the producer's memory: says so, and returns
    /// false (saying so no more) if the producer withdrew it. [`Consumer::end_read`] follows a
    /// `true`.
    pub fn begin_read(&mut self, h: &RingHeader) -> bool {
        h.reading.store(self.head + 1, Ordering::SeqCst);
        if h.revoked.load(Ordering::SeqCst) > self.head {
            h.reading.store(0, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// After reading a message from the producer's memory.
    pub fn end_read(&mut self, h: &RingHeader) {
        h.reading.store(0, Ordering::SeqCst);
    }

    /// Records one more posted receive for the producer to see.
    pub fn post(&mut self, h: &RingHeader) {
        self.posted += 1;
        h.posted.store(self.posted, Ordering::Release);
    }

    /// Whether messages are published but not yet released (as last seen, or now).
    pub fn has_unread(&mut self, h: &RingHeader) -> bool {
        self.head < self.tail_seen || {
            self.tail_seen = h.tail.load(Ordering::Acquire);
            self.head < self.tail_seen
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn slots_cycle_and_the_producer_waits_for_the_consumer() {
        let h = RingHeader::default();
        let (mut p, mut c) = (Producer::new(2), Consumer::new(2));
        assert_eq!(c.peek(&h), None);
        assert_eq!(p.reserve(&h), Some(0));
        assert_eq!(p.publish(&h), 0);
        assert_eq!(p.reserve(&h), Some(1));
        p.publish(&h);
        assert_eq!(p.reserve(&h), None, "both slots full");
        assert_eq!(c.peek(&h), Some(0));
        c.release(&h);
        assert_eq!(p.reserve(&h), Some(0));
        assert_eq!(p.consumed(&h), 1);
        assert_eq!(c.peek(&h), Some(1));
        assert!(!p.receiver_waiting_for(&h, 2));
        c.post(&h);
        c.post(&h);
        c.post(&h);
        assert!(p.receiver_waiting_for(&h, 2));
    }
}
