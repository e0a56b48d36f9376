//! The sibling sync protocol over one TCP connection.
//!
//! The side that dials takes pins; the side that listens sends them. Both
//! prove they hold the shared key before anything else crosses:
//!
//! ```text
//! dialer   -> "SLSY" version(1) nonce_d(32) name_len(1) name
//! listener -> nonce_l(32) HMAC(key, "listener" nonce_d nonce_l name)
//! dialer   -> HMAC(key, "dialer" nonce_l nonce_d name)
//! ```
//!
//! (`name` is the dialer's own listen address, so that the listener's
//! status names the sibling it sends to.) Each side's nonce is fresh, so a
//! recorded handshake proves nothing on another connection. Then the
//! listener sends frames, each authenticated with a key of this connection
//! (`HMAC(key, "frames" nonce_d nonce_l)`) over its sequence number, so a
//! frame cannot be replayed, dropped or reordered unnoticed:
//!
//! ```text
//! kind(1) count(2) records(count × 48) HMAC(session, seq(8) kind count records)
//! ```
//!
//! A frame whose MAC is wrong ends the connection (the dialer connects
//! again and takes the full set).
//!
//! Version 2 adds the table digests (kinds 4 and 5, records of the same
//! 48 bytes: [`super::agree::encode`]) and the health verdicts (kinds 6
//! and 7: [`super::verdicts`]), each sent as a whole set then its end. A listener takes a dialer of
//! either version and sends digests only to one of version 2; a dialer
//! whose version 2 handshake a listener of version 1 closes dials again
//! with version 1 (a fleet upgraded one appliance at a time keeps its
//! pins flowing).

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use sluice_dataplane::sync::RECORD_LEN;

type HmacSha256 = Hmac<Sha256>;

/// The protocol's first bytes.
pub(super) const MAGIC: [u8; 4] = *b"SLSY";
/// Its version.
pub(super) const VERSION: u8 = 2;
/// The oldest version a listener takes.
pub(super) const OLDEST: u8 = 1;
/// Bytes of a nonce.
pub(super) const NONCE_LEN: usize = 32;
/// Bytes of a MAC.
pub(super) const MAC_LEN: usize = 32;
/// Most records in one frame.
pub(super) const MAX_RECORDS_PER_FRAME: usize = 256;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Kind {
    /// Pin records.
    Records = 1,
    /// Every pin held when the connection opened has been sent.
    InSync = 2,
    /// Nothing: the connection is alive.
    Keepalive = 3,
    /// Table digests, a part of the listener's set (version 2).
    Digests = 4,
    /// The set sent since the last end is whole: it replaces the last one.
    DigestsEnd = 5,
    /// Health verdicts, a part of the listener's set (version 2).
    Health = 6,
    /// The verdicts sent since the last end are whole: they replace the last ones.
    HealthEnd = 7,
}

/// Why a connection ends.
#[derive(Debug, thiserror::Error)]
pub(super) enum WireError {
    /// The connection failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The other side does not speak this protocol.
    #[error("not a sibling sync peer (magic or version)")]
    Protocol,
    /// The other side's handshake MAC is wrong: it does not hold the key.
    #[error("the peer does not hold the shared key")]
    BadKey,
    /// A frame's MAC is wrong.
    #[error("a frame's MAC is wrong")]
    BadMac,
    /// A frame of an unknown kind or size.
    #[error("a frame of kind {kind} with {count} records is not one of this protocol")]
    BadFrame {
        /// Its kind.
        kind: u8,
        /// Its record count.
        count: usize,
    },
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    // HMAC takes keys of any length: this never fails.
    let mut m = <HmacSha256 as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    for p in parts {
        m.update(p);
    }
    m
}

fn tag(key: &[u8], parts: &[&[u8]]) -> [u8; MAC_LEN] {
    hmac(key, parts).finalize().into_bytes().into()
}

/// Compares in constant time.
fn verify(key: &[u8], parts: &[&[u8]], got: &[u8]) -> bool {
    hmac(key, parts).verify_slice(got).is_ok()
}

fn nonce() -> std::io::Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| std::io::Error::other(format!("no random numbers for a nonce: {e}")))?;
    Ok(n)
}

/// One direction of an authenticated connection: the frames' key and the
/// next sequence number.
#[derive(Debug)]
pub(super) struct Session {
    pub(crate) key: [u8; MAC_LEN],
    pub(crate) seq: u64,
}

impl Session {
    fn of(key: &[u8], nd: &[u8], nl: &[u8]) -> Session {
        Session { key: tag(key, &[b"frames", nd, nl]), seq: 0 }
    }
}

/// The dialer's handshake: proves it holds `key` and checks that the
/// listener does; `name` is its own listen address, `version` the
/// protocol's ([`VERSION`], or [`OLDEST`] for an older listener).
pub(super) async fn dial<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, key: &[u8], name: &str, version: u8) -> Result<Session, WireError> {
    let nd = nonce()?;
    let name = &name.as_bytes()[..name.len().min(255)];
    let mut hello = Vec::with_capacity(6 + NONCE_LEN + name.len());
    hello.extend_from_slice(&MAGIC);
    hello.push(version);
    hello.extend_from_slice(&nd);
    hello.push(u8::try_from(name.len()).unwrap_or(u8::MAX));
    hello.extend_from_slice(name);
    s.write_all(&hello).await?;
    let mut reply = [0u8; NONCE_LEN + MAC_LEN];
    s.read_exact(&mut reply).await?;
    let (nl, proof) = reply.split_at(NONCE_LEN);
    if !verify(key, &[b"listener", &nd, nl, name], proof) {
        return Err(WireError::BadKey);
    }
    s.write_all(&tag(key, &[b"dialer", nl, &nd, name])).await?;
    s.flush().await?;
    Ok(Session::of(key, &nd, nl))
}

/// The listener's handshake: checks that the dialer holds `key` (and
/// proves it does); returns the frames' session, the dialer's name and
/// the version it speaks.
pub(super) async fn accept<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, key: &[u8]) -> Result<(Session, String, u8), WireError> {
    let mut head = [0u8; 5 + NONCE_LEN + 1];
    s.read_exact(&mut head).await?;
    if head[..4] != MAGIC || !(OLDEST..=VERSION).contains(&head[4]) {
        return Err(WireError::Protocol);
    }
    let nd = &head[5..5 + NONCE_LEN];
    let mut name = vec![0u8; usize::from(head[5 + NONCE_LEN])];
    s.read_exact(&mut name).await?;
    let nl = nonce()?;
    let mut reply = [0u8; NONCE_LEN + MAC_LEN];
    reply[..NONCE_LEN].copy_from_slice(&nl);
    reply[NONCE_LEN..].copy_from_slice(&tag(key, &[b"listener", nd, &nl, &name]));
    s.write_all(&reply).await?;
    s.flush().await?;
    let mut proof = [0u8; MAC_LEN];
    s.read_exact(&mut proof).await?;
    if !verify(key, &[b"dialer", &nl, nd, &name], &proof) {
        return Err(WireError::BadKey);
    }
    Ok((Session::of(key, nd, &nl), String::from_utf8_lossy(&name).into_owned(), head[4]))
}

/// Sends one frame of `kind` with `records` (whole encoded records, at
/// most [`MAX_RECORDS_PER_FRAME`]).
pub(super) async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, s: &mut Session, kind: Kind, records: &[u8]) -> Result<(), WireError> {
    let count = records.len() / RECORD_LEN;
    let [hi, lo] = u16::try_from(count).unwrap_or(u16::MAX).to_be_bytes();
    let head = [kind as u8, hi, lo];
    let mac = tag(&s.key, &[&s.seq.to_be_bytes(), &head, records]);
    s.seq += 1;
    let mut buf = Vec::with_capacity(head.len() + records.len() + MAC_LEN);
    buf.extend_from_slice(&head);
    buf.extend_from_slice(records);
    buf.extend_from_slice(&mac);
    w.write_all(&buf).await?;
    Ok(())
}

/// Reads one frame into `records` (its encoded records, replaced);
/// refuses a frame whose MAC is wrong.
pub(super) async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, s: &mut Session, records: &mut Vec<u8>) -> Result<Kind, WireError> {
    let mut head = [0u8; 3];
    r.read_exact(&mut head).await?;
    let count = usize::from(u16::from_be_bytes([head[1], head[2]]));
    let kind = match head[0] {
        1 if count <= MAX_RECORDS_PER_FRAME => Kind::Records,
        2 if count == 0 => Kind::InSync,
        3 if count == 0 => Kind::Keepalive,
        4 if count <= MAX_RECORDS_PER_FRAME => Kind::Digests,
        5 if count == 0 => Kind::DigestsEnd,
        6 if count <= MAX_RECORDS_PER_FRAME => Kind::Health,
        7 if count == 0 => Kind::HealthEnd,
        k => return Err(WireError::BadFrame { kind: k, count }),
    };
    records.resize(count * RECORD_LEN, 0);
    r.read_exact(records).await?;
    let mut mac = [0u8; MAC_LEN];
    r.read_exact(&mut mac).await?;
    let ok = verify(&s.key, &[&s.seq.to_be_bytes(), &head, records], &mac);
    s.seq += 1;
    if !ok {
        return Err(WireError::BadMac);
    }
    Ok(kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[tokio::test]
    async fn both_sides_prove_the_key_and_frames_round_trip() {
        let (mut a, mut b) = tokio::io::duplex(4096);
        let (d, l) = tokio::join!(dial(&mut a, KEY, "10.0.0.2:7946", VERSION), accept(&mut b, KEY));
        let (mut d, (mut l, name, version)) = (d.unwrap(), l.unwrap());
        assert_eq!((name.as_str(), version), ("10.0.0.2:7946", VERSION));
        assert_eq!(d.key, l.key);
        let rec = [7u8; RECORD_LEN * 2];
        write_frame(&mut b, &mut l, Kind::Records, &rec).await.unwrap();
        write_frame(&mut b, &mut l, Kind::InSync, &[]).await.unwrap();
        let mut got = Vec::new();
        assert_eq!(read_frame(&mut a, &mut d, &mut got).await.unwrap(), Kind::Records);
        assert_eq!(got, rec);
        assert_eq!(read_frame(&mut a, &mut d, &mut got).await.unwrap(), Kind::InSync);
        assert!(got.is_empty());
    }

    #[tokio::test]
    async fn a_wrong_key_is_refused_on_either_side() {
        let other = b"another key, also at least 32 bytes long";
        let (mut a, mut b) = tokio::io::duplex(4096);
        // Each side closes its end when its handshake ends, as a
        // connection's task does.
        let (d, l) = tokio::join!(
            async {
                let r = dial(&mut a, other, "x", VERSION).await;
                drop(a);
                r
            },
            async {
                let r = accept(&mut b, KEY).await;
                drop(b);
                r
            }
        );
        assert!(matches!(d, Err(WireError::BadKey)), "the dialer refuses the listener's proof: {d:?}");
        assert!(l.is_err(), "the listener gets no proof: {l:?}");
        // A dialer that skips the check and answers anyway is refused.
        let (mut a, mut b) = tokio::io::duplex(4096);
        let liar = async {
            a.write_all(&MAGIC).await.unwrap();
            a.write_all(&[VERSION]).await.unwrap();
            a.write_all(&[1u8; NONCE_LEN]).await.unwrap();
            a.write_all(&[0]).await.unwrap();
            let mut reply = [0u8; NONCE_LEN + MAC_LEN];
            a.read_exact(&mut reply).await.unwrap();
            a.write_all(&[0u8; MAC_LEN]).await.unwrap();
        };
        let (_, l) = tokio::join!(liar, accept(&mut b, KEY));
        assert!(matches!(l, Err(WireError::BadKey)), "{l:?}");
    }

    #[tokio::test]
    async fn a_frame_with_a_wrong_mac_or_out_of_order_is_refused() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let (d, l) = tokio::join!(dial(&mut a, KEY, "x", VERSION), accept(&mut b, KEY));
        let (mut d, mut l) = (d.unwrap(), l.unwrap().0);
        let mut forged = Session { key: [0; MAC_LEN], seq: 0 };
        write_frame(&mut b, &mut forged, Kind::Records, &[1u8; RECORD_LEN]).await.unwrap();
        let mut got = Vec::new();
        assert!(matches!(read_frame(&mut a, &mut d, &mut got).await, Err(WireError::BadMac)));
        // A replayed frame (sequence number already used) is refused.
        l.seq = 0;
        write_frame(&mut b, &mut l, Kind::Keepalive, &[]).await.unwrap();
        assert!(matches!(read_frame(&mut a, &mut d, &mut got).await, Err(WireError::BadMac)));
        // Sizes other than the kind allows end the connection.
        b.write_all(&[2, 0, 1]).await.unwrap();
        assert!(matches!(read_frame(&mut a, &mut d, &mut got).await, Err(WireError::BadFrame { kind: 2, count: 1 })));
    }

    #[tokio::test]
    async fn a_listener_takes_a_dialer_of_the_oldest_version_and_refuses_an_unknown_one() {
        let (mut a, mut b) = tokio::io::duplex(4096);
        let (d, l) = tokio::join!(dial(&mut a, KEY, "x", OLDEST), accept(&mut b, KEY));
        assert!(d.is_ok());
        assert_eq!(l.unwrap().2, OLDEST);
        let (mut a, mut b) = tokio::io::duplex(4096);
        // Each side closes its end when its handshake ends, as a
        // connection's task does (the dialer waits for an answer until then).
        let (_, l) = tokio::join!(
            async {
                let r = dial(&mut a, KEY, "x", VERSION + 1).await;
                drop(a);
                r
            },
            async {
                let r = accept(&mut b, KEY).await;
                drop(b);
                r
            }
        );
        assert!(matches!(l, Err(WireError::Protocol)), "{l:?}");
    }

    #[tokio::test]
    async fn digest_frames_round_trip() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let (d, l) = tokio::join!(dial(&mut a, KEY, "x", VERSION), accept(&mut b, KEY));
        let (mut d, mut l) = (d.unwrap(), l.unwrap().0);
        let rec = super::super::agree::encode(7, &super::super::agree::Entry { digest: [3; 32], since_ms: 9 });
        write_frame(&mut b, &mut l, Kind::Digests, &rec).await.unwrap();
        write_frame(&mut b, &mut l, Kind::DigestsEnd, &[]).await.unwrap();
        let mut got = Vec::new();
        assert_eq!(read_frame(&mut a, &mut d, &mut got).await.unwrap(), Kind::Digests);
        assert_eq!(got, rec);
        assert_eq!(read_frame(&mut a, &mut d, &mut got).await.unwrap(), Kind::DigestsEnd);
    }
}
