//! Any bytes, as an Ethernet frame and as a raw IP packet: the parser
//! returns a result (never panics), and what it accepts is self-consistent.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_dataplane::parse::{parse, parse_ip, Frame, Fragment};

fuzz_target!(|data: &[u8]| {
    if let Ok(Frame::Ip(p)) = parse(data) {
        assert!(usize::from(p.l3) <= usize::from(p.l4));
        assert!(usize::from(p.ip_end) <= data.len());
        assert!(p.frag != Fragment::Later || !p.has_ports);
        assert!(!p.icmp_error || !p.has_ports);
    }
    let _ = parse_ip(data, 0);
});
