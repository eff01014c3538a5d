//! Starting local ranks as child processes — what every launcher of oxccl jobs shares
//! (`oxrun`, `allreduce-perf`'s standalone mode): a rank dies with its launcher, and may be
//! bound to a core of its own.
//!
//! Binding matters on small machines: two ranks that busy-wait for each other and that the
//! scheduler happens to put on one core turn every exchange into a context switch (measured
//! here: 8-byte all-reduce over shared memory at 25 µs instead of 2 µs in such runs). So, as
//! mpirun does, ranks are bound one per core when there are no more of them than cores.

use std::process::Command;

/// Whether launched ranks are bound to cores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bind {
    /// One core per rank when ranks fit the available cores; none otherwise.
    Core,
    /// Leave placement to the scheduler.
    None,
}

impl std::str::FromStr for Bind {
    type Err = String;

    fn from_str(s: &str) -> Result<Bind, String> {
        match s {
            "core" => Ok(Bind::Core),
            "none" => Ok(Bind::None),
            _ => Err(format!("unknown binding {s:?} (core or none)")),
        }
    }
}

/// The core each of `nranks` local ranks should run on: this process's allowed CPUs in order,
/// one per rank, or `None` when `bind` is `None` or there are more ranks than CPUs.
pub fn cpu_plan(nranks: usize, bind: Bind) -> Option<Vec<usize>> {
    if bind == Bind::None {
        return None;
    }
    let allowed = rustix::thread::sched_getaffinity(None).ok()?;
    let cpus: Vec<usize> = (0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&c| allowed.is_set(c))
        .collect();
    (nranks <= cpus.len()).then(|| cpus[..nranks].to_vec())
}

/// Makes the child `cmd` starts die with this process (`PR_SET_PDEATHSIG`, which fires when
/// the *thread* that spawns exits: spawn from a thread that lives as long as the launcher) and
/// binds it to `cpu` if given (and one this system can name).
pub fn prepare(cmd: &mut Command, cpu: Option<usize>) {
    let parent = rustix::process::getpid();
    let mut set = rustix::thread::CpuSet::new();
    // A CPU beyond what the set can name is left unbound rather than a panic.
    let cpu = cpu.filter(|&c| c < rustix::thread::CpuSet::MAX_CPU);
    if let Some(c) = cpu {
        set.set(c);
    }
    // SAFETY: the closure runs in the child between fork and exec, where only async-signal-safe
    // work is allowed: it makes raw system calls through rustix (prctl, getppid,
    // sched_setaffinity) on values prepared before the fork, and builds an io::Error from an
    // errno, which does not allocate; it takes no lock and touches no shared state.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, move || {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
            // The launcher may have died before the line above took effect.
            if rustix::process::getppid() != Some(parent) {
                return Err(std::io::Error::from_raw_os_error(
                    rustix::io::Errno::SRCH.raw_os_error(),
                ));
            }
            if cpu.is_some() {
                rustix::thread::sched_setaffinity(None, &set)?;
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_one_core_per_rank_only_when_they_fit() {
        let all = cpu_plan(1, Bind::Core).expect("at least one cpu");
        assert_eq!(all.len(), 1);
        assert_eq!(cpu_plan(100_000, Bind::Core), None);
        assert_eq!(cpu_plan(1, Bind::None), None);
        assert_eq!("core".parse::<Bind>(), Ok(Bind::Core));
        assert!("socket".parse::<Bind>().is_err());
    }
}

/// A job's flight-recorder directory, as a launcher keeps it: every rank dumps there
/// (`OXCCL_TRACE_DIR`), and when the job fails the launcher asks the ranks still running for
/// their dumps too and prints who is to blame ([`crate::trace::blame`]).
#[derive(Debug)]
pub struct TraceDir {
    path: std::path::PathBuf,
    /// Made for this job (removed when the job succeeds), not the user's `OXCCL_TRACE_DIR`.
    made: bool,
    /// Dumps older than the job are not its.
    since_unix_ns: u128,
}

impl TraceDir {
    /// The user's `OXCCL_TRACE_DIR`, or else a new private directory under the temporary one.
    pub fn for_job() -> std::io::Result<TraceDir> {
        use std::os::unix::fs::DirBuilderExt;
        let since_unix_ns = unix_ns();
        if let Some(d) = std::env::var_os("OXCCL_TRACE_DIR").filter(|d| !d.is_empty()) {
            return Ok(TraceDir {
                path: d.into(),
                made: false,
                since_unix_ns,
            });
        }
        let path = std::env::temp_dir().join(format!(
            "oxccl-job-{}-{}",
            std::process::id(),
            since_unix_ns % 1_000_000_000
        ));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(TraceDir {
            path,
            made: true,
            since_unix_ns,
        })
    }

    /// The directory.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Gives a rank's command the directory.
    pub fn apply(&self, cmd: &mut Command) {
        cmd.env("OXCCL_TRACE_DIR", &self.path);
    }

    /// This job's dumps.
    fn dumps(&self) -> Vec<crate::trace::Trace> {
        crate::trace::Trace::read_dir(&self.path)
            .unwrap_or_default()
            .into_iter()
            .filter(|t| u128::from(t.start_unix_ns) + u128::from(t.dumped_ns) >= self.since_unix_ns)
            .collect()
    }

    /// After a failure: when some rank left a dump (or `hung`: the job ran past its time),
    /// sends SIGUSR1 to the process of each rank in `running` (rank, pid) so that it dumps
    /// too, waits up to a second for those dumps, and returns one line per communicator
    /// saying who the job waited for. Empty when no rank left a dump (not an oxccl program,
    /// or it failed outside any collective).
    pub fn blame(&self, running: &[(usize, rustix::process::Pid)], hung: bool) -> Vec<String> {
        if !hung && self.dumps().is_empty() {
            return Vec::new();
        }
        let asked = unix_ns();
        for &(_, pid) in running {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::USR1);
        }
        let until = std::time::Instant::now() + std::time::Duration::from_secs(1);
        let mut dumps = self.dumps();
        while std::time::Instant::now() < until {
            let fresh = |r: usize| {
                dumps.iter().any(|t| {
                    t.rank == r && u128::from(t.start_unix_ns) + u128::from(t.dumped_ns) >= asked
                })
            };
            if running.iter().all(|&(r, _)| fresh(r)) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            dumps = self.dumps();
        }
        let comms = crate::trace::blame(&dumps);
        let many = comms.len() > 1;
        comms
            .into_iter()
            .map(|(comm, line)| {
                if many {
                    format!("communicator {comm}: {line}")
                } else {
                    line
                }
            })
            .collect()
    }

    /// Removes the directory if this job made it (after a success: nothing to look at).
    pub fn remove(self) {
        if self.made {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

fn unix_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}
