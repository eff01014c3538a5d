//! Model checks of the lock-free protocols with loom (run with
//! `RUSTFLAGS="--cfg loom" cargo test -p oxccl-transport-shm --test loom --release`):
//! messages pass through the ring in order with no data race on a slot, and a sleeper is never
//! missed by the doorbell.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use loom::thread;
use oxccl_transport_shm::doorbell;
use oxccl_transport_shm::ring::{Consumer, Producer, RingHeader};

#[test]
fn messages_pass_in_order_without_slot_races() {
    loom::model(|| {
        let h = Arc::new(RingHeader::default());
        let slots = Arc::new([UnsafeCell::new(0u64), UnsafeCell::new(0u64)]);
        let (h2, s2) = (h.clone(), slots.clone());
        let producer = thread::spawn(move || {
            let mut p = Producer::new(2);
            let mut sent = 0u64;
            while sent < 3 {
                match p.reserve(&h2) {
                    Some(i) => {
                        // SAFETY (test): the ring protocol gives the producer this slot.
                        s2[i as usize].with_mut(|v| unsafe { *v = 100 + sent });
                        p.publish(&h2);
                        sent += 1;
                    }
                    None => thread::yield_now(),
                }
            }
        });
        let mut c = Consumer::new(2);
        let mut got = 0u64;
        while got < 3 {
            match c.peek(&h) {
                Some(i) => {
                    // SAFETY (test): the ring protocol gives the consumer this slot.
                    let v = slots[i as usize].with(|v| unsafe { *v });
                    assert_eq!(v, 100 + got);
                    c.release(&h);
                    got += 1;
                }
                None => thread::yield_now(),
            }
        }
        producer.join().unwrap();
    });
}

#[test]
fn a_sleeper_is_never_missed() {
    loom::model(|| {
        let tail = Arc::new(AtomicU64::new(0));
        let flag = Arc::new(AtomicU32::new(0));
        let (t2, f2) = (tail.clone(), flag.clone());
        let producer = thread::spawn(move || {
            t2.store(1, Ordering::Release);
            doorbell::should_ring(&f2)
        });
        doorbell::arm(&flag);
        let saw_data = tail.load(Ordering::Acquire) == 1;
        let rang = producer.join().unwrap();
        assert!(
            saw_data || rang,
            "the producer published while the consumer went to sleep unseen"
        );
    });
}
