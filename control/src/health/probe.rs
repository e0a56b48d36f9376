//! One active check of one endpoint: a kernel socket from the appliance's
//! own address (the kernel routes the endpoint's address through the
//! exception interface of the port that reaches it), so a check crosses
//! the same wire and the same worker as the endpoint's traffic.
//!
//! TCP connections are closed with an RST (`SO_LINGER` 0): thousands of
//! checks a second leave no `TIME_WAIT` behind, on either side.
//!
//! HTTPS checks take any certificate (a check tells whether the endpoint
//! serves, not who it is: an endpoint's certificate names the service,
//! not its address) but verify the handshake's signatures with it, as
//! keepalived's `SSL_GET` does; the server name sent is `host`, else
//! none (an address).

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use sluice_core::model::{CheckDef, Probe};
use tokio::net::{TcpSocket, TcpStream, UdpSocket};


/// Checks `addr` as `check` says, within its timeout: the time it took,
/// or why it failed. TCP checks here connect a socket: the active checks'
/// task sends a SYN instead where it has a raw socket ([`super::syn`]).
/// With `via`, `addr` is a VIP checked through endpoint `via` (UDP and DNS
/// checks here; TCP ones by SYN).
pub(crate) async fn check(check: &CheckDef, addr: IpAddr, via: Option<IpAddr>, query_id: u16) -> Result<Duration, String> {
    let t0 = Instant::now();
    let to = SocketAddr::new(addr, check.port);
    let ask = |datagram: Vec<u8>| async move {
        match via {
            None => exchange(to, &datagram).await,
            Some(via) => exchange_via(to, via, &datagram).await,
        }
    };
    let run = async {
        match &check.probe {
            Probe::Tcp => connect(to).await.map(drop),
            // Boxed: the HTTP client's state would make every check's
            // future (a TCP one too) as large as its own.
            Probe::Http { path, host, statuses, tls } => Box::pin(http(to, path, host.as_deref(), statuses, *tls)).await,
            Probe::Udp { send, expect } => {
                let got = ask(send.clone()).await?;
                if expect.is_empty() || got.windows(expect.len()).any(|w| w == expect.as_slice()) {
                    Ok(())
                } else {
                    Err(format!("the answer ({} bytes) does not contain what is expected", got.len()))
                }
            }
            Probe::Dns { name } => {
                let got = ask(dns_query(query_id, name)).await?;
                dns_answer_ok(&got, query_id)
            }
        }
    };
    match tokio::time::timeout(Duration::from_millis(u64::from(check.timeout_ms)), run).await {
        Ok(Ok(())) => Ok(t0.elapsed()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!("no answer within {} ms", check.timeout_ms)),
    }
}

/// A TCP connection to `to`, closed with an RST when dropped.
async fn connect(to: SocketAddr) -> Result<TcpStream, String> {
    let s = if to.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() }.map_err(|e| format!("socket: {e}"))?;
    rustix::net::sockopt::set_socket_linger(&s, Some(Duration::ZERO)).map_err(|e| format!("SO_LINGER: {e}"))?;
    s.connect(to).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused (RST)".to_owned(),
        _ => format!("connect: {e}"),
    })
}

/// `GET path` on a new connection to `to` (over TLS with `tls`); the
/// status must be in one of `statuses`. The body is not read.
async fn http(to: SocketAddr, path: &str, host: Option<&str>, statuses: &[(u16, u16)], tls: bool) -> Result<(), String> {
    let stream = connect(to).await?;
    if !tls {
        return get(TokioIo::new(stream), to, path, host, statuses).await;
    }
    // The server name: `host` when it is a DNS name, else the address.
    let name = host
        .and_then(|h| rustls::pki_types::ServerName::try_from(h.to_owned()).ok())
        .unwrap_or_else(|| rustls::pki_types::ServerName::IpAddress(to.ip().into()));
    let stream = tls_connector().connect(name, stream).await.map_err(|e| format!("TLS: {e}"))?;
    get(TokioIo::new(stream), to, path, host, statuses).await
}

/// The HTTPS checks' TLS client (made once).
fn tls_connector() -> &'static tokio_rustls::TlsConnector {
    static CONNECTOR: OnceLock<tokio_rustls::TlsConnector> = OnceLock::new();
    CONNECTOR.get_or_init(|| {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .unwrap_or_else(|e| unreachable!("ring's provider has the default versions: {e}"))
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth();
        tokio_rustls::TlsConnector::from(Arc::new(config))
    })
}

/// Takes any certificate; verifies the handshake's signatures with it.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `GET path` on `io`; the status must be in one of `statuses`.
async fn get<T>(io: T, to: SocketAddr, path: &str, host: Option<&str>, statuses: &[(u16, u16)]) -> Result<(), String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, String>(io).await.map_err(|e| format!("HTTP: {e}"))?;
    // Default: the endpoint's address, as a URI writes it (RFC 7230 5.4).
    let host = host.map_or_else(
        || match (to.ip(), to.port()) {
            (IpAddr::V4(a), 80) => a.to_string(),
            (IpAddr::V6(a), 80) => format!("[{a}]"),
            (IpAddr::V4(a), p) => format!("{a}:{p}"),
            (IpAddr::V6(a), p) => format!("[{a}]:{p}"),
        },
        ToOwned::to_owned,
    );
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, host)
        .header(hyper::header::USER_AGENT, "sluice-health-check")
        .header(hyper::header::CONNECTION, "close")
        .body(String::new())
        .map_err(|e| format!("HTTP request: {e}"))?;
    // The connection is driven while the answer is awaited; the answer's
    // head is all that is read.
    let conn = async {
        let _ = conn.await;
        std::future::pending::<()>().await;
    };
    let res = tokio::select! {
        r = sender.send_request(req) => r.map_err(|e| format!("HTTP: {e}"))?,
        () = conn => unreachable!("pending"),
    };
    let code = res.status().as_u16();
    if statuses.iter().any(|&(lo, hi)| (lo..=hi).contains(&code)) {
        Ok(())
    } else {
        Err(format!("HTTP status {code}"))
    }
}

/// Sends `datagram` to `to` and returns the first answer (an ICMP port
/// unreachable is an error).
async fn exchange(to: SocketAddr, datagram: &[u8]) -> Result<Vec<u8>, String> {
    let any: SocketAddr = if to.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
    let s = UdpSocket::bind(any).await.map_err(|e| format!("socket: {e}"))?;
    s.connect(to).await.map_err(|e| format!("connect: {e}"))?;
    s.send(datagram).await.map_err(|e| format!("send: {e}"))?;
    let mut buf = vec![0u8; 4096];
    let n = s.recv(&mut buf).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "port unreachable (ICMP)".to_owned(),
        _ => format!("receive: {e}"),
    })?;
    buf.truncate(n);
    Ok(buf)
}

/// [`exchange`] with VIP `to` through endpoint `via`: the datagram is sent
/// whole ([`super::syn::send_whole`]) from a UDP socket's port, which
/// takes the answer from the VIP (the worker hands it to the kernel);
/// anything else that comes to that port is passed over. A closed port's
/// ICMP error does not reach an unconnected socket: it is a timeout.
async fn exchange_via(to: SocketAddr, via: IpAddr, datagram: &[u8]) -> Result<Vec<u8>, String> {
    if to.is_ipv4() != via.is_ipv4() {
        return Err(format!("{to} and the endpoint {via} are of different families"));
    }
    let src = super::syn::source_for(via).map_err(|e| format!("no route: {e}"))?;
    let s = UdpSocket::bind(SocketAddr::new(src, 0)).await.map_err(|e| format!("socket: {e}"))?;
    let sport = s.local_addr().map_err(|e| format!("socket: {e}"))?.port();
    let len = u16::try_from(8 + datagram.len()).map_err(|_| "a datagram too long".to_owned())?;
    let mut u = Vec::with_capacity(usize::from(len));
    u.extend_from_slice(&sport.to_be_bytes());
    u.extend_from_slice(&to.port().to_be_bytes());
    u.extend_from_slice(&len.to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(datagram);
    // A computed checksum of 0 is sent as all ones (0 is "none").
    let c = match super::syn::l4_checksum(src, to.ip(), super::syn::UDP, &u) {
        0 => 0xffff,
        c => c,
    };
    u[6..8].copy_from_slice(&c.to_be_bytes());
    super::syn::send_whole(&super::syn::ip_packet(src, to.ip(), super::syn::UDP, &u), via)?;
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, from) = s.recv_from(&mut buf).await.map_err(|e| format!("receive: {e}"))?;
        if from == to {
            buf.truncate(n);
            return Ok(buf);
        }
    }
}

/// A DNS query for `name`, type A, class IN, recursion not asked.
pub(crate) fn dns_query(id: u16, name: &str) -> Vec<u8> {
    let mut q = Vec::with_capacity(18 + name.len());
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 0]); // flags 0, QDCOUNT 1
    for label in name.trim_end_matches('.').split('.').filter(|l| !l.is_empty()) {
        q.push(u8::try_from(label.len()).unwrap_or(63).min(63));
        q.extend_from_slice(&label.as_bytes()[..label.len().min(63)]);
    }
    q.push(0);
    q.extend_from_slice(&[0, 1, 0, 1]);
    q
}

/// Whether `m` is a well-formed DNS response to query `id`, whatever its
/// code (NXDOMAIN and REFUSED are answers too): the header, then every
/// question and record it counts, each within the message.
pub(crate) fn dns_answer_ok(m: &[u8], id: u16) -> Result<(), String> {
    let bad = |why: &str| Err(format!("not a well-formed DNS answer: {why}"));
    if m.len() < 12 {
        return bad("shorter than a header");
    }
    if u16::from_be_bytes([m[0], m[1]]) != id {
        return bad("another query's identifier");
    }
    if m[2] & 0x80 == 0 {
        return bad("a query, not a response");
    }
    let count = |i: usize| usize::from(u16::from_be_bytes([m[i], m[i + 1]]));
    let (qd, records) = (count(4), count(6) + count(8) + count(10));
    let mut at = 12;
    for i in 0..qd + records {
        let Some(next) = skip_name(m, at) else { return bad("a name runs past the message") };
        at = next;
        let fixed = if i < qd { 4 } else { 10 };
        if at + fixed > m.len() {
            return bad("a record runs past the message");
        }
        if i >= qd {
            at += 10 + usize::from(u16::from_be_bytes([m[at + 8], m[at + 9]]));
            if at > m.len() {
                return bad("a record's data runs past the message");
            }
        } else {
            at += 4;
        }
    }
    Ok(())
}

/// The offset after the (possibly compressed) name at `at`.
fn skip_name(m: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let len = *m.get(at)?;
        match len {
            0 => return Some(at + 1),
            l if l & 0xc0 == 0xc0 => return (at + 2 <= m.len()).then_some(at + 2),
            l if l & 0xc0 != 0 => return None,
            l => at += 1 + usize::from(l),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn def(probe: Probe, port: u16) -> CheckDef {
        let mut c = CheckDef::new(probe, port);
        c.timeout_ms = 300;
        c
    }

    /// A port nothing listens on.
    fn closed_port() -> u16 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    }

    #[tokio::test]
    async fn tcp_succeeds_on_a_listener_and_fails_on_a_closed_port() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let lo = IpAddr::from([127, 0, 0, 1]);
        assert!(check(&def(Probe::Tcp, port), lo, None, 1).await.is_ok());
        let e = check(&def(Probe::Tcp, closed_port()), lo, None, 1).await.unwrap_err();
        assert!(e.contains("refused"), "{e}");
    }

    /// Serves one HTTP request per connection with `status`, returning the
    /// request heads seen.
    async fn http_server(status: u16) -> (u16, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let Ok((mut c, _)) = l.accept().await else { return };
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 2048];
                    let mut got = 0;
                    while !buf[..got].windows(4).any(|w| w == b"\r\n\r\n") {
                        match c.read(&mut buf[got..]).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got += n,
                        }
                    }
                    let _ = tx.send(String::from_utf8_lossy(&buf[..got]).into_owned());
                    let _ = c.write_all(format!("HTTP/1.1 {status} X\r\nContent-Length: 2\r\n\r\nok").as_bytes()).await;
                });
            }
        });
        (port, rx)
    }

    #[tokio::test]
    async fn http_takes_the_statuses_asked_for() {
        let lo = IpAddr::from([127, 0, 0, 1]);
        let (port, mut heads) = http_server(204).await;
        let probe = |statuses: Vec<(u16, u16)>| Probe::Http { path: "/healthz".into(), host: Some("web.example".into()), statuses, tls: false };
        assert!(check(&def(probe(vec![(200, 299)]), port), lo, None, 1).await.is_ok());
        let head = heads.recv().await.unwrap();
        assert!(head.starts_with("GET /healthz HTTP/1.1\r\n"), "{head}");
        assert!(head.to_ascii_lowercase().contains("host: web.example\r\n"), "{head}");
        // Without a host, the endpoint's address and port.
        let no_host = Probe::Http { path: "/".into(), host: None, statuses: vec![(200, 299)], tls: false };
        assert!(check(&def(no_host, port), lo, None, 1).await.is_ok());
        let head = heads.recv().await.unwrap();
        assert!(head.to_ascii_lowercase().contains(&format!("host: 127.0.0.1:{port}\r\n")), "{head}");
        let e = check(&def(probe(vec![(200, 200)]), port), lo, None, 1).await.unwrap_err();
        assert_eq!(e, "HTTP status 204");
        // Something that does not speak HTTP fails.
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = l.accept().await {
                let _ = c.write_all(b"be1\n").await;
            }
        });
        assert!(check(&def(probe(vec![(200, 399)]), port), lo, None, 1).await.is_err());
    }

    /// Serves HTTPS with a self-signed certificate for `name`, each request
    /// answered with `status`; returns its port and the server names the
    /// clients sent.
    async fn https_server(name: &str, status: u16) -> (u16, tokio::sync::mpsc::UnboundedReceiver<Option<String>>) {
        let k = rcgen::KeyPair::generate().unwrap();
        let c = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap().self_signed(&k).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(rustls::pki_types::PrivatePkcs8KeyDer::from(k.serialize_der()));
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![c.der().clone()], key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((c, _)) = l.accept().await {
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let Ok(mut s) = acceptor.accept(c).await else { return };
                    let _ = tx.send(s.get_ref().1.server_name().map(ToOwned::to_owned));
                    let mut buf = vec![0u8; 2048];
                    let mut got = 0;
                    while !buf[..got].windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf[got..]).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got += n,
                        }
                    }
                    let _ = s.write_all(format!("HTTP/1.1 {status} X\r\nContent-Length: 2\r\n\r\nok").as_bytes()).await;
                    let _ = s.flush().await;
                });
            }
        });
        (port, rx)
    }

    #[tokio::test]
    async fn https_checks_speak_tls_with_the_host_as_server_name() {
        let lo = IpAddr::from([127, 0, 0, 1]);
        let (port, mut names) = https_server("web.example", 200).await;
        let https = |host: Option<&str>, statuses: Vec<(u16, u16)>| Probe::Http { path: "/healthz".into(), host: host.map(Into::into), statuses, tls: true };
        assert!(check(&def(https(Some("web.example"), vec![(200, 299)]), port), lo, None, 1).await.is_ok());
        assert_eq!(names.recv().await.unwrap().as_deref(), Some("web.example"));
        // Without a host: no server name; any certificate is taken.
        assert!(check(&def(https(None, vec![(200, 299)]), port), lo, None, 1).await.is_ok());
        assert_eq!(names.recv().await.unwrap(), None);
        let e = check(&def(https(None, vec![(204, 204)]), port), lo, None, 1).await.unwrap_err();
        assert_eq!(e, "HTTP status 200");
        // Plain HTTP on a TLS port fails, and HTTPS on a plain HTTP one.
        let http = Probe::Http { path: "/".into(), host: None, statuses: vec![(100, 599)], tls: false };
        assert!(check(&def(http, port), lo, None, 1).await.is_err());
        // A server that answers in clear text at once.
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let plain = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = l.accept().await {
                let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await;
            }
        });
        let e = check(&def(https(None, vec![(100, 599)]), plain), lo, None, 1).await.unwrap_err();
        assert!(e.starts_with("TLS: "), "{e}");
    }

    #[tokio::test]
    async fn udp_and_dns_want_an_answer_and_the_right_one() {
        let lo = IpAddr::from([127, 0, 0, 1]);
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let port = server.local_addr().unwrap().port();
        tokio::spawn(async move {
            let mut buf = [0u8; 512];
            while let Ok((n, from)) = server.recv_from(&mut buf).await {
                let mut answer = buf[..n].to_vec();
                if answer.starts_with(b"ping") {
                    answer = b"pong".to_vec();
                } else if n >= 12 {
                    answer[2] |= 0x80; // the query back, as a response (NXDOMAIN)
                    answer[3] |= 3;
                } else {
                    continue; // no answer
                }
                let _ = server.send_to(&answer, from).await;
            }
        });
        let udp = |send: &[u8], expect: &[u8]| def(Probe::Udp { send: send.to_vec(), expect: expect.to_vec() }, port);
        assert!(check(&udp(b"ping", b"pong"), lo, None, 1).await.is_ok());
        assert!(check(&udp(b"ping", b""), lo, None, 1).await.is_ok());
        assert!(check(&udp(b"ping", b"pang"), lo, None, 1).await.unwrap_err().contains("does not contain"));
        assert!(check(&udp(b"hi", b""), lo, None, 1).await.unwrap_err().contains("no answer within 300 ms"));
        assert!(check(&def(Probe::Dns { name: "example.org".into() }, port), lo, None, 7).await.is_ok());
        // The same datagrams sent whole (as to a VIP through an endpoint;
        // here both are the loopback address), where raw sockets open.
        if rustix::process::geteuid().is_root() {
            assert_eq!(check(&udp(b"ping", b"pong"), lo, Some(lo), 1).await.map(drop), Ok(()));
            assert!(check(&def(Probe::Dns { name: "example.org".into() }, port), lo, Some(lo), 8).await.is_ok());
            assert!(check(&udp(b"hi", b""), lo, Some(lo), 1).await.unwrap_err().contains("no answer within 300 ms"));
        }
        let closed = closed_port();
        assert!(check(&def(Probe::Dns { name: ".".into() }, closed), lo, None, 7).await.unwrap_err().contains("unreachable"));
    }

    #[test]
    fn dns_answers_are_walked_to_their_end() {
        let q = dns_query(0x1234, "example.org.");
        assert_eq!(&q[12..], b"\x07example\x03org\x00\x00\x01\x00\x01");
        assert!(dns_answer_ok(&q, 0x1234).unwrap_err().contains("a query"));
        let mut a = q.clone();
        a[2] |= 0x80;
        assert!(dns_answer_ok(&a, 0x1234).is_ok());
        assert!(dns_answer_ok(&a, 0x1235).unwrap_err().contains("identifier"));
        // One answer record: a pointer to the question's name, A, IN, TTL, 4 bytes.
        a[7] = 1;
        a.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 93, 184, 216, 34]);
        assert!(dns_answer_ok(&a, 0x1234).is_ok());
        assert!(dns_answer_ok(&a[..a.len() - 1], 0x1234).unwrap_err().contains("runs past"));
        assert!(dns_answer_ok(&a[..11], 0x1234).unwrap_err().contains("shorter"));
    }
}
