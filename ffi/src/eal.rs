//! The DPDK Environment Abstraction Layer: initialisation, lcores and the
//! launch of tasks on them, and cleanup once the last handle is gone.
//!
//! DPDK allows one EAL per process. [`Eal`] is a cheap, cloneable handle;
//! ports and mempools keep one, so `rte_eal_cleanup` runs after them.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{rte_errno, strerror, Error, Result};
use crate::ring::Ring;
use crate::sys;

static INITIALISED: AtomicBool = AtomicBool::new(false);

/// A logical core managed by the EAL.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LcoreId(pub u32);

impl fmt::Display for LcoreId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "l{}", self.0)
    }
}

/// Handle to the initialised EAL.
#[derive(Clone)]
pub struct Eal {
    inner: Arc<EalInner>,
}

struct EalInner {
    log: String,
    rings: Mutex<Vec<Arc<Ring>>>,
}

impl fmt::Debug for Eal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Eal").field("lcores", &self.lcores()).finish()
    }
}

impl Drop for EalInner {
    fn drop(&mut self) {
        if let Ok(mut rings) = self.rings.lock() {
            rings.clear();
        }
        // SAFETY: the last handle is gone, so no port, mempool or ring
        // created through this crate is alive any more.
        unsafe { sys::rte_eal_cleanup() };
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
            return Err(Error::EalInit {
                args: joined.join(" "),
                reason: strerror(errno),
                hint: hint_for(errno, &log, &joined),
                log,
            });
        }
        let eal = Eal { inner: Arc::new(EalInner { log, rings: Mutex::new(Vec::new()) }) };
        // A virtual device whose driver failed to probe does not fail
        // rte_eal_init; a port that silently is not there is worse.
        for (arg, name) in requested_net_vdevs(&joined) {
            if crate::port::port_by_name(&eal, name).is_err() {
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
        &self.inner.log
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

    /// Timestamp-counter ticks per second.
    pub fn tsc_hz(&self) -> u64 {
        // SAFETY: the EAL is initialised and has calibrated the TSC.
        unsafe { sys::rte_get_tsc_hz() }
    }

    /// Runs `task` on worker lcore `lcore`. The returned handle waits for the
    /// task when dropped; [`LcoreTask::wait`] gives its result.
    pub fn launch<F>(&self, lcore: LcoreId, task: F) -> Result<LcoreTask>
    where
        F: FnOnce() -> i32 + Send + 'static,
    {
        if !self.worker_lcores().contains(&lcore) {
            return Err(Error::Lcore {
                lcore: lcore.0,
                reason: format!("not an enabled worker lcore (workers: {:?}); check -l", self.worker_lcores()),
            });
        }
        let boxed: Box<Task> = Box::new(Task { f: Some(Box::new(task)) });
        let arg = Box::into_raw(boxed);
        // SAFETY: `trampoline` matches lcore_function_t; `arg` is a valid
        // Box<Task> pointer whose ownership passes to the trampoline.
        let ret = unsafe { sys::rte_eal_remote_launch(Some(trampoline), arg.cast(), lcore.0) };
        if ret != 0 {
            // SAFETY: the launch failed, so the trampoline never took `arg`.
            drop(unsafe { Box::from_raw(arg) });
            return Err(Error::Lcore { lcore: lcore.0, reason: format!("launch failed: {}", strerror(-ret)) });
        }
        Ok(LcoreTask { lcore, waited: false, _eal: self.clone() })
    }

    pub(crate) fn keep_ring(&self, ring: Arc<Ring>) {
        if let Ok(mut rings) = self.inner.rings.lock() {
            rings.push(ring);
        }
    }
}

/// The id of the lcore the calling thread runs on, if it is an EAL thread.
pub fn current_lcore() -> Option<LcoreId> {
    // SAFETY: reads a thread-local; valid before and after EAL init.
    let id = unsafe { sys::sluice_lcore_id() };
    (id < sys::RTE_MAX_LCORE).then_some(LcoreId(id))
}

type TaskFn = Box<dyn FnOnce() -> i32 + Send>;

struct Task {
    f: Option<TaskFn>,
}

/// Return code of a task that panicked.
const PANICKED: c_int = c_int::MIN;

extern "C" fn trampoline(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the Box<Task> leaked by Eal::launch, handed over once.
    let mut task = unsafe { Box::from_raw(arg.cast::<Task>()) };
    let Some(f) = task.f.take() else { return PANICKED };
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(PANICKED)
}

/// A task running on an lcore.
#[derive(Debug)]
pub struct LcoreTask {
    lcore: LcoreId,
    waited: bool,
    _eal: Eal,
}

impl LcoreTask {
    /// The lcore the task runs on.
    pub fn lcore(&self) -> LcoreId {
        self.lcore
    }

    /// Waits for the task and returns its return value.
    pub fn wait(mut self) -> Result<i32> {
        self.waited = true;
        // SAFETY: the lcore was launched by us and is waited once.
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
