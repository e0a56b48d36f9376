//! The DPDK Environment Abstraction Layer: initialisation, lcores, the
//! launch of tasks on them, and cleanup.
//!
//! Ownership rules:
//! - DPDK allows one EAL per process. [`Eal`] is its one handle, and it is
//!   `!Send + !Sync`: it stays on the thread that initialised the EAL (the
//!   main lcore), so launching and waiting for lcore tasks, which DPDK
//!   allows only there, cannot happen anywhere else.
//! - Everything that needs the EAL holds an internal, `Send + Sync`
//!   keep-alive instead of an `Eal`: mempools, ports (through the `Port`, its
//!   queues and its statistics readers), rings and launched tasks. The
//!   handle gives them out from the keep-alive registry (module `keep`),
//!   which counts them by kind.
//!   `rte_eal_cleanup` runs when the `Eal` and every keep-alive are gone:
//!   either at once with [`Eal::shutdown`], which refuses while anything
//!   else holds the EAL and says what, or when the last holder is dropped.
//! - An [`Mbuf`](crate::Mbuf) holds nothing (it is one pointer). It stays
//!   valid because its pool is freed only when every mbuf is back, and a
//!   pool dropped earlier is leaked together with its keep-alive: the EAL is
//!   then never cleaned up, since live mbufs point into its memory.
//! - A task launched with [`Eal::launch`] gets a stop flag it is expected to
//!   poll. [`LcoreTask::wait`] waits for it; dropping the `LcoreTask`
//!   without waiting sets the flag first, so an error on the main lcore
//!   cannot leave it waiting for a task nobody told to stop.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::fmt;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::{call_error, rte_errno, strerror, Error, Result};
pub use crate::ids::LcoreId;
use crate::ids::PortId;
pub use crate::keep::Holders;
use crate::keep::{EalShared, Holder, KeepAlive};
use crate::sys;

static INITIALISED: AtomicBool = AtomicBool::new(false);

/// The handle to the initialised EAL, on the main lcore.
///
/// It cannot leave the thread that initialised the EAL:
///
/// ```compile_fail,E0277
/// fn send<T: Send>() {}
/// send::<sluice_ffi::Eal>();
/// ```
///
/// nor be shared with another thread:
///
/// ```compile_fail,E0277
/// fn sync<T: Sync>() {}
/// sync::<sluice_ffi::Eal>();
/// ```
///
/// while what it creates can (this compiles):
///
/// ```
/// fn send_sync<T: Send + Sync>() {}
/// send_sync::<sluice_ffi::Mempool>();
/// send_sync::<sluice_ffi::Ring>();
/// send_sync::<sluice_ffi::PortStatsReader>();
/// ```
pub struct Eal {
    shared: Arc<EalShared>,
    log: String,
    /// `!Send + !Sync`: main-lcore calls go through this handle only.
    _main_lcore_only: PhantomData<*const ()>,
}

impl fmt::Debug for Eal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Eal").field("lcores", &self.lcores()).field("holders", &self.holders()).finish()
    }
}

/// True for lines of DPDK's usage text, which it prints on any bad option.
fn is_usage_line(l: &str) -> bool {
    l.is_empty()
        || l.starts_with(char::is_whitespace)
        || l.starts_with("Usage:")
        || (l.starts_with("EAL ") && l.ends_with(':'))
        || l == "SIMD bitwidth"
}

/// What DPDK printed, without its usage text.
fn meaningful(output: &str) -> String {
    output.lines().filter(|l| !is_usage_line(l)).collect::<Vec<_>>().join("\n")
}

/// The argument that names `needle`, if any.
fn arg_naming<'a>(args: &[&'a str], needle: &str) -> Option<&'a str> {
    args.iter().copied().find(|a| a.contains(needle))
}

fn quoted(line: &str) -> Option<&str> {
    let start = line.find(['"', '\''])? + 1;
    let end = start + line[start..].find(['"', '\''])?;
    Some(&line[start..end])
}

/// What to change, from the error code and the error lines DPDK printed.
fn hint_for(errno: i32, log: &str, args: &[&str]) -> String {
    for line in log.lines() {
        let lower = line.to_ascii_lowercase();
        if lower.contains("unrecognized option") || lower.contains("invalid option") {
            let opt = quoted(line).unwrap_or("?");
            return format!("argument `{opt}` is not an EAL option (`dpdk-testpmd --help` lists them)");
        }
        if lower.contains("requires an argument") {
            let opt = quoted(line).unwrap_or("?");
            let dash = if opt.len() == 1 { "-" } else { "" };
            return format!("argument `{dash}{opt}` needs a value");
        }
        if lower.contains("failed to parse device") || lower.contains("unable to parse device") {
            let dev = quoted(line).unwrap_or("?");
            let arg = arg_naming(args, dev).unwrap_or(dev);
            return format!(
                "argument `{arg}`: no driver is named `{dev}`; virtual devices are net_null<N>, \
                 net_ring<N>, net_tap<N>, net_af_packet<N>,iface=<if>, net_af_xdp<N>,iface=<if>, \
                 net_memif<N> (a PCI device goes with -a <domain:bus:dev.fn>)"
            );
        }
        if lower.contains("lcore") && (lower.contains("unavailable") || lower.contains("invalid core")) {
            let arg = args
                .iter()
                .position(|a| *a == "-l" || *a == "--lcores" || *a == "-c")
                .and_then(|i| args.get(i..i + 2))
                .map(|p| p.join(" "))
                .or_else(|| arg_naming(args, "-l").map(str::to_owned))
                .unwrap_or_else(|| "-l".into());
            return format!("argument `{arg}`: every listed core must exist on this machine ({line})");
        }
        if lower.contains("cannot get hugepage information") || lower.contains("not enough memory available") {
            return "no usable hugepages: pass --no-huge (with -m <MB>), or reserve them \
                    (echo 512 > /proc/sys/vm/nr_hugepages) and mount hugetlbfs"
                .into();
        }
        if lower.contains("cannot create lock") || lower.contains("is another primary process running") {
            return "another DPDK process uses the same runtime directory: give each process its \
                    own --file-prefix"
                .into();
        }
        if lower.contains("cannot init memzone") || lower.contains("fbarray") {
            let prefix = args.iter().find_map(|a| a.strip_prefix("--file-prefix=")).unwrap_or("rte");
            return format!(
                "DPDK's runtime files for --file-prefix={prefix} are held by another process: a DPDK \
                 process with the same prefix, or one that inherited them from an earlier run that \
                 was killed (`fuser -v /var/run/dpdk/{prefix}/*` names it)"
            );
        }
    }
    // DPDK's own words, when it said why, before a guess from the code
    // (ENODEV is what it returns for most failures of its memory set-up).
    if let Some(line) = failure_line(log) {
        return format!("DPDK said: {line}");
    }
    match errno {
        libc::EACCES | libc::EPERM => {
            "permission denied: run as root (or with the capabilities DPDK needs)".into()
        }
        libc::ENOMEM => "not enough memory: lower -m, use --no-huge, or reserve more hugepages".into(),
        libc::EALREADY => "the EAL is already initialised in this process".into(),
        libc::ENODEV => "no device matched: check the --vdev/-a arguments".into(),
        _ => "see what DPDK said below".into(),
    }
}

/// The line of DPDK's start-up log that says why it failed, if one does.
fn failure_line(log: &str) -> Option<&str> {
    log.lines().map(str::trim).filter(|l| !l.is_empty() && !l.contains("FATAL")).rfind(|l| {
        let lower = l.to_ascii_lowercase();
        ["cannot", "error", "failed", "fail to", "unable"].iter().any(|w| lower.contains(w))
    })
}

/// The Ethernet vdevs (`--vdev=net_...`) the arguments ask for.
fn requested_net_vdevs<'a>(args: &[&'a str]) -> Vec<(&'a str, &'a str)> {
    let mut out = Vec::new();
    let mut it = args.iter().copied().peekable();
    while let Some(a) = it.next() {
        let spec = if let Some(v) = a.strip_prefix("--vdev=") {
            Some(v)
        } else if a == "--vdev" {
            it.next()
        } else {
            None
        };
        if let Some(spec) = spec {
            let name = spec.split(',').next().unwrap_or(spec);
            if name.starts_with("net_") {
                out.push((a, name));
            }
        }
    }
    out
}

/// The Ethernet port the EAL probed under `name`, if any. Called with the
/// EAL initialised: from [`Eal::init`], and through an [`Eal`] handle.
pub(crate) fn probed_port(name: &str) -> Result<Option<PortId>> {
    let cname = CString::new(name).map_err(|_| Error::NulInArgument(name.to_owned()))?;
    let mut id: u16 = 0;
    // SAFETY: valid C string and out pointer.
    let ret = unsafe { sys::rte_eth_dev_get_port_by_name(cname.as_ptr(), &mut id) };
    Ok((ret == 0).then_some(PortId(id)))
}

/// Captures what DPDK writes to stdout and stderr between `start` and `finish`.
struct LogCapture {
    active: bool,
}

impl LogCapture {
    fn start() -> Self {
        // SAFETY: points stdout/stderr at a temporary file; only called
        // around rte_eal_init, from the one thread that initialises the EAL.
        let active = unsafe { sys::sluice_capture_start() } == 0;
        LogCapture { active }
    }

    fn finish(mut self) -> String {
        self.take()
    }

    fn take(&mut self) -> String {
        if !self.active {
            return String::new();
        }
        self.active = false;
        // SAFETY: restores stdout/stderr and returns the malloc'ed buffer
        // of what was written (or null), which we own.
        let p = unsafe { sys::sluice_capture_stop() };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: `p` is a NUL-terminated buffer from open_memstream.
        let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
        // SAFETY: `p` was allocated with malloc by the C library and is freed once.
        unsafe { sys::sluice_free(p.cast()) };
        s
    }
}

impl Drop for LogCapture {
    fn drop(&mut self) {
        let _ = self.take();
    }
}

impl Eal {
    /// Initialises the EAL with `args` (the EAL arguments, without a program
    /// name), for example `["--no-huge", "-m", "512", "--no-pci",
    /// "--vdev=net_null0"]`.
    ///
    /// DPDK's log output during start-up is returned with the handle
    /// ([`Eal::startup_log`]) or, on failure, inside the error with a hint
    /// that names what to change.
    pub fn init<S: AsRef<str>>(args: &[S]) -> Result<Eal> {
        if INITIALISED.swap(true, Ordering::SeqCst) {
            return Err(Error::EalAlreadyInitialised);
        }
        let mut owned: Vec<CString> = Vec::with_capacity(args.len() + 1);
        owned.push(CString::from(c"sluice"));
        for a in args {
            let a = a.as_ref();
            owned.push(CString::new(a).map_err(|_| Error::NulInArgument(a.to_owned()))?);
        }
        // DPDK may keep pointers into argv (device arguments, prefixes), so
        // the strings live for the rest of the process. This happens once.
        let owned: &'static [CString] = Box::leak(owned.into_boxed_slice());
        let mut argv: Vec<*mut c_char> = owned.iter().map(|s| s.as_ptr().cast_mut()).collect();
        argv.push(std::ptr::null_mut());
        let argc = c_int::try_from(owned.len()).map_err(|_| Error::NulInArgument("too many arguments".into()))?;

        let joined: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
        let capture = LogCapture::start();
        // SAFETY: argv holds argc valid NUL-terminated strings followed by a
        // null pointer, all alive for the rest of the process; the EAL has
        // not been initialised in this process (checked above).
        let ret = unsafe { sys::rte_eal_init(argc, argv.as_mut_ptr()) };
        let errno = rte_errno();
        let log = capture.finish();
        if ret < 0 {
            // DPDK itself refuses a second attempt when the first got too far.
            INITIALISED.store(false, Ordering::SeqCst);
            let log = meaningful(&log);
            let reason = match failure_line(&log) {
                Some(said) => format!("{} ({})", said.trim_start_matches("EAL: "), strerror(errno)),
                None => strerror(errno),
            };
            return Err(Error::EalInit { args: joined.join(" "), reason, hint: hint_for(errno, &log, &joined), log });
        }
        let eal = Eal { shared: Arc::new(EalShared::new()), log, _main_lcore_only: PhantomData };
        // A virtual device whose driver failed to probe does not fail
        // rte_eal_init; a port that silently is not there is worse.
        for (arg, name) in requested_net_vdevs(&joined) {
            if !matches!(probed_port(name), Ok(Some(_))) {
                let said: Vec<&str> = eal
                    .startup_log()
                    .lines()
                    .filter(|l| l.contains(name) || l.to_ascii_lowercase().contains("error") || l.contains("cannot"))
                    .collect();
                return Err(Error::EalInit {
                    args: joined.join(" "),
                    reason: format!("device {name} was not created"),
                    hint: format!(
                        "argument `{arg}`: the driver refused the device (for af_packet/af_xdp: does \
                         the interface exist in this network namespace, and is it up?)"
                    ),
                    log: said.join("\n"),
                });
            }
        }
        Ok(eal)
    }

    /// What DPDK logged while the EAL started.
    pub fn startup_log(&self) -> &str {
        &self.log
    }

    /// A keep-alive of kind `kind` for a value that needs the EAL.
    pub(crate) fn keep(&self, kind: Holder) -> KeepAlive {
        self.shared.keep(kind)
    }

    pub(crate) fn shared(&self) -> &EalShared {
        &self.shared
    }

    /// What holds the EAL besides this handle.
    pub fn holders(&self) -> Holders {
        self.shared.holders()
    }

    /// Cleans the EAL up now (`rte_eal_cleanup`).
    ///
    /// Refuses with [`Error::EalInUse`], naming what is still alive, while
    /// any mempool, port (or one of its queues or statistics readers), ring
    /// or launched task exists; the handle is gone either way, and on
    /// refusal the EAL is cleaned up when the last of them is dropped
    /// (never, if a mempool was leaked with mbufs out). DPDK cannot be
    /// initialised again in the same process.
    pub fn shutdown(self) -> Result<()> {
        let Eal { shared, .. } = self;
        match EalShared::shut_down(shared) {
            Ok(ret) if ret < 0 => Err(call_error("rte_eal_cleanup", "", ret)),
            Ok(_) => Ok(()),
            Err(holders) => Err(Error::EalInUse { holders }),
        }
    }

    /// The lcore the EAL runs `main` on.
    pub fn main_lcore(&self) -> LcoreId {
        // SAFETY: the EAL is initialised (a handle exists).
        LcoreId(unsafe { sys::rte_get_main_lcore() })
    }

    /// Every enabled lcore, main first.
    pub fn lcores(&self) -> Vec<LcoreId> {
        let mut v = vec![self.main_lcore()];
        v.extend(self.worker_lcores());
        v
    }

    /// The enabled lcores other than the main one, in order.
    pub fn worker_lcores(&self) -> Vec<LcoreId> {
        let mut v = Vec::new();
        let mut i: u32 = u32::MAX;
        loop {
            // SAFETY: the EAL is initialised; the function only reads its
            // lcore configuration. `u32::MAX` starts the iteration.
            i = unsafe { sys::rte_get_next_lcore(i, 1, 0) };
            if i >= sys::RTE_MAX_LCORE {
                break;
            }
            v.push(LcoreId(i));
        }
        v
    }

    /// The NUMA socket of the calling lcore (0 when unknown).
    pub fn socket_id(&self) -> i32 {
        // SAFETY: the EAL is initialised.
        let s = unsafe { sys::rte_socket_id() };
        i32::try_from(s).unwrap_or(0)
    }

    /// Timestamp-counter ticks per second (the rate of [`tsc`]).
    pub fn tsc_hz(&self) -> u64 {
        // SAFETY: the EAL is initialised and has calibrated the TSC.
        unsafe { sys::rte_get_tsc_hz() }
    }

    /// Runs `task` on worker lcore `lcore`, from the main lcore (an error
    /// anywhere else). The task gets `stop`, which it is expected to poll
    /// and to return soon after it is set.
    ///
    /// [`LcoreTask::wait`] waits for the task and gives its result; dropping
    /// the [`LcoreTask`] without waiting sets `stop`, then waits.
    pub fn launch<F>(&self, lcore: LcoreId, stop: Arc<AtomicBool>, task: F) -> Result<LcoreTask>
    where
        F: FnOnce(&AtomicBool) -> i32 + Send + 'static,
    {
        on_main_lcore(self.main_lcore(), lcore)?;
        if !self.worker_lcores().contains(&lcore) {
            return Err(Error::Lcore {
                lcore: lcore.0,
                reason: format!("not an enabled worker lcore (workers: {:?}); check -l", self.worker_lcores()),
            });
        }
        let boxed: Box<Task> = Box::new(Task { f: Some(Box::new(task)), stop: Arc::clone(&stop) });
        let arg = Box::into_raw(boxed);
        // SAFETY: `trampoline` matches lcore_function_t; `arg` is a valid
        // Box<Task> pointer whose ownership passes to the trampoline; this
        // thread is the main lcore (checked above).
        let ret = unsafe { sys::rte_eal_remote_launch(Some(trampoline), arg.cast(), lcore.0) };
        if ret != 0 {
            // SAFETY: the launch failed, so the trampoline never took `arg`.
            drop(unsafe { Box::from_raw(arg) });
            return Err(Error::Lcore { lcore: lcore.0, reason: format!("launch failed: {}", strerror(-ret)) });
        }
        Ok(LcoreTask { lcore, stop, waited: false, _keep: self.keep(Holder::Task), _main_lcore_only: PhantomData })
    }
}

/// Ok when the calling thread is the main lcore `main`; launching on
/// `target` from anywhere else is an error.
fn on_main_lcore(main: LcoreId, target: LcoreId) -> Result<()> {
    match current_lcore() {
        Some(l) if l == main => Ok(()),
        here => Err(Error::Lcore {
            lcore: target.0,
            reason: format!(
                "tasks are launched from the main lcore ({main}) only, and this thread is {}",
                here.map_or_else(|| "not an EAL thread".to_owned(), |l| format!("lcore {l}"))
            ),
        }),
    }
}

/// The id of the lcore the calling thread runs on, if it is an EAL thread.
pub fn current_lcore() -> Option<LcoreId> {
    // SAFETY: reads a thread-local; valid before and after EAL init.
    let id = unsafe { sys::sluice_lcore_id() };
    (id < sys::RTE_MAX_LCORE).then_some(LcoreId(id))
}

/// The CPU's timestamp counter, as `rte_rdtsc` reads it: cheap (no
/// function call, no fence), for busy-time accounting. Ticks per second:
/// [`Eal::tsc_hz`].
#[inline]
pub fn tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc reads a counter; every x86_64 CPU has it.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // SAFETY: reads the CPU's cycle counter; no preconditions.
        unsafe { sys::sluice_rdtsc() }
    }
}

type TaskFn = Box<dyn FnOnce(&AtomicBool) -> i32 + Send>;

struct Task {
    f: Option<TaskFn>,
    stop: Arc<AtomicBool>,
}

/// Return code of a task that panicked.
const PANICKED: c_int = c_int::MIN;

extern "C" fn trampoline(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the Box<Task> leaked by Eal::launch, handed over once.
    let mut task = unsafe { Box::from_raw(arg.cast::<Task>()) };
    let Some(f) = task.f.take() else { return PANICKED };
    let stop = Arc::clone(&task.stop);
    catch_unwind(AssertUnwindSafe(move || f(&stop))).unwrap_or(PANICKED)
}

/// A task running on a worker lcore, handled from the main lcore.
///
/// It stays on the main lcore, where waiting for a task is allowed:
///
/// ```compile_fail,E0277
/// fn send<T: Send>() {}
/// send::<sluice_ffi::LcoreTask>();
/// ```
#[derive(Debug)]
pub struct LcoreTask {
    lcore: LcoreId,
    stop: Arc<AtomicBool>,
    waited: bool,
    _keep: KeepAlive,
    /// `!Send + !Sync`: `rte_eal_wait_lcore` runs on the main lcore only.
    _main_lcore_only: PhantomData<*const ()>,
}

impl LcoreTask {
    /// The lcore the task runs on.
    pub fn lcore(&self) -> LcoreId {
        self.lcore
    }

    /// Waits for the task and returns its return value; a task that
    /// panicked is an error. Does not set the stop flag.
    pub fn wait(mut self) -> Result<i32> {
        self.waited = true;
        // SAFETY: the lcore was launched by us from the main lcore, this
        // handle never left it (!Send), and it is waited once.
        let ret = unsafe { sys::rte_eal_wait_lcore(self.lcore.0) };
        if ret == PANICKED {
            return Err(Error::Lcore { lcore: self.lcore.0, reason: "task panicked".into() });
        }
        Ok(ret)
    }
}

impl Drop for LcoreTask {
    fn drop(&mut self) {
        if !self.waited {
            self.stop.store(true, Ordering::SeqCst);
            // SAFETY: see `wait`.
            unsafe { sys::rte_eal_wait_lcore(self.lcore.0) };
        }
    }
}

/// The EAL's version string, e.g. "DPDK 22.11.11".
pub fn dpdk_version() -> String {
    // SAFETY: rte_version returns a pointer to a static NUL-terminated string.
    let p = unsafe { sys::rte_version() };
    if p.is_null() {
        return String::from("DPDK (unknown version)");
    }
    // SAFETY: see above.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dpdks_own_words_come_before_a_guess_from_the_error_code() {
        let args = ["--no-huge", "--file-prefix=lb7", "--vdev=net_null0"];
        let log = "EAL: Detected CPU lcores: 2\nEAL: cannot lock fbarray\nEAL: FATAL: Cannot init memzone\nEAL: Cannot init memzone\n";
        let h = hint_for(libc::ENODEV, log, &args);
        assert!(!h.contains("no device matched"), "{h}");
        assert!(h.contains("--file-prefix=lb7 are held by another process") && h.contains("/var/run/dpdk/lb7/"), "{h}");
        assert_eq!(failure_line(log), Some("EAL: Cannot init memzone"));
        let other = "EAL: Detected CPU lcores: 2\nEAL: Something else failed\n";
        assert_eq!(hint_for(libc::ENODEV, other, &args), "DPDK said: EAL: Something else failed");
        assert!(hint_for(libc::ENODEV, "EAL: Detected CPU lcores: 2\n", &args).contains("no device matched"), "the code's hint when DPDK said nothing");
    }

    #[test]
    fn launching_off_the_main_lcore_is_refused() {
        // A test thread is not an EAL thread.
        let e = on_main_lcore(LcoreId(0), LcoreId(1)).unwrap_err().to_string();
        assert!(e.contains("main lcore (l0)") && e.contains("not an EAL thread"), "{e}");
    }

    #[test]
    fn tsc_is_the_counter_rte_rdtsc_reads() {
        // SAFETY: reads the CPU's cycle counter through DPDK's rte_rdtsc.
        let a = unsafe { sys::sluice_rdtsc() };
        let b = tsc();
        // SAFETY: as above.
        let c = unsafe { sys::sluice_rdtsc() };
        assert!(a <= b && b <= c, "{a} {b} {c}");
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(tsc() > c);
    }
}
