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
        let Ok(filter) = tracing_subscriber::EnvFilter::try_new(filter) else {
            return;
        };
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    });
}
