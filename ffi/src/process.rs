//! Children of the appliance: what they inherit, and that they end with it.
//!
//! DPDK opens files without close-on-exec (its runtime directory's lock
//! and memory files, `/dev/net/tun`, packet sockets), so a plain `fork` +
//! `exec` hands all of them to the child: a child that outlives the
//! appliance then keeps DPDK's files locked and the next start fails.
//! [`confine`] makes a command's child get its standard streams only,
//! leave the appliance's process group, and be killed when the thread
//! that spawned it ends (so spawn from a thread that lives as long as the
//! appliance: the parent-death signal follows the spawning thread, not
//! the process). Uses no DPDK.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// `close_range`'s flag that marks the descriptors close-on-exec instead
/// of closing them (Linux 5.11; not in every libc crate's list).
const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;

/// Highest descriptor number marked by the fallback when the limit is unknown.
const FALLBACK_FDS: libc::c_int = 1 << 16;

/// Marks every descriptor from 3 up close-on-exec. Async-signal-safe: runs
/// between `fork` and `exec`.
fn cloexec_from_3() -> io::Result<()> {
    // SAFETY: close_range with the CLOEXEC flag only changes descriptor
    // flags; it takes no pointer.
    let r = unsafe { libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, CLOSE_RANGE_CLOEXEC) };
    if r == 0 {
        return Ok(());
    }
    // Older kernels: one fcntl per possible descriptor, up to the limit.
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid out pointer.
    let max = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        libc::c_int::try_from(lim.rlim_cur).unwrap_or(FALLBACK_FDS).min(1 << 20)
    } else {
        FALLBACK_FDS
    };
    for fd in 3..max {
        // SAFETY: F_GETFD/F_SETFD on any number is harmless; a closed one
        // answers EBADF, which is ignored.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
    Ok(())
}

/// Sets `cmd` up so that its child inherits no descriptor but its standard
/// streams (every other one is closed at `exec`), runs in a process group
/// of its own (a terminal's ^C reaches the appliance only, which stops its
/// children in order), and gets SIGKILL when the spawning thread ends,
/// including when the appliance is killed. A child whose parent is
/// already gone when it starts exits before `exec`.
pub fn confine(cmd: &mut Command) -> &mut Command {
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    cmd.process_group(0);
    let pre_exec = move || -> io::Result<()> {
        // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number; the other
        // arguments are unused. Async-signal-safe.
        if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // The parent may have died before the signal was asked for.
        // SAFETY: getppid has no preconditions.
        if unsafe { libc::getppid() } != parent {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        cloexec_from_3()
    };
    // SAFETY: the closure calls async-signal-safe functions only (prctl,
    // getppid, syscall, getrlimit, fcntl) and allocates nothing.
    unsafe { cmd.pre_exec(pre_exec) };
    cmd
}

/// Sends `signal` to process `pid` (`kill(2)`).
pub fn signal(pid: u32, signal: i32) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    if pid <= 0 {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    // SAFETY: kill takes two integers; a positive pid names one process.
    if unsafe { libc::kill(pid, signal) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Ends the process at once with `code` (`_exit(2)`): no destructor,
/// `atexit` handler or buffered output runs. For a process that must end
/// now and whose other threads may hold anything.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit takes an integer and does not return.
    unsafe { libc::_exit(code) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// A descriptor open without close-on-exec, as DPDK opens them, at a
    /// number of its own (dup2 leaves close-on-exec off).
    fn inheritable() -> (std::fs::File, i32) {
        let f = std::fs::File::open("/proc/self/status").unwrap();
        // SAFETY: duplicates a descriptor this test owns onto an unused number.
        let fd = unsafe { libc::dup2(f.as_raw_fd(), 517) };
        assert_eq!(fd, 517);
        (f, fd)
    }

    fn fds_of(cmd: &mut Command) -> Vec<String> {
        let out = cmd.arg("-c").arg("ls /proc/self/fd").output().unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap().split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn a_confined_child_inherits_its_standard_streams_only() {
        let (_f, fd) = inheritable();
        let fd = fd.to_string();
        let plain = fds_of(&mut Command::new("sh"));
        assert!(plain.contains(&fd), "the check sees a leak: {plain:?}");
        let confined = fds_of(confine(&mut Command::new("sh")));
        // 0, 1, 2, and the directory `ls` reads.
        assert!(!confined.contains(&fd) && confined.len() <= 4, "{confined:?}");
        // SAFETY: closes the duplicate made above.
        unsafe { libc::close(517) };
    }

    #[test]
    fn a_confined_child_has_a_process_group_of_its_own() {
        let out = confine(&mut Command::new("cat")).arg("/proc/self/stat").output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        // /proc/PID/stat: pid (comm) state ppid pgrp ...
        let fields: Vec<&str> = text.rsplit(')').next().unwrap().split_whitespace().collect();
        let pgrp: i64 = fields[2].parse().unwrap();
        // SAFETY: getpgrp has no preconditions.
        let ours = i64::from(unsafe { libc::getpgrp() });
        assert_ne!(pgrp, ours, "own process group");
    }

    #[test]
    fn a_confined_child_dies_with_the_thread_that_spawned_it() {
        use std::os::unix::process::ExitStatusExt;
        let mut c = std::thread::spawn(|| confine(&mut Command::new("sleep")).arg("30").spawn().unwrap()).join().unwrap();
        let t0 = std::time::Instant::now();
        let st = loop {
            if let Some(st) = c.try_wait().unwrap() {
                break st;
            }
            if t0.elapsed() > std::time::Duration::from_secs(5) {
                let _ = c.kill();
                panic!("the child outlived its parent thread by 5 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert_eq!(st.signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn signals_reach_a_child_and_nobody_else() {
        let mut c = Command::new("sleep").arg("30").spawn().unwrap();
        signal(c.id(), libc::SIGTERM).unwrap();
        let st = c.wait().unwrap();
        assert!(!st.success());
        assert!(signal(0, libc::SIGTERM).is_err(), "0 would be the caller's process group");
    }
}
