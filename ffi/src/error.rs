//! Errors of the DPDK layer. Each message names the call or argument at fault.

use crate::ids::PortId;
use crate::keep::Holders;

/// Result of a DPDK operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong in a DPDK call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The EAL refused its arguments or could not start.
    #[error("DPDK EAL initialisation failed: {reason}\n  hint: {hint}\n  arguments: {args}{}", fmt_log(.log))]
    EalInit {
        /// The arguments given to the EAL, space-separated.
        args: String,
        /// DPDK's error code, as text.
        reason: String,
        /// What to change, derived from the error code and DPDK's own log.
        hint: String,
        /// What DPDK logged while initialising.
        log: String,
    },
    /// The EAL can be initialised once per process.
    #[error(
        "the DPDK EAL is already initialised in this process (DPDK allows one initialisation per process, \
         even after a shutdown)"
    )]
    EalAlreadyInitialised,
    /// `Eal::shutdown` while something still holds the EAL.
    #[error(
        "cannot shut the DPDK EAL down: still held by {holders}; drop them first \
         (the EAL is cleaned up when the last of them is dropped, unless a mempool was leaked)"
    )]
    EalInUse {
        /// What holds the EAL.
        holders: Holders,
    },
    /// An argument contained a NUL byte and cannot be passed to C.
    #[error("argument {0:?} contains a NUL byte")]
    NulInArgument(String),
    /// A DPDK call returned an error code.
    #[error("{call}({what}) failed: {reason} (errno {errno})")]
    Call {
        /// The DPDK function.
        call: &'static str,
        /// The object it acted on.
        what: String,
        /// The error code.
        errno: i32,
        /// The error code, as text.
        reason: String,
    },
    /// No port has that name.
    #[error("no DPDK port named {name:?} (known ports: {known}); check the --vdev/-a EAL arguments or the device name")]
    NoSuchPort {
        /// The name asked for.
        name: String,
        /// The names of the ports that exist.
        known: String,
    },
    /// A port cannot be configured as asked.
    #[error("port {port}: {reason}")]
    PortConfig {
        /// The port.
        port: PortId,
        /// Why not.
        reason: String,
    },
    /// A port cannot get the MTU asked for.
    #[error("port {port} ({device}): MTU {requested} asked, the device has {actual}: {reason}")]
    Mtu {
        /// The port.
        port: PortId,
        /// The device name.
        device: String,
        /// The MTU asked for.
        requested: u16,
        /// The device's MTU.
        actual: u16,
        /// Why it was not set.
        reason: String,
    },
    /// An lcore cannot run a task.
    #[error("lcore {lcore}: {reason}")]
    Lcore {
        /// The lcore.
        lcore: u32,
        /// Why not.
        reason: String,
    },
}

fn fmt_log(log: &str) -> String {
    if log.trim().is_empty() {
        String::new()
    } else {
        format!("\n  DPDK said:\n    {}", log.trim_end().replace('\n', "\n    "))
    }
}

/// Text for a DPDK or libc error code.
pub(crate) fn strerror(errno: i32) -> String {
    // SAFETY: rte_strerror accepts any value and returns a pointer to a
    // NUL-terminated string in a static or thread-local buffer, copied at once.
    let p = unsafe { crate::sys::rte_strerror(errno) };
    if p.is_null() {
        return format!("error {errno}");
    }
    // SAFETY: `p` is non-null and NUL-terminated (see above).
    unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The calling thread's `rte_errno`.
pub(crate) fn rte_errno() -> i32 {
    // SAFETY: reads a thread-local integer; no preconditions.
    unsafe { crate::sys::sluice_errno() }
}

/// Builds an [`Error::Call`] from a negative return code or `rte_errno`.
pub(crate) fn call_error(call: &'static str, what: impl Into<String>, ret: i32) -> Error {
    let errno = if ret < 0 { -ret } else { rte_errno() };
    Error::Call { call, what: what.into(), errno, reason: strerror(errno) }
}
