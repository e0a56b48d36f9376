//! Liveness and readiness.
//!
//! A sampler looks at every worker's poll counter and snapshot generation
//! a few times a second. The appliance is *healthy* while every worker's
//! poll counter keeps moving and no worker lags behind the published
//! snapshot for longer than [`STALL`]; it is *ready* when, in addition,
//! every source's last state was accepted and every worker forwards with
//! the snapshot published last ("serving the current configuration").

use std::time::{Duration, Instant};

use super::state::Shared;
use crate::ground::lock;

/// How long a worker may go without polling, or without picking up a new
/// snapshot, before the appliance is unhealthy.
pub(crate) const STALL: Duration = Duration::from_secs(1);

/// How often the sampler runs.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_millis(200);

/// Records what each worker did since the last sample.
pub(crate) fn sample(sh: &Shared, now: Instant) {
    let published = sh.control().generation; // released at once: one lock at a time
    let mut live = lock(&sh.liveness);
    for (l, w) in live.iter_mut().zip(&sh.workers) {
        let c = &w.counters;
        let polls = c.busy_polls.get() + c.idle_polls.get();
        if polls != l.polls {
            l.polls = polls;
            l.progressed = now;
        }
        l.generation = c.generation.get();
        let cycles = (c.busy_cycles.get(), c.idle_cycles.get());
        let (db, di) = (cycles.0.saturating_sub(l.cycles.0), cycles.1.saturating_sub(l.cycles.1));
        l.cycles = cycles;
        if db + di > 0 {
            #[allow(clippy::cast_precision_loss)] // a share
            let share = db as f64 / (db + di) as f64;
            // About one second of memory at five samples a second.
            l.busy_share = 0.8 * l.busy_share + 0.2 * share;
        }
        if l.generation >= published {
            l.lagging_since = None;
        } else if l.lagging_since.is_none() {
            l.lagging_since = Some(now);
        }
    }
    drop(live);
    // The totals (ports' statistics included) only when a sample is kept:
    // once a second, not at every tick. One lock at a time.
    let due = lock(&sh.window).due(now);
    if due {
        let totals = super::window::Totals::read(sh);
        lock(&sh.window).record(now, totals);
    }
}

/// Counts every worker's silence from `now`, the moment the workers were
/// launched: the bring-up before it (which may take seconds) is no silence
/// of theirs.
pub(crate) fn workers_launched(sh: &Shared, now: Instant) {
    for l in lock(&sh.liveness).iter_mut() {
        l.progressed = now;
    }
}

/// For each worker, how long it has gone without polling, as of the last
/// sample (zero for one that polls).
pub(crate) fn silent_for(sh: &Shared, now: Instant) -> Vec<Duration> {
    lock(&sh.liveness).iter().map(|l| now.saturating_duration_since(l.progressed)).collect()
}

/// Why the appliance is not healthy (empty when it is).
pub(crate) fn unhealthy(sh: &Shared, now: Instant) -> Vec<String> {
    // One lock at a time: the reconciler and the sampler take them too.
    let published = sh.control().generation;
    let live = lock(&sh.liveness).clone();
    let mut why = Vec::new();
    for (l, w) in live.iter().zip(&sh.workers) {
        let idle = now.saturating_duration_since(l.progressed);
        if idle > STALL {
            why.push(format!("worker on lcore {} has not polled for {:.1} s", w.lcore, idle.as_secs_f64()));
        }
        if let Some(since) = l.lagging_since {
            let lag = now.saturating_duration_since(since);
            if lag > STALL {
                why.push(format!(
                    "worker on lcore {} still uses snapshot {} of {} after {:.1} s",
                    w.lcore,
                    l.generation,
                    published,
                    lag.as_secs_f64()
                ));
            }
        }
    }
    why
}

/// Why the appliance does not serve its current configuration (empty when
/// it does).
pub(crate) fn unready(sh: &Shared, now: Instant) -> Vec<String> {
    let mut why = unhealthy(sh, now);
    // Read before the state lock: one lock at a time.
    if let Some(b) = sh.bird() {
        if let Some(r) = &b.refused {
            why.push(format!("BIRD refused the configuration Sluice generated and runs its previous one: {r}"));
        } else if let Some(e) = &b.error {
            why.push(format!("BIRD does not run the configuration Sluice generated: {e}"));
        }
    }
    let st = sh.control();
    why.extend(st.faults.iter().cloned());
    if st.published_at.is_none() {
        why.push("no configuration published yet".into());
    }
    if let Some(k) = lock(&sh.kube).as_ref().map(|k| k.borrow().not_served.clone()) {
        why.extend(k.into_iter().map(|w| format!("source kubernetes: not served: {w}")));
    }
    for (name, s) in &st.sources {
        if !s.accepted {
            let first = s.problems.first().map_or("", String::as_str);
            why.push(format!("source {name}: last state refused ({} problem(s)): {first}", s.problems.len()));
        }
    }
    let live = lock(&sh.liveness);
    for (l, w) in live.iter().zip(&sh.workers) {
        let g = w.counters.generation.get().max(l.generation);
        if g < st.generation {
            why.push(format!("worker on lcore {} forwards with snapshot {g}, not {}", w.lcore, st.generation));
        }
    }
    why
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use sluice_dataplane::counters::WorkerCounters;

    use super::*;
    use crate::admin::state::{IdlePool, SourceStatus, WorkerEntry};

    fn shared(workers: usize) -> Shared {
        let w = (0..workers)
            .map(|i| WorkerEntry { lcore: u32::try_from(i).unwrap() + 1, counters: Arc::new(WorkerCounters::new(1, 1)), latency: None })
            .collect();
        Shared::new("t.yaml".into(), Vec::new(), Arc::new(IdlePool), w, 1)
    }

    #[test]
    fn concurrent_probes_and_samples_never_deadlock() {
        // Found in the soak test: /readyz held the state lock while taking
        // the liveness lock, /healthz the other way round; concurrent
        // scrapes then blocked the reconciler for good.
        let sh = Arc::new(shared(2));
        let (tx, rx) = std::sync::mpsc::channel();
        let go = Arc::new(std::sync::Barrier::new(4));
        for k in 0..4 {
            let (sh, tx, go) = (Arc::clone(&sh), tx.clone(), Arc::clone(&go));
            std::thread::spawn(move || {
                go.wait();
                for i in 0..200_000u64 {
                    let now = Instant::now();
                    match (k + i) % 3 {
                        0 => drop(unhealthy(&sh, now)),
                        1 => drop(unready(&sh, now)),
                        _ => sample(&sh, now),
                    }
                    sh.control().generation += 1;
                }
                let _ = tx.send(());
            });
        }
        for _ in 0..4 {
            rx.recv_timeout(Duration::from_secs(30)).expect("a probe thread deadlocked");
        }
    }

    #[test]
    fn what_kubernetes_does_not_serve_makes_the_appliance_unready() {
        let sh = shared(1);
        let t0 = Instant::now();
        {
            let mut st = sh.control();
            st.published_at = Some(t0);
            st.sources.insert("kubernetes".into(), SourceStatus { accepted: true, ..Default::default() });
        }
        sh.workers[0].counters.idle_polls.add(1);
        sample(&sh, t0);
        let (kube, rx) = tokio::sync::watch::channel(crate::sources::kube::KubeStatus::default());
        *lock(&sh.kube) = Some(rx);
        assert!(unready(&sh, t0).is_empty(), "{:?}", unready(&sh, t0));
        kube.send_modify(|k| k.not_served = vec!["the API has no GatewayRouter resource".into()]);
        assert_eq!(unready(&sh, t0), vec!["source kubernetes: not served: the API has no GatewayRouter resource".to_owned()]);
    }

    #[test]
    fn a_configuration_bird_refused_makes_the_appliance_unready_and_shows_in_the_metrics() {
        use crate::routing::bird::BirdStatus;
        let sh = Arc::new(shared(1));
        let t0 = Instant::now();
        sh.control().published_at = Some(t0);
        sh.workers[0].counters.idle_polls.add(1);
        sample(&sh, t0);
        let refused = "bird.conf: Permission denied".to_owned();
        let (tx, rx) = tokio::sync::watch::channel(Some(BirdStatus {
            refused: Some(refused.clone()),
            error: Some(refused),
            configure_failures: 1,
            ..BirdStatus::default()
        }));
        sh.bird.set(rx).unwrap();
        let metrics = crate::admin::metrics::registry(Arc::clone(&sh), Arc::default());
        let metric = |name: &str| {
            let text = crate::admin::metrics::render(&metrics);
            // Unlabelled rows read `name{} value`.
            text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix("{} ").map(str::to_owned))
        };
        let why = unready(&sh, t0);
        assert!(why.len() == 1 && why[0].starts_with("BIRD refused the configuration") && why[0].contains("Permission denied"), "{why:?}");
        assert_eq!(metric("sluice_bird_configuration_refused").as_deref(), Some("1"));
        assert_eq!(metric("sluice_bird_configuration_failures_total").as_deref(), Some("1"));
        // BIRD takes it: every report clears.
        tx.send_replace(Some(BirdStatus { configure_failures: 1, ..BirdStatus::default() }));
        assert!(unready(&sh, t0).is_empty(), "{:?}", unready(&sh, t0));
        assert_eq!(metric("sluice_bird_configuration_refused").as_deref(), Some("0"));
    }

    #[test]
    fn a_worker_that_stops_polling_makes_the_appliance_unhealthy() {
        let sh = shared(2);
        let t0 = Instant::now();
        sample(&sh, t0);
        assert!(unhealthy(&sh, t0).is_empty());
        // Worker 0 polls, worker 1 does not.
        sh.workers[0].counters.idle_polls.add(5);
        let t1 = t0 + Duration::from_millis(1500);
        sample(&sh, t1);
        let why = unhealthy(&sh, t1);
        assert_eq!(why.len(), 1, "{why:?}");
        assert!(why[0].contains("lcore 2 has not polled"), "{why:?}");
    }

    #[test]
    fn a_worker_stuck_on_an_old_snapshot_is_unhealthy_and_unready() {
        let sh = shared(1);
        let t0 = Instant::now();
        {
            let mut st = sh.control();
            st.generation = 3;
            st.published_at = Some(t0);
            st.sources.insert("file".into(), SourceStatus { accepted: true, ..Default::default() });
        }
        sh.workers[0].counters.generation.set(2);
        sh.workers[0].counters.idle_polls.add(1);
        sample(&sh, t0);
        assert!(unhealthy(&sh, t0).is_empty(), "a fresh lag is not yet a fault");
        assert_eq!(unready(&sh, t0).len(), 1, "but the appliance does not serve the current snapshot yet");
        let t1 = t0 + Duration::from_millis(1200);
        sh.workers[0].counters.idle_polls.add(1);
        sample(&sh, t1);
        assert!(unhealthy(&sh, t1).iter().any(|w| w.contains("still uses snapshot 2 of 3")));
        sh.workers[0].counters.generation.set(3);
        sh.workers[0].counters.idle_polls.add(1);
        sample(&sh, t1);
        assert!(unhealthy(&sh, t1).is_empty());
        assert!(unready(&sh, t1).is_empty());
        sh.control().sources.insert(
            "file".into(),
            SourceStatus { accepted: false, problems: vec!["a.yaml:3:5: vips[0]: bad".into()], ..Default::default() },
        );
        assert!(unready(&sh, t1)[0].contains("source file: last state refused"));
    }
}
