//! The EAL arguments of an appliance configuration.

use crate::config::ApplianceConfig;

/// Number of cores in an EAL core list like `0,1` or `0-3,6`.
pub fn count_lcores(list: &str) -> usize {
    list.split(',')
        .map(|part| match part.split_once('-') {
            Some((a, b)) => match (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
                (Ok(a), Ok(b)) if b >= a => b - a + 1,
                _ => 0,
            },
            None => usize::from(part.trim().parse::<usize>().is_ok()),
        })
        .sum()
}

/// The EAL arguments that open `device`: `-a ADDR` for a PCI device,
/// `--vdev=DEVICE` for a virtual one.
pub fn device_args(device: &str) -> Vec<String> {
    if crate::config::is_pci_device(device) {
        vec!["-a".to_owned(), device.to_owned()]
    } else {
        vec![format!("--vdev={device}")]
    }
}

/// Name of the tap device of port `i`'s exception path.
pub fn tap_device(i: usize) -> String {
    format!("net_tap{i}")
}

/// The EAL's memory argument: `--no-huge` without hugepages; with them,
/// `--huge-unlink`, so that DPDK unlinks each hugepage file once mapped
/// and the pages go back to the kernel when the process ends, however it
/// ends. (Without it the files stay in hugetlbfs after the process, and
/// so do their pages, until a process with the same `--file-prefix`
/// starts: for good, when the prefix has the pid in it.) Nothing, when
/// the `given` EAL arguments already say how hugepage files are kept
/// (`--huge-unlink=...`, `--in-memory`). It rules out secondary
/// processes, which Sluice does not use.
pub fn memory_arg(hugepages: bool, given: &[String]) -> Option<&'static str> {
    if !hugepages {
        return Some("--no-huge");
    }
    let said = given.iter().any(|a| a.starts_with("--huge-unlink") || a == "--in-memory");
    (!said).then_some("--huge-unlink")
}

/// The EAL arguments for `cfg` with `workers` workers.
pub fn eal_args(cfg: &ApplianceConfig, workers: usize) -> Vec<String> {
    let d = &cfg.dpdk;
    let mut a = vec!["-l".to_owned(), d.lcores.clone(), "-m".to_owned(), d.memory_mb.to_string()];
    a.extend(memory_arg(d.hugepages, &d.extra_args).map(String::from));
    a.push(format!("--file-prefix={}", d.file_prefix));
    a.push("--no-telemetry".into());
    let pci: Vec<&str> = cfg.ports.iter().filter(|p| p.is_pci()).map(|p| p.device.as_str()).collect();
    if pci.is_empty() {
        a.push("--no-pci".into());
    }
    for p in pci {
        a.push("-a".into());
        a.push(p.into());
    }
    for p in cfg.ports.iter().filter(|p| !p.is_pci()) {
        let mut dev = p.device.clone();
        if p.device_name().starts_with("net_af_packet") && !dev.contains("qpairs=") {
            dev.push_str(&format!(",qpairs={workers}"));
        }
        a.push(format!("--vdev={dev}"));
    }
    for (i, p) in cfg.ports.iter().enumerate() {
        if !p.kernel_interface.is_empty() {
            a.push(format!("--vdev={},iface={}", tap_device(i), p.kernel_interface));
        }
    }
    a.extend(d.extra_args.iter().cloned());
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_lists() {
        assert_eq!(count_lcores("0,1"), 2);
        assert_eq!(count_lcores("0-3,6"), 5);
        assert_eq!(count_lcores("3-1"), 0);
        assert_eq!(count_lcores("x"), 0);
    }

    #[test]
    fn devices_as_eal_arguments() {
        assert_eq!(device_args("0000:3b:00.0"), ["-a", "0000:3b:00.0"]);
        assert_eq!(device_args("net_memif0,role=server,socket=/tmp/a.sock"), ["--vdev=net_memif0,role=server,socket=/tmp/a.sock"]);
    }

    #[test]
    fn hugepage_files_are_unlinked_unless_the_arguments_say_otherwise() {
        let given = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(memory_arg(false, &[]), Some("--no-huge"));
        assert_eq!(memory_arg(false, &given(&["--in-memory"])), Some("--no-huge"));
        assert_eq!(memory_arg(true, &[]), Some("--huge-unlink"));
        assert_eq!(memory_arg(true, &given(&["--socket-mem=512"])), Some("--huge-unlink"));
        assert_eq!(memory_arg(true, &given(&["--huge-unlink=never"])), None);
        assert_eq!(memory_arg(true, &given(&["--in-memory"])), None);
    }
}
