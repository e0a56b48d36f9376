//! A client of BIRD's control socket (what `birdc` speaks).
//!
//! BIRD answers each command with lines that start with a four-digit code:
//! `DDDD-text` continues a reply, `DDDD text` ends it, and ` text` (a
//! leading space) continues the line of the code before. Codes below 1000
//! are final results (`0000` OK, `0003` reconfigured, `0020` configuration
//! OK), 1000-2999 are table rows and headers, 8000-8999 run-time errors and
//! 9000-9999 parse errors. Every read has a deadline and a reply has a
//! bounded size, so a stuck or hostile socket cannot stall the driver or
//! fill its memory.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

use super::BirdError;

/// How long one command may take.
pub(super) const TIMEOUT: Duration = Duration::from_secs(5);
/// Most lines in one reply.
const MAX_LINES: usize = 100_000;
/// Most bytes in one line.
const MAX_LINE: usize = 64 * 1024;

/// One line of a reply: its code and text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Line {
    /// The code (that of the previous line for a continuation).
    pub(crate) code: u16,
    /// The text after the code.
    pub(crate) text: String,
}

/// A whole reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Reply {
    /// The code of the last line.
    pub(crate) code: u16,
    /// Every line.
    pub(crate) lines: Vec<Line>,
}

impl Reply {
    /// The text of the last line.
    pub(crate) fn last(&self) -> &str {
        self.lines.last().map_or("", |l| l.text.as_str())
    }
}

/// Parses one line: its code (or `None` for a continuation, which starts
/// with a space) and whether it ends the reply.
pub(super) fn parse_line(line: &str) -> Result<(Option<u16>, bool, &str), BirdError> {
    if let Some(rest) = line.strip_prefix(' ') {
        return Ok((None, false, rest));
    }
    let b = line.as_bytes();
    if b.len() >= 5 && b[..4].iter().all(u8::is_ascii_digit) && (b[4] == b' ' || b[4] == b'-') {
        let code: u16 = line[..4].parse().map_err(|_| BirdError::Protocol(format!("bad code in {line:?}")))?;
        return Ok((Some(code), b[4] == b' ', &line[5..]));
    }
    if b.len() == 4 && b.iter().all(u8::is_ascii_digit) {
        let code: u16 = line.parse().map_err(|_| BirdError::Protocol(format!("bad code in {line:?}")))?;
        return Ok((Some(code), true, ""));
    }
    Err(BirdError::Protocol(format!("not a BIRD reply line: {line:?}")))
}

/// A connection to BIRD's control socket.
#[derive(Debug)]
pub struct Client {
    r: BufReader<OwnedReadHalf>,
    w: OwnedWriteHalf,
    /// How long one command may take ([`TIMEOUT`] unless changed).
    pub(crate) timeout: Duration,
    /// What BIRD said when we connected (`BIRD 2.0.12 ready.`).
    pub(crate) hello: String,
}

impl Client {
    /// Connects and reads BIRD's greeting.
    pub(crate) async fn connect(path: &Path) -> Result<Client, BirdError> {
        let s = tokio::time::timeout(TIMEOUT, UnixStream::connect(path))
            .await
            .map_err(|_| BirdError::Timeout { what: format!("connecting to {}", path.display()) })?
            .map_err(|e| BirdError::Connect { path: path.display().to_string(), source: e })?;
        let (r, w) = s.into_split();
        let mut c = Client { r: BufReader::new(r), w, timeout: TIMEOUT, hello: String::new() };
        let hello = c.read_reply("(greeting)").await?;
        if hello.code != 1 {
            return Err(BirdError::Protocol(format!("unexpected greeting {:?}", hello.last())));
        }
        c.hello = hello.last().to_owned();
        Ok(c)
    }

    async fn read_reply(&mut self, cmd: &str) -> Result<Reply, BirdError> {
        let mut lines = Vec::new();
        let mut code = 0u16;
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let n = tokio::time::timeout(self.timeout, (&mut self.r).take(MAX_LINE as u64 + 1).read_until(b'\n', &mut buf))
                .await
                .map_err(|_| BirdError::Timeout { what: format!("the reply to {cmd:?}") })?
                .map_err(BirdError::Io)?;
            if n == 0 {
                return Err(BirdError::Closed);
            }
            if buf.len() > MAX_LINE {
                return Err(BirdError::Protocol(format!("a line of the reply to {cmd:?} is longer than {MAX_LINE} bytes")));
            }
            let text = String::from_utf8_lossy(&buf);
            let text = text.trim_end_matches(['\n', '\r']);
            let (c, last, rest) = parse_line(text)?;
            if let Some(c) = c {
                code = c;
            }
            lines.push(Line { code, text: rest.to_owned() });
            if last {
                return Ok(Reply { code, lines });
            }
            if lines.len() >= MAX_LINES {
                return Err(BirdError::Protocol(format!("the reply to {cmd:?} has more than {MAX_LINES} lines")));
            }
        }
    }

    /// Sends one command and reads its reply; a reply coded 8000 or more is
    /// an error with BIRD's words.
    pub(crate) async fn command(&mut self, cmd: &str) -> Result<Reply, BirdError> {
        if cmd.contains(['\n', '\r']) {
            return Err(BirdError::Protocol(format!("a command is one line: {cmd:?}")));
        }
        tokio::time::timeout(self.timeout, async {
            self.w.write_all(cmd.as_bytes()).await?;
            self.w.write_all(b"\n").await?;
            self.w.flush().await
        })
        .await
        .map_err(|_| BirdError::Timeout { what: format!("sending {cmd:?}") })?
        .map_err(BirdError::Io)?;
        let reply = self.read_reply(cmd).await?;
        if reply.code >= 8000 {
            let why: Vec<&str> = reply.lines.iter().filter(|l| l.code >= 8000).map(|l| l.text.as_str()).collect();
            return Err(BirdError::Refused { command: cmd.to_owned(), code: reply.code, message: why.join("; ") });
        }
        Ok(reply)
    }

    /// `configure check` and then `configure` with `file`; both replies
    /// are checked.
    pub(crate) async fn configure(&mut self, file: &Path) -> Result<String, BirdError> {
        let f = file.display().to_string();
        if f.contains('"') {
            return Err(BirdError::Protocol(format!("cannot quote the path {f:?}")));
        }
        let check = self.command(&format!("configure check \"{f}\"")).await?;
        if check.code != 20 {
            return Err(BirdError::Refused { command: "configure check".into(), code: check.code, message: check.last().to_owned() });
        }
        let done = self.command(&format!("configure \"{f}\"")).await?;
        // 0003 Reconfigured, 0004 in progress, 0018 confirmed, 0019 nothing to do.
        match done.code {
            3 | 4 | 18 | 19 => Ok(done.last().to_owned()),
            c => Err(BirdError::Refused { command: "configure".into(), code: c, message: done.last().to_owned() }),
        }
    }

    /// `show protocols`.
    pub(crate) async fn protocols(&mut self) -> Result<Vec<Protocol>, BirdError> {
        Ok(parse_protocols(&self.command("show protocols").await?))
    }

    /// `show bfd sessions`; empty when there is no BFD protocol.
    pub(crate) async fn bfd_sessions(&mut self) -> Result<Vec<BfdSession>, BirdError> {
        match self.command("show bfd sessions").await {
            Ok(r) => Ok(parse_bfd(&r)),
            // 8xxx "There is no BFD protocol running" and the like.
            Err(BirdError::Refused { .. }) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// The next hop and interface of BIRD's best route to `net` (such as
    /// `0.0.0.0/0` or `::/0`), if it has one.
    pub(crate) async fn best_next_hop(&mut self, net: &str) -> Result<Option<(IpAddr, String)>, BirdError> {
        match self.command(&format!("show route {net} primary")).await {
            Ok(r) => Ok(parse_next_hop(&r)),
            // 8001 Network not found.
            Err(BirdError::Refused { code: 8001, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The host routes BIRD exports to `protocol` (`show route export`):
    /// what its session announces. Empty while its channel is not up
    /// (BIRD answers 9001 "No valid tables").
    pub(crate) async fn exported(&mut self, protocol: &str) -> Result<Vec<IpAddr>, BirdError> {
        match self.command(&format!("show route export {protocol}")).await {
            Ok(r) => Ok(parse_routes(&r)),
            Err(BirdError::Refused { code: 9001, ref message, .. }) if message.contains("No valid tables") => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// Asks BIRD to shut down (it closes its sessions first).
    pub(crate) async fn down(&mut self) -> Result<(), BirdError> {
        match self.command("down").await {
            Ok(_) | Err(BirdError::Closed) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// A row of `show protocols`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Protocol {
    /// Protocol name.
    pub(crate) name: String,
    /// Kind (BGP, BFD, Static, Device).
    pub(crate) proto: String,
    /// up, start, down...
    pub(crate) state: String,
    /// Since when (BIRD's time format).
    pub(crate) since: String,
    /// The rest: for BGP, the session state (`Established`) and any error.
    pub(crate) info: String,
}

impl Protocol {
    /// For a BGP protocol, the session state: the first word of the info
    /// (`Established`, `Active`, `Connect`, `Idle`...), or `Down`.
    pub(crate) fn bgp_state(&self) -> &str {
        match self.info.split_whitespace().next() {
            Some(w) if !w.ends_with(':') => w,
            _ if self.state == "down" => "Down",
            _ => "Idle",
        }
    }
}

/// The rows of a `show protocols` reply.
pub(super) fn parse_protocols(r: &Reply) -> Vec<Protocol> {
    r.lines
        .iter()
        .filter(|l| l.code == 1002)
        .filter_map(|l| {
            let mut rest = l.text.as_str();
            let mut take = || {
                let t = rest.trim_start();
                let end = t.find(char::is_whitespace).unwrap_or(t.len());
                let (w, r) = t.split_at(end);
                rest = r;
                (!w.is_empty()).then(|| w.to_owned())
            };
            let (name, proto, _table, state, since) = (take()?, take()?, take()?, take()?, take()?);
            Some(Protocol { name, proto, state, since, info: rest.trim().to_owned() })
        })
        .collect()
}

/// The addresses of the networks of a `show route` reply (`20.0.0.1/32
/// blackhole [...]` gives 20.0.0.1).
pub(super) fn parse_routes(r: &Reply) -> Vec<IpAddr> {
    r.lines
        .iter()
        .filter(|l| l.code == 1007)
        .filter_map(|l| l.text.split_whitespace().next()?.split_once('/')?.0.parse().ok())
        .collect()
}

/// The first `via ADDRESS on INTERFACE` of a `show route` reply.
pub(super) fn parse_next_hop(r: &Reply) -> Option<(IpAddr, String)> {
    r.lines.iter().find_map(|l| {
        let mut w = l.text.trim().strip_prefix("via ")?.split_whitespace();
        let a: IpAddr = w.next()?.parse().ok()?;
        if w.next()? != "on" {
            return None;
        }
        Some((a, w.next()?.to_owned()))
    })
}

/// A row of `show bfd sessions`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BfdSession {
    /// The neighbour.
    pub(crate) address: IpAddr,
    /// The interface.
    pub(crate) interface: String,
    /// Up, Down, Init, AdminDown.
    pub(crate) state: String,
    /// Since when.
    pub(crate) since: String,
}

/// The rows of a `show bfd sessions` reply.
pub(super) fn parse_bfd(r: &Reply) -> Vec<BfdSession> {
    r.lines
        .iter()
        .filter_map(|l| {
            let mut w = l.text.split_whitespace();
            let address: IpAddr = w.next()?.parse().ok()?;
            let (interface, state, since) = (w.next()?, w.next()?, w.next()?);
            Some(BfdSession { address, interface: interface.to_owned(), state: state.to_owned(), since: since.to_owned() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(text: &str) -> Reply {
        let mut lines = Vec::new();
        let mut code = 0;
        for l in text.lines() {
            let (c, _, rest) = parse_line(l).unwrap();
            if let Some(c) = c {
                code = c;
            }
            lines.push(Line { code, text: rest.to_owned() });
        }
        Reply { code, lines }
    }

    // Replies as BIRD 2.0.12 wrote them on this machine.
    const PROTOCOLS: &str = "2002-Name       Proto      Table      State  Since         Info
1002-device1    Device     ---        up     18:03:27.958  
 sl_bfd     BFD        ---        up     18:03:27.958  
 sl_vips4   Static     master4    up     18:03:27.958  
 gw_a       BGP        ---        down   18:03:27.968  Error: Invalid next hop
 gw_b       BGP        ---        up     18:04:01.002  Established   
 gw_c       BGP        ---        start  18:04:01.002  Active        Socket: Connection refused
0000 ";

    #[test]
    fn lines_and_codes() {
        assert_eq!(parse_line("0001 BIRD 2.0.12 ready.").unwrap(), (Some(1), true, "BIRD 2.0.12 ready."));
        assert_eq!(parse_line("1002-gw_a BGP").unwrap(), (Some(1002), false, "gw_a BGP"));
        assert_eq!(parse_line(" sl_bfd").unwrap(), (None, false, "sl_bfd"));
        assert_eq!(parse_line("0000").unwrap(), (Some(0), true, ""));
        assert!(parse_line("hello").is_err());
        assert!(parse_line("12a4 x").is_err());
    }

    #[test]
    fn protocols_table() {
        let r = reply(PROTOCOLS);
        assert_eq!(r.code, 0);
        let p = parse_protocols(&r);
        assert_eq!(p.len(), 6);
        assert_eq!((p[3].name.as_str(), p[3].state.as_str(), p[3].info.as_str(), p[3].bgp_state()), ("gw_a", "down", "Error: Invalid next hop", "Down"));
        assert_eq!((p[4].bgp_state(), p[4].since.as_str()), ("Established", "18:04:01.002"));
        assert_eq!((p[5].bgp_state(), p[5].info.as_str()), ("Active", "Active        Socket: Connection refused"));
        assert_eq!(p[1].proto, "BFD");
    }

    #[test]
    fn next_hop_of_the_best_route() {
        // As BIRD 2.0.12 answered `show route 0.0.0.0/0 primary` and `show route ::/0`.
        let r = reply("1007-Table master4:\n 0.0.0.0/0            unicast [st4 18:46:05.817] * (200)\n \tvia 10.9.0.2 on d0\n0000 ");
        assert_eq!(parse_next_hop(&r), Some(("10.9.0.2".parse().unwrap(), "d0".to_owned())));
        let r = reply("1007-Table master6:\n ::/0                 unicast [st6 18:46:05.817] * (200)\n \tvia fd00:9::2 on sl-front\n0000 ");
        assert_eq!(parse_next_hop(&r), Some(("fd00:9::2".parse().unwrap(), "sl-front".to_owned())));
        assert_eq!(parse_next_hop(&reply("1007-Table master4:\n 0.0.0.0/0  blackhole [s 18:00:00] * (200)\n0000 ")), None);
    }

    #[test]
    fn exported_routes() {
        // As BIRD 2.0.12 answered `show route export gw_a`.
        let r = reply("1007-Table master4:\n     20.0.0.1/32          blackhole [sluice_vips4 23:15:55.628] * (200)\n     20.0.0.2/32          blackhole [sluice_vips4 23:15:55.628] * (200)\n0000 ");
        assert_eq!(parse_routes(&r), ["20.0.0.1".parse::<IpAddr>().unwrap(), "20.0.0.2".parse().unwrap()]);
        let r = reply("1007-Table master6:\n     fd00:20::1/128       blackhole [sluice_vips6 23:15:55.628] * (200)\n0000 ");
        assert_eq!(parse_routes(&r), ["fd00:20::1".parse::<IpAddr>().unwrap()]);
    }

    #[test]
    fn bfd_table() {
        let r = reply("1020-sluice_bfd:\n IP address                Interface  State      Since         Interval  Timeout\n 169.254.100.150           vlan-100   Up         18:10:01.111    0.300    1.500\n fd00:100::150             vlan-100   Init       18:10:01.111    1.000    0.000\n0000 ");
        let b = parse_bfd(&r);
        assert_eq!(b.len(), 2);
        assert_eq!((b[0].address.to_string().as_str(), b[0].interface.as_str(), b[0].state.as_str()), ("169.254.100.150", "vlan-100", "Up"));
        assert_eq!(b[1].state, "Init");
    }

    /// A fake BIRD on a socket pair: the client reads continuation lines,
    /// refuses error codes and gives up on silence.
    #[tokio::test]
    async fn talks_to_a_socket() {
        let dir = std::env::temp_dir().join(format!("sluice-birdc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("fake.ctl");
        let _ = std::fs::remove_file(&path);
        let l = tokio::net::UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            let (r, mut w) = s.into_split();
            let mut r = BufReader::new(r).lines();
            w.write_all(b"0001 BIRD 2.0.12 ready.\n").await.unwrap();
            while let Some(cmd) = r.next_line().await.unwrap() {
                let answer: &[u8] = match cmd.as_str() {
                    "show protocols" => b"2002-Name Proto Table State Since Info\n1002-gw_b BGP --- up 18:04:01.002 Established\n gw_c BGP --- start 18:04:01.002 Active\n0000 \n",
                    c if c.starts_with("configure check") => b"0002-Reading configuration from /x\n8002 /x, line 3: syntax error\n",
                    "silence" => continue,
                    _ => b"9001 syntax error, unexpected CF_SYM_UNDEFINED\n",
                };
                w.write_all(answer).await.unwrap();
            }
        });
        let mut c = Client::connect(&path).await.unwrap();
        assert_eq!(c.hello, "BIRD 2.0.12 ready.");
        let p = c.protocols().await.unwrap();
        assert_eq!(p.len(), 2, "{p:?}");
        assert_eq!(p[1].bgp_state(), "Active");
        assert_eq!(p[0].bgp_state(), "Established");
        match c.configure(Path::new("/x")).await.unwrap_err() {
            BirdError::Refused { code, message, .. } => assert_eq!((code, message.as_str()), (8002, "/x, line 3: syntax error")),
            e => panic!("{e}"),
        }
        assert!(matches!(c.command("foo").await.unwrap_err(), BirdError::Refused { code: 9001, .. }));
        assert!(c.command("a\nb").await.is_err());
        c.timeout = Duration::from_millis(200);
        assert!(matches!(c.command("silence").await.unwrap_err(), BirdError::Timeout { .. }));
        server.abort();
        let _ = std::fs::remove_file(&path);
    }
}
