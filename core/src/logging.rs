//! Structured logs with `tracing`, to stderr.

use tracing_subscriber::EnvFilter;

/// Installs the subscriber: `filter`, else `RUST_LOG`, else `info`.
pub fn init(filter: Option<&str>) {
    let filter = match filter {
        Some(f) => EnvFilter::new(f),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}
