//! The EAL arguments of an appliance configuration.

use crate::config::{ApplianceConfig, PortConfig};

/// Number of lcores in a core list like `0,1`, `0-3,6` or `0@0,1@0,2@1`
/// (0 when it is not one).
pub fn count_lcores(list: &str) -> usize {
    crate::config::cores(list).map_or(0, |c| c.len())
}

/// The EAL arguments that open `device`: `-a ADDR` for a PCI device,
/// `--vdev=DEVICE` for a virtual one.
pub(crate) fn device_args(device: &str) -> Vec<String> {
    if crate::config::is_pci_device(device) {
        vec!["-a".to_owned(), device.to_owned()]
    } else {
        vec![format!("--vdev={device}")]
    }
}

/// Name of the tap device of port `i`'s exception path.
pub(crate) fn tap_device(i: usize) -> String {
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
pub(crate) fn memory_arg(hugepages: bool, given: &[String]) -> Option<&'static str> {
    if !hugepages {
        return Some("--no-huge");
    }
    let said = given.iter().any(|a| a.starts_with("--huge-unlink") || a == "--in-memory");
    (!said).then_some("--huge-unlink")
}

/// Frame size of the af_packet rings Sluice asks for: DPDK's af_packet
/// driver has the kernel reassemble IPv4 fragments (its socket joins a
/// fanout group with the defrag flag, which it offers no way to turn off),
/// and a datagram the kernel reassembled arrives in one ring frame. A
/// frame holds `AF_PACKET_FRAME - 66` bytes of Ethernet frame (the kernel's
/// frame header and alignment take the rest): IP datagrams of up to 9,136
/// bytes. DPDK's own default (2,048) cuts reassembled datagrams short.
pub(crate) const AF_PACKET_FRAME: u32 = 9216;
/// Frames per ring block: the kernel allocates each block in a power of
/// two of pages, and 28 frames (63 pages) fill a 64-page block to 98 %.
/// The driver finds frame `i` at `i * framesz`, so blocks hold whole frames.
pub(crate) const AF_PACKET_FRAMES_PER_BLOCK: u32 = 28;
/// Frames per ring (18 blocks), about DPDK's default of 512: each ring of
/// each queue takes 4.5 MiB of kernel memory.
pub(crate) const AF_PACKET_FRAMES: u32 = 18 * AF_PACKET_FRAMES_PER_BLOCK;
/// DPDK's af_packet frame size when the device arguments give none.
const AF_PACKET_DPDK_FRAME: u32 = 2048;
/// Bytes of an af_packet ring frame before the packet that the driver
/// does not copy (its `TPACKET2_HDRLEN - sizeof(struct sockaddr_ll)`).
const AF_PACKET_FRAME_OVERHEAD: u32 = 32;

/// The ring arguments added to an af_packet device that gives none of
/// `framesz`, `blocksz`, `framecnt` (a device that gives one gives them all
/// as it wants them).
pub(crate) fn af_packet_ring_args(device: &str) -> Option<String> {
    let given = device.split(',').skip(1).any(|kv| {
        let k = kv.split('=').next().unwrap_or("").trim();
        matches!(k, "framesz" | "blocksz" | "framecnt")
    });
    (!given).then(|| {
        format!(
            ",framesz={AF_PACKET_FRAME},blocksz={},framecnt={AF_PACKET_FRAMES}",
            AF_PACKET_FRAME * AF_PACKET_FRAMES_PER_BLOCK
        )
    })
}

/// The mbuf data room (headroom included) that receives every frame of
/// `ports`: the driver of an af_packet port refuses a pool whose mbufs
/// cannot hold a whole ring frame.
pub(crate) fn data_room(ports: &[PortConfig]) -> u16 {
    let need = ports
        .iter()
        .filter(|p| p.device_name().starts_with("net_af_packet"))
        .map(|p| {
            let given = p.device.split(',').skip(1).find_map(|kv| kv.strip_prefix("framesz=")?.trim().parse::<u32>().ok());
            let frame = match af_packet_ring_args(&p.device) {
                Some(_) => AF_PACKET_FRAME,
                None => given.unwrap_or(AF_PACKET_DPDK_FRAME),
            };
            frame.saturating_sub(AF_PACKET_FRAME_OVERHEAD) + u32::from(sluice_ffi::MBUF_HEADROOM)
        })
        .max()
        .unwrap_or(0);
    u16::try_from(need).unwrap_or(u16::MAX).max(sluice_ffi::DEFAULT_DATA_ROOM)
}

/// The EAL arguments for `cfg` with `workers` workers.
pub fn eal_args(cfg: &ApplianceConfig, workers: usize) -> Vec<String> {
    let d = &cfg.dpdk;
    let lcores = if crate::config::cores_are_placed(&d.lcores) { "--lcores" } else { "-l" };
    let mut a = vec![lcores.to_owned(), d.lcores.clone(), "-m".to_owned(), d.memory_mb.to_string()];
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
        if p.device_name().starts_with("net_af_packet") {
            if !dev.contains("qpairs=") {
                dev.push_str(&format!(",qpairs={workers}"));
            }
            dev.extend(af_packet_ring_args(&p.device));
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

    /// The configuration (in `sluice-core`, which does not link DPDK)
    /// bounds ports and cores by DPDK's build limits as numbers: they must
    /// be the linked DPDK's.
    #[test]
    fn the_configuration_knows_dpdks_limits() {
        use crate::config::bounds;
        assert_eq!(bounds::DPDK_DEVICES, sluice_ffi::sys::RTE_MAX_ETHPORTS as usize);
        assert_eq!(bounds::DPDK_CORES, sluice_ffi::sys::RTE_MAX_LCORE);
    }

    #[test]
    fn core_lists() {
        assert_eq!(count_lcores("0,1"), 2);
        assert_eq!(count_lcores("0-3,6"), 5);
        assert_eq!(count_lcores("3-1"), 0);
        assert_eq!(count_lcores("x"), 0);
        assert_eq!(count_lcores("0@0,1@0,2@1"), 3);
    }

    /// Lcores placed on CPUs go to EAL as `--lcores`, a plain list as `-l`.
    #[test]
    fn placed_lcores_are_eals_lcores_argument() {
        let args = |lcores: &str| {
            let text = format!("dpdk: {{lcores: \"{lcores}\"}}\nports:\n  - {{name: a, device: net_null0}}\n");
            let cfg = crate::config::parse_str(&text, std::path::Path::new("c.yaml")).unwrap();
            eal_args(&cfg, count_lcores(lcores) - 1)[..2].to_vec()
        };
        assert_eq!(args("0@0,1@0,2@1"), ["--lcores", "0@0,1@0,2@1"]);
        assert_eq!(args("0,1"), ["-l", "0,1"]);
    }

    #[test]
    fn devices_as_eal_arguments() {
        assert_eq!(device_args("0000:3b:00.0"), ["-a", "0000:3b:00.0"]);
        assert_eq!(device_args("net_memif0,role=server,socket=/tmp/a.sock"), ["--vdev=net_memif0,role=server,socket=/tmp/a.sock"]);
    }

    #[test]
    fn af_packet_rings_hold_a_reassembled_jumbo_datagram_unless_the_device_says_otherwise() {
        let port = |device: &str| PortConfig {
            name: "p".into(),
            device: device.into(),
            addresses: vec![],
            mtu: 1500,
            vlan: 0,
            kernel_interface: String::new(),
        };
        let dev = "net_af_packet0,iface=a";
        assert_eq!(af_packet_ring_args(dev).as_deref(), Some(",framesz=9216,blocksz=258048,framecnt=504"));
        // 28 whole frames in 63 pages, and the frame count in whole blocks.
        assert_eq!(AF_PACKET_FRAME * AF_PACKET_FRAMES_PER_BLOCK % 4096, 0);
        assert_eq!(AF_PACKET_FRAMES % AF_PACKET_FRAMES_PER_BLOCK, 0);
        assert_eq!(data_room(&[port(dev)]), 9216 - 32 + 128);
        let own = "net_af_packet0,iface=a,framesz=4096,blocksz=4096";
        assert_eq!(af_packet_ring_args(own), None);
        assert_eq!(data_room(&[port(own)]), 4096 - 32 + 128);
        let count_only = "net_af_packet0,iface=a,framecnt=64";
        assert_eq!(data_room(&[port(count_only)]), sluice_ffi::DEFAULT_DATA_ROOM, "DPDK's own 2,048-byte frames");
        assert_eq!(data_room(&[port("net_null0"), port("net_pcap0,rx_pcap=/dev/null")]), sluice_ffi::DEFAULT_DATA_ROOM);
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
