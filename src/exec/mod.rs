//! The executor: runs one rank's schedules over its links. [`progress`] is the pure dataflow
//! state of one schedule; [`driver`] is the I/O loop around it; [`descriptor`] is what each rank
//! tells its peers it called, so mismatched calls fail instead of hanging.

pub mod area;
pub mod descriptor;
pub mod driver;
pub mod progress;
