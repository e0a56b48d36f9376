//! A raw HTTP/1.1 client side for the admin endpoint's tests: one response
//! read as it arrives (chunked bodies de-chunked, the admin endpoint
//! streams large ones), so a test can read slowly, hang up half-way, or
//! keep the connection for the next request; and the resident memory of a
//! process, read from `/proc`.

use std::io::{BufRead, Read};

/// What came back for one request.
#[derive(Debug, Default, Clone)]
pub struct Response {
    /// The status line (empty when nothing came).
    pub status: String,
    /// Bytes of body read (de-chunked).
    pub body_bytes: u64,
    /// The body ended as the response said it would (its last chunk, or
    /// Content-Length bytes); false when the connection ended first or the
    /// reader stopped.
    pub complete: bool,
}

impl Response {
    /// The status code is `code`.
    pub fn is(&self, code: u16) -> bool {
        self.status.split(' ').nth(1) == Some(code.to_string().as_str())
    }
}

/// Reads a line ending in CRLF (at most 16 KiB); `None` at end of stream.
fn line(r: &mut impl BufRead) -> Option<String> {
    let mut l = Vec::new();
    let n = r.by_ref().take(16 * 1024).read_until(b'\n', &mut l).ok()?;
    if n == 0 || !l.ends_with(b"\r\n") {
        return None;
    }
    l.truncate(l.len() - 2);
    Some(String::from_utf8_lossy(&l).into_owned())
}

/// Reads `n` bytes of body, giving each piece to `each`; false when the
/// stream ended first or `each` said stop.
fn body(r: &mut impl BufRead, mut n: u64, each: &mut impl FnMut(&[u8]) -> bool, got: &mut u64) -> bool {
    while n > 0 {
        let Ok(buf) = r.fill_buf() else { return false };
        if buf.is_empty() {
            return false;
        }
        let k = buf.len().min(usize::try_from(n).unwrap_or(usize::MAX));
        let go_on = each(&buf[..k]);
        r.consume(k);
        n -= k as u64;
        *got += k as u64;
        if !go_on {
            return false;
        }
    }
    true
}

/// Reads one response from `r`, handing its body to `each` piece by piece
/// as it arrives (`each` returns false to stop reading: the response is
/// then incomplete, and the caller may drop the connection). A response
/// without length ends with the connection.
pub fn read_response(r: &mut impl BufRead, mut each: impl FnMut(&[u8]) -> bool) -> Response {
    let mut resp = Response::default();
    let Some(status) = line(r) else { return resp };
    resp.status = status;
    let (mut length, mut chunked) = (None, false);
    loop {
        let Some(h) = line(r) else { return resp };
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap_or((&h, ""));
        match k.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = v.trim().parse::<u64>().ok(),
            "transfer-encoding" => chunked = v.trim().eq_ignore_ascii_case("chunked"),
            _ => {}
        }
    }
    let mut got = 0;
    resp.complete = if chunked {
        loop {
            let Some(size) = line(r) else { break false };
            let Ok(n) = u64::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16) else { break false };
            if n == 0 {
                // Trailers, then the empty line.
                let mut end = false;
                while let Some(t) = line(r) {
                    if t.is_empty() {
                        end = true;
                        break;
                    }
                }
                break end;
            }
            if !body(r, n, &mut each, &mut got) || line(r).as_deref() != Some("") {
                break false;
            }
        }
    } else if let Some(n) = length {
        body(r, n, &mut each, &mut got)
    } else {
        body(r, u64::MAX, &mut each, &mut got);
        true
    };
    resp.body_bytes = got;
    resp
}

/// A field of `/proc/PID/status` given in kB (VmRSS, VmHWM), in KiB; 0
/// when the process is gone.
pub fn proc_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Resets the peak resident memory (VmHWM) of `pid` to what it holds now.
pub fn reset_peak(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset VmHWM through /proc/PID/clear_refs");
}

/// CPU time (user + system) of the threads of `pid` whose name does not
/// start with `except`, in clock ticks.
pub fn cpu_ticks_except(pid: u32, except: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        .filter_map(|stat| {
            // pid (comm) state ... : comm may hold spaces, fields follow its ')'.
            let name = stat.get(stat.find('(')? + 1..stat.rfind(')')?)?;
            if name.starts_with(except) {
                return None;
            }
            let f: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split(' ').collect();
            // utime and stime: fields 14 and 15 of the line, 12 and 13 after the state.
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        })
        .sum()
}

/// One client of an HTTP/1.1 server that keeps its connection alive
/// between requests and connects again when the server closed it.
#[derive(Debug)]
pub struct Client {
    addr: std::net::SocketAddr,
    conn: Option<std::io::BufReader<std::net::TcpStream>>,
    /// Connections made.
    pub connects: u64,
    /// Answers read on a connection that had answered before.
    pub reused: u64,
}

impl Client {
    /// A client of `addr`, not connected yet.
    pub fn new(addr: std::net::SocketAddr) -> Client {
        Client { addr, conn: None, connects: 0, reused: 0 }
    }

    /// GETs `path`, the body handed to `each` as it arrives (false: stop
    /// reading, and drop the connection). A connection kept from before
    /// that turns out closed is replaced once.
    pub fn get(&mut self, path: &str, mut each: impl FnMut(&[u8]) -> bool) -> Response {
        use std::io::Write;
        for _ in 0..2 {
            let reusing = self.conn.is_some();
            if self.conn.is_none() {
                let Ok(s) = std::net::TcpStream::connect_timeout(&self.addr, std::time::Duration::from_secs(2)) else {
                    return Response::default();
                };
                let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(30)));
                self.connects += 1;
                self.conn = Some(std::io::BufReader::with_capacity(64 * 1024, s));
            }
            let Some(c) = self.conn.as_mut() else { return Response::default() };
            let sent = c.get_mut().write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).is_ok();
            let r = if sent { read_response(c, &mut each) } else { Response::default() };
            if !r.complete {
                self.conn = None;
            }
            if r.status.is_empty() && reusing {
                continue;
            }
            if reusing && !r.status.is_empty() {
                self.reused += 1;
            }
            return r;
        }
        Response::default()
    }
}
