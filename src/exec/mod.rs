//! The executor: runs one rank's schedules over its links. [`progress`] is the pure dataflow
//! state of one schedule; [`driver`] is the I/O loop around it; [`descriptor`] is what each rank
//! tells its peers it called, so mismatched calls fail instead of hanging.
//!
//! Around them: [`op`] says what an operation is and where its result goes; [`flags`] holds the
//! abort flag and waker shared with `abort()`; `notice` encodes and decodes the failure notices
//! ranks send each other; `backoff` is the spin → yield → sleep escalation every wait uses;
//! [`area`] runs all-reduces through the shared group area, watching links through what
//! `outside` lends it of the engine.

pub mod area;
mod backoff;
mod batch;
pub mod descriptor;
pub mod driver;
pub mod flags;
mod notice;
pub mod op;
mod outside;
pub mod progress;
