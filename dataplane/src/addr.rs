//! IP addresses and prefixes as the fast path sees them: one 128-bit
//! integer for both families, IPv4 stored IPv4-mapped (`::ffff:a.b.c.d`),
//! so that lookups, comparisons and hashing never branch on the family.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// The IPv4-mapped prefix `::ffff:0:0/96`.
const V4_MAPPED: u128 = 0xffff_u128 << 32;
const V4_MAPPED_MASK: u128 = !0u128 << 32;

/// An IPv4 or IPv6 address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, bytemuck::Zeroable)]
pub struct Addr(pub u128);

impl Addr {
    /// An IPv4 address from its 4 bytes in network order.
    #[inline(always)]
    pub fn v4(b: [u8; 4]) -> Addr {
        Addr(V4_MAPPED | u128::from(u32::from_be_bytes(b)))
    }

    /// An IPv6 address from its 16 bytes in network order.
    #[inline(always)]
    pub fn v6(b: [u8; 16]) -> Addr {
        Addr(u128::from_be_bytes(b))
    }

    /// True for an IPv4 (mapped) address.
    #[inline(always)]
    pub fn is_v4(self) -> bool {
        self.0 & V4_MAPPED_MASK == V4_MAPPED
    }

    /// The 4 bytes of an IPv4 address (meaningless for IPv6).
    #[inline(always)]
    #[allow(clippy::cast_possible_truncation)] // the low 32 bits hold the IPv4 address
    pub fn v4_bytes(self) -> [u8; 4] {
        (self.0 as u32).to_be_bytes()
    }

    /// The 16 bytes in network order.
    #[inline(always)]
    pub fn v6_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }

    /// The standard-library form.
    pub fn to_ip(self) -> IpAddr {
        if self.is_v4() {
            IpAddr::V4(Ipv4Addr::from(self.v4_bytes()))
        } else {
            IpAddr::V6(Ipv6Addr::from(self.v6_bytes()))
        }
    }
}

impl From<IpAddr> for Addr {
    fn from(ip: IpAddr) -> Addr {
        match ip {
            IpAddr::V4(a) => Addr::v4(a.octets()),
            IpAddr::V6(a) => Addr::v6(a.octets()),
        }
    }
}

impl From<Ipv4Addr> for Addr {
    fn from(a: Ipv4Addr) -> Addr {
        Addr::v4(a.octets())
    }
}

impl From<Ipv6Addr> for Addr {
    fn from(a: Ipv6Addr) -> Addr {
        Addr::v6(a.octets())
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.to_ip().fmt(f)
    }
}

impl fmt::Debug for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Addr {
    type Err = std::net::AddrParseError;
    fn from_str(s: &str) -> Result<Addr, Self::Err> {
        s.parse::<IpAddr>().map(Addr::from)
    }
}

/// An address prefix (CIDR). IPv4 prefixes are stored mapped, with the
/// length counted over 128 bits (`/24` is 96 + 24). A prefix has a family:
/// an IPv6 prefix never contains an IPv4 address, even `::/0` (whose 128
/// bits would otherwise cover the mapped range), nor an IPv4 prefix an
/// IPv6 address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    net: u128,
    mask: u128,
    len128: u8,
    v4: bool,
}

/// Why a prefix is not valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CidrError {
    /// No `/len` part.
    MissingLength,
    /// The address part does not parse.
    BadAddress,
    /// The length is not a number, or too long for the family.
    BadLength,
    /// Bits are set after the prefix length (e.g. 10.0.0.1/24).
    HostBitsSet,
}

impl fmt::Display for CidrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CidrError::MissingLength => "missing /prefix-length",
            CidrError::BadAddress => "not an IP address",
            CidrError::BadLength => "prefix length out of range (0-32 for IPv4, 0-128 for IPv6)",
            CidrError::HostBitsSet => "address has bits set beyond the prefix length",
        })
    }
}

impl std::error::Error for CidrError {}

fn mask128(len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        !0u128 << (128 - u32::from(len))
    }
}

impl Cidr {
    /// The prefix `addr/len`, `len` counted in the address's own family
    /// (0-32 for IPv4). Host bits must be clear.
    pub fn new(addr: Addr, len: u8) -> Result<Cidr, CidrError> {
        let len128 = if addr.is_v4() {
            if len > 32 {
                return Err(CidrError::BadLength);
            }
            96 + len
        } else {
            if len > 128 {
                return Err(CidrError::BadLength);
            }
            len
        };
        let mask = mask128(len128);
        if addr.0 & !mask != 0 {
            return Err(CidrError::HostBitsSet);
        }
        Ok(Cidr { net: addr.0, mask, len128, v4: addr.is_v4() })
    }

    /// A single-address prefix (/32 or /128).
    pub fn host(addr: Addr) -> Cidr {
        Cidr { net: addr.0, mask: !0, len128: 128, v4: addr.is_v4() }
    }

    /// Every address of one family: `0.0.0.0/0` or `::/0`.
    pub fn any(v4: bool) -> Cidr {
        if v4 {
            Cidr { net: V4_MAPPED, mask: V4_MAPPED_MASK, len128: 96, v4 }
        } else {
            Cidr { net: 0, mask: 0, len128: 0, v4 }
        }
    }

    /// True when `a` lies inside (and is of the prefix's family).
    #[inline(always)]
    pub fn contains(&self, a: Addr) -> bool {
        a.0 & self.mask == self.net && a.is_v4() == self.v4
    }

    /// The network address.
    pub fn addr(&self) -> Addr {
        Addr(self.net)
    }

    /// The prefix length in the family's own terms (0-32 or 0-128).
    pub fn prefix_len(&self) -> u8 {
        if self.is_v4() {
            self.len128 - 96
        } else {
            self.len128
        }
    }

    /// True for an IPv4 prefix.
    pub fn is_v4(&self) -> bool {
        self.v4
    }

    /// True for a single address (/32, /128).
    pub fn is_host(&self) -> bool {
        self.len128 == 128
    }

    /// True when the two prefixes share an address.
    pub fn overlaps(&self, other: &Cidr) -> bool {
        let m = self.mask & other.mask;
        self.v4 == other.v4 && self.net & m == other.net & m
    }
}

impl FromStr for Cidr {
    type Err = CidrError;
    fn from_str(s: &str) -> Result<Cidr, CidrError> {
        let (a, l) = s.trim().split_once('/').ok_or(CidrError::MissingLength)?;
        let addr: Addr = a.parse().map_err(|_| CidrError::BadAddress)?;
        let len: u8 = l.parse().map_err(|_| CidrError::BadLength)?;
        Cidr::new(addr, len)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr(), self.prefix_len())
    }
}

impl fmt::Debug for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_is_mapped_and_round_trips() {
        let a: Addr = "10.1.2.3".parse().unwrap();
        assert!(a.is_v4());
        assert_eq!(a.v4_bytes(), [10, 1, 2, 3]);
        assert_eq!(a.to_string(), "10.1.2.3");
        let b: Addr = "2001:db8::1".parse().unwrap();
        assert!(!b.is_v4());
        assert_eq!(b.to_string(), "2001:db8::1");
    }

    #[test]
    fn prefixes_contain_and_reject() {
        let c: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(c.contains("10.255.0.1".parse().unwrap()));
        assert!(!c.contains("11.0.0.1".parse().unwrap()));
        assert!(!c.contains("::a00:1".parse().unwrap()), "IPv6 never matches an IPv4 prefix");
        assert_eq!(c.to_string(), "10.0.0.0/8");
        assert_eq!(c.prefix_len(), 8);
        assert_eq!("10.0.0.1/24".parse::<Cidr>(), Err(CidrError::HostBitsSet));
        assert_eq!("10.0.0.0/33".parse::<Cidr>(), Err(CidrError::BadLength));
        assert_eq!("10.0.0.0".parse::<Cidr>(), Err(CidrError::MissingLength));
        assert_eq!("x/3".parse::<Cidr>(), Err(CidrError::BadAddress));
        let any4: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(any4.contains("1.2.3.4".parse().unwrap()));
        assert!(!any4.contains("2001::1".parse().unwrap()));
        let any6: Cidr = "::/0".parse().unwrap();
        assert!(any6.contains("2001::1".parse().unwrap()));
        assert!(!any6.contains("1.2.3.4".parse().unwrap()), "an IPv6 prefix never matches IPv4");
        assert!(!"::/80".parse::<Cidr>().unwrap().contains("10.0.0.1".parse().unwrap()));
        assert!(!any6.overlaps(&any4) && !any4.overlaps(&any6));
        assert!("20.0.0.1/32".parse::<Cidr>().unwrap().is_host());
        assert!("2001:db8::/32".parse::<Cidr>().unwrap().overlaps(&"2001:db8:1::/48".parse().unwrap()));
        assert!(!"10.0.0.0/8".parse::<Cidr>().unwrap().overlaps(&"11.0.0.0/8".parse().unwrap()));
    }
}
