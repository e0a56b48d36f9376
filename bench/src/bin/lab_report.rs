//! Writes the README's performance section and the SVG charts from the
//! results files (see `sluice_bench::report`).
//!
//! ```text
//! cargo run --release -p sluice-bench --bin lab_report -- [--root DIR] [--check]
//! ```
//!
//! Reads `bench/results/compare_ns.json` and, when it exists,
//! `bench/results/lab.json`; writes `bench/results/charts/*.svg` and the text
//! between `<!-- perf:begin -->` and `<!-- perf:end -->` in `README.md`.
//! `--check` changes nothing and exits 1 when the README's section differs
//! from what the results give.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use sluice_bench::report::{charts, perf_section, splice, ReportError, Results};

const COMPARE: &str = "bench/results/compare_ns.json";
const LAB: &str = "bench/results/lab.json";
const CHARTS: &str = "bench/results/charts";

fn run() -> Result<bool, ReportError> {
    let mut root = PathBuf::from(".");
    let mut check = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--root" => root = args.next().map(PathBuf::from).ok_or_else(|| usage("--root needs a directory"))?,
            "--check" => check = true,
            other => return Err(usage(&format!("unknown argument `{other}`"))),
        }
    }
    let compare = Results::load(&root.join(COMPARE), COMPARE)?;
    let lab_path = root.join(LAB);
    let lab = if lab_path.exists() { Some(Results::load(&lab_path, LAB)?) } else { None };
    let names = if check {
        // The names the charts would get, without drawing them.
        let tmp = std::env::temp_dir().join(format!("sluice-lab-report-{}", std::process::id()));
        let n = charts(&compare, lab.as_ref(), &tmp)?;
        let _ = std::fs::remove_dir_all(&tmp);
        n
    } else {
        charts(&compare, lab.as_ref(), &root.join(CHARTS))?
    };
    let links: Vec<String> = names.iter().map(|n| format!("{CHARTS}/{n}")).collect();
    let section = perf_section(&compare, lab.as_ref(), &links)?;
    let readme_path = root.join("README.md");
    let readme = std::fs::read_to_string(&readme_path).map_err(|source| ReportError::Read { path: readme_path.clone(), source })?;
    let new = splice(&readme, &section)?;
    if check {
        return Ok(new == readme);
    }
    std::fs::write(&readme_path, new).map_err(|source| ReportError::Read { path: readme_path, source })?;
    println!("lab_report: README.md performance section and {} chart(s) under {CHARTS}", names.len());
    Ok(true)
}

fn usage(why: &str) -> ReportError {
    ReportError::Format { what: "usage: lab_report [--root DIR] [--check]".into(), why: why.into() }
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("lab_report: README.md's performance section is not what the results give; run lab_report");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("lab_report: {e}");
            ExitCode::FAILURE
        }
    }
}
