//! With hugepages, a Sluice command maps them while it runs (the kernel's
//! `HugePages_Free` drops) and gives them back when it ends: DPDK
//! unlinks each hugepage file once mapped (`--huge-unlink`), so no file of
//! its prefix stays in hugetlbfs holding pages, and the EAL's runtime
//! directory is removed at shutdown. (Without `--huge-unlink` the files
//! stay after the process, with their pages, until a process with the same
//! `--file-prefix` starts: for good with the per-process default prefix.)
//!
//! One test: it reserves hugepages (and mounts hugetlbfs) if the machine
//! has none free, and puts both back as they were.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sluice_dataplane::craft;
use sluice_dataplane::parse::ethertype;
use sluice_tests::{pcap, privileged, sluice_bin, wait_until, Proc};

/// Pages of 2 MiB the command maps (its `--memory-mb`, and a margin).
const PAGES: u64 = 96;

/// Pages the command is seen holding at least while it runs (half of its
/// `--memory-mb`).
const MAPPED: u64 = 32;

fn meminfo(key: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.split_whitespace().next().map(|v| v.parse().unwrap()))
        .unwrap_or_else(|| panic!("{key} not in /proc/meminfo"))
}

/// Mount points of hugetlbfs.
fn hugetlbfs_mounts() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"hugetlbfs")).then(|| PathBuf::from(f[1]))
        })
        .collect()
}

/// What this test changed on the machine, put back when dropped.
struct Reserved {
    nr_hugepages: Option<String>,
    mounted: Option<PathBuf>,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if let Some(dir) = self.mounted.take() {
            let _ = Command::new("umount").arg(&dir).status();
            let _ = std::fs::remove_dir(&dir);
        }
        if let Some(n) = self.nr_hugepages.take() {
            let _ = std::fs::write("/proc/sys/vm/nr_hugepages", n);
        }
    }
}

/// At least [`PAGES`] free hugepages of the default size, and a hugetlbfs
/// mount for DPDK to find.
fn reserve() -> Reserved {
    let mut r = Reserved { nr_hugepages: None, mounted: None };
    assert_eq!(meminfo("Hugepagesize"), 2048, "the test counts pages of 2 MiB");
    let free = meminfo("HugePages_Free");
    if free < PAGES {
        let before = std::fs::read_to_string("/proc/sys/vm/nr_hugepages").unwrap();
        let total: u64 = before.trim().parse().unwrap();
        std::fs::write("/proc/sys/vm/nr_hugepages", (total + PAGES - free).to_string()).unwrap();
        r.nr_hugepages = Some(before);
        assert!(meminfo("HugePages_Free") >= PAGES, "the kernel gave fewer than {PAGES} hugepages");
    }
    if hugetlbfs_mounts().is_empty() {
        let dir = std::env::temp_dir().join(format!("sluice-hugetlbfs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = Command::new("mount").args(["-t", "hugetlbfs", "nodev"]).arg(&dir).status().unwrap();
        assert!(ok.success(), "mounting hugetlbfs on {}", dir.display());
        r.mounted = Some(dir);
    }
    r
}

/// Files in hugetlbfs whose names start with `prefix`.
fn hugepage_files(prefix: &str) -> Vec<PathBuf> {
    hugetlbfs_mounts()
        .iter()
        .flat_map(|m| std::fs::read_dir(m).into_iter().flatten().flatten().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(prefix)))
        .collect()
}

fn one_frame_pcap(path: &Path) {
    std::fs::write(path, pcap(&[craft::ether(&[], ethertype::ARP, &[0u8; 28])], 0)).unwrap();
}

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn a_command_on_hugepages_gives_them_back_and_leaves_no_runtime_directory() {
    privileged();
    let _reserved = reserve();
    let pid = std::process::id();
    let prefix = format!("slhuge{pid}");
    let dir = std::env::temp_dir().join(format!("sluice-hugepages-{pid}"));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("in.pcap");
    one_frame_pcap(&input);
    let free_before = meminfo("HugePages_Free");

    // Runs until stopped: the pages it maps are seen taken meanwhile. Its
    // log goes to a file, to see when it captures.
    let log = dir.join("capture.log");
    let cmdline = format!(
        "exec {} capture --json --port net_pcap0,rx_pcap={} -w {} -c 0 --duration 120 --lcores 0 --memory-mb 128 --mbufs 2047 --hugepages --file-prefix {prefix} 2> {}",
        sluice_bin().display(),
        input.display(),
        dir.join("out.pcap").display(),
        log.display()
    );
    let mut capture = Proc::spawn(&["sh", "-c", &cmdline]);
    let mut least = free_before;
    let mapped = wait_until(Duration::from_secs(60), || {
        least = least.min(meminfo("HugePages_Free"));
        free_before - least >= MAPPED
    });
    // Stopped once it captures (its signal handlers are in place by then).
    let capturing = wait_until(Duration::from_secs(60), || std::fs::read_to_string(&log).is_ok_and(|l| l.contains("capturing")));
    let (code, out, _) = capture.stop("INT", Duration::from_secs(20));
    let err = std::fs::read_to_string(&log).unwrap_or_default();
    // What the command left, all cleaned up before anything is judged.
    let left = hugepage_files(&prefix);
    for f in &left {
        let _ = std::fs::remove_file(f);
    }
    let free_after = meminfo("HugePages_Free");
    let runtime = Path::new("/var/run/dpdk").join(&prefix);
    let stayed = runtime.exists();
    let _ = std::fs::remove_dir_all(&runtime);
    let _ = std::fs::remove_dir_all(&dir);

    eprintln!("HugePages_Free: {free_before} before, {least} at least while it ran, {free_after} after");
    assert!(mapped, "the command never held {MAPPED} hugepages: HugePages_Free went from {free_before} down to {least} at most\n{err}");
    assert!(capturing, "the capture wrote nothing:\n{err}");
    assert_eq!(code, Some(0), "capture failed:\n{err}");
    assert!(out.contains("\"written\":1"), "{out}\n{err}");
    assert!(left.is_empty(), "{} hugepage files left behind, such as {:?}", left.len(), left.first());
    assert_eq!(free_after, free_before, "every hugepage is free again");
    assert!(!stayed, "the runtime directory {} is removed", runtime.display());
}
