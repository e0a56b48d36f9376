//! `sluice tables` and `sluice explain`: what a running appliance forwards
//! with, by endpoint address, and where one flow goes.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::{Context, Result};
use serde_json::Value;

use super::status::http_get;

/// Show each service's lookup table as digests by endpoint address.
///
/// Two appliances that send every flow to the same endpoint show the same
/// digest for every service (compare them to check that ECMP across
/// appliances is safe). With --service, the whole table: runs of slots
/// and the endpoint address each run sends to.
#[derive(Debug, clap::Args)]
pub struct TablesArgs {
    /// Admin endpoint of the appliance.
    #[arg(long, default_value = "127.0.0.1:9091")]
    pub(crate) admin: SocketAddr,
    /// One service's table in full.
    #[arg(long, value_name = "NAME")]
    pub(crate) service: Option<String>,
    /// Print the raw JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Explain which route, service and endpoint a new flow gets, and why.
///
/// Example: sluice explain tcp 10.100.0.2:40000 20.0.0.1:80
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct ExplainArgs {
    /// tcp, udp or sctp.
    pub(crate) proto: String,
    /// Client address and port (IPv6 as [addr]:port).
    pub(crate) src: SocketAddr,
    /// VIP and port.
    pub(crate) dst: SocketAddr,
    /// Admin endpoint of the appliance.
    #[arg(long, default_value = "127.0.0.1:9091")]
    pub(crate) admin: SocketAddr,
    /// Print the raw JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Percent-encodes what a query value needs (IPv6 brackets and colons are fine as they are).
fn query_value(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() || ".:[]-_".contains(c) { c.to_string() } else { format!("%{:02X}", c as u32) })
        .collect()
}

/// Runs `sluice tables`.
pub fn tables(args: &TablesArgs) -> Result<ExitCode> {
    let path = match &args.service {
        Some(s) => format!("/tables/{}", query_value(s)),
        None => "/tables".to_owned(),
    };
    let body = http_get(args.admin, &path)?;
    if args.json {
        println!("{body}");
        return Ok(ExitCode::SUCCESS);
    }
    let v: Value = serde_json::from_str(&body).context("the admin endpoint answered something that is not JSON")?;
    let mut o = String::new();
    let one = |o: &mut String, t: &Value| {
        let _ = writeln!(o, "{}  {}  {} slots  digest {}", t["service"].as_str().unwrap_or("?"), t["algorithm"].as_str().unwrap_or("?"), t["size"], t["digest"].as_str().unwrap_or("?"));
        for e in t["endpoints"].as_array().into_iter().flatten() {
            let _ = writeln!(o, "    id {:>5}  {:<40} {} slots", e[0], e[1].as_str().unwrap_or("?"), e[2]);
        }
    };
    match v.as_array() {
        Some(list) => list.iter().for_each(|t| one(&mut o, t)),
        None => {
            one(&mut o, &v);
            let _ = writeln!(o, "  runs (from slot 0):");
            let mut slot = 0u64;
            for r in v["runs"].as_array().into_iter().flatten() {
                let n = r[1].as_u64().unwrap_or(0);
                let _ = writeln!(o, "    {slot:>8}..{:<8} {}", slot + n, r[0].as_str().unwrap_or("?"));
                slot += n;
            }
        }
    }
    print!("{o}");
    Ok(ExitCode::SUCCESS)
}

/// Runs `sluice explain`.
pub fn explain(args: &ExplainArgs) -> Result<ExitCode> {
    let path = format!(
        "/explain?proto={}&src={}&dst={}",
        query_value(&args.proto),
        query_value(&args.src.to_string()),
        query_value(&args.dst.to_string())
    );
    let body = http_get(args.admin, &path)?;
    if args.json {
        println!("{body}");
        return Ok(ExitCode::SUCCESS);
    }
    let v: Value = serde_json::from_str(&body).context("the admin endpoint answered something that is not JSON")?;
    let mut o = String::new();
    let _ = writeln!(o, "{}\n  {}", v["flow"].as_str().unwrap_or("?"), v["verdict"].as_str().unwrap_or("?"));
    for (k, label) in [("route", "route"), ("priority", "priority"), ("service", "service"), ("algorithm", "algorithm"), ("delivery", "delivery")] {
        if !v[k].is_null() {
            let _ = writeln!(o, "  {label:<10} {}", v[k].as_str().map_or_else(|| v[k].to_string(), str::to_owned));
        }
    }
    if let Some(s) = v["slot"].as_array() {
        let _ = writeln!(o, "  {:<10} flow hash {} -> slot {}", "table", s[0].as_str().unwrap_or("?"), s[1]);
    }
    if let Some(e) = v["endpoint"].as_array() {
        let _ = writeln!(o, "  {:<10} id {} ({})", "endpoint", e[0], e[1].as_str().unwrap_or("?"));
    }
    for n in v["notes"].as_array().into_iter().flatten() {
        let _ = writeln!(o, "  note: {}", n.as_str().unwrap_or("?"));
    }
    print!("{o}");
    Ok(ExitCode::SUCCESS)
}
