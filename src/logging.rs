//! Logging: oxccl reports through `tracing` (targets `oxccl::*`). If `OXCCL_LOG` is set (a
//! filter such as `oxccl=debug`) and the application has not installed a subscriber, the first
//! communicator installs one writing to stderr, like `NCCL_DEBUG`.

use std::sync::Once;

/// Installs the `OXCCL_LOG` subscriber once, if asked for and if none is installed.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Ok(filter) = std::env::var("OXCCL_LOG") else {
            return;
        };
        let filter = match tracing_subscriber::EnvFilter::try_new(&filter) {
            Ok(f) => f,
            Err(e) => {
                // No subscriber to say it through: one line on stderr, as NCCL_DEBUG's
                // warnings go (a debugging switch that is wrong should not stop the job).
                eprintln!("oxccl: OXCCL_LOG {filter:?} is not a log filter ({e}); not logging");
                return;
            }
        };
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    });
}
