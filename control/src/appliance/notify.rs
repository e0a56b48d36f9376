//! The service manager's notifications (sd_notify(3), systemd's
//! `Type=notify`), sent from the health sampler:
//!
//! - `READY=1` once, when the appliance first serves its configuration
//!   (`/readyz` answers 200 from the same view);
//! - `WATCHDOG=1` while every worker polls and follows the published
//!   snapshot (`/healthz` answers 200), a quarter of `WatchdogSec` apart:
//!   a stalled worker stops them, and so does a control side that no
//!   longer samples;
//! - `STATUS=` whenever what the appliance does changes ("serving", or
//!   why not), for `systemctl status`;
//! - `STOPPING=1` when a stop signal is taken.
//!
//! Nothing is sent without `$NOTIFY_SOCKET`.

use std::time::{Duration, Instant};

use sd_notify::NotifyState;
use tracing::warn;

/// What to tell the service manager, one health sample at a time.
#[derive(Debug)]
pub(super) struct Notifier {
    ready: bool,
    status: String,
    /// Between watchdog pings, when the service manager asks for them.
    ping_every: Option<Duration>,
    pinged: Option<Instant>,
}

/// The lines one sample sends (`READY=1`, `WATCHDOG=1`, `STATUS=...`).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Notes {
    pub(super) ready: bool,
    pub(super) watchdog: bool,
    pub(super) status: Option<String>,
}

impl Notifier {
    /// A notifier when a service manager listens (`$NOTIFY_SOCKET`), with
    /// watchdog pings when it asks for them (`$WATCHDOG_USEC`).
    pub(super) fn from_env() -> Option<Notifier> {
        std::env::var_os("NOTIFY_SOCKET")?;
        let mut usec = 0;
        let watchdog = sd_notify::watchdog_enabled(false, &mut usec).then(|| Duration::from_micros(usec));
        Some(Notifier::new(watchdog))
    }

    /// A notifier pinging a watchdog of `watchdog` when given.
    pub(super) fn new(watchdog: Option<Duration>) -> Notifier {
        Notifier { ready: false, status: String::new(), ping_every: watchdog.map(|w| w / 4), pinged: None }
    }

    /// What one sample at `now` says, from why the appliance is not
    /// healthy and why it is not ready (each empty when it is).
    pub(super) fn notes(&mut self, now: Instant, unhealthy: &[String], unready: &[String]) -> Notes {
        let mut notes = Notes::default();
        if unready.is_empty() && !self.ready {
            self.ready = true;
            notes.ready = true;
        }
        if let Some(every) = self.ping_every {
            if unhealthy.is_empty() && self.pinged.is_none_or(|t| now.saturating_duration_since(t) >= every) {
                self.pinged = Some(now);
                notes.watchdog = true;
            }
        }
        let status = if unready.is_empty() { "serving".to_owned() } else { format!("not ready: {}", unready.join("; ")) };
        if status != self.status {
            self.status.clone_from(&status);
            notes.status = Some(status);
        }
        notes
    }

    /// Sends what one sample says.
    pub(super) fn sample(&mut self, now: Instant, unhealthy: &[String], unready: &[String]) {
        let notes = self.notes(now, unhealthy, unready);
        let mut states = Vec::new();
        if notes.ready {
            states.push(NotifyState::Ready);
        }
        if notes.watchdog {
            states.push(NotifyState::Watchdog);
        }
        if let Some(s) = &notes.status {
            states.push(NotifyState::Status(s));
        }
        send(&states);
    }

}

/// A stop signal was taken (nothing is sent without `$NOTIFY_SOCKET`).
pub(super) fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
}

fn send(states: &[NotifyState<'_>]) {
    if states.is_empty() {
        return;
    }
    if let Err(e) = sd_notify::notify(false, states) {
        warn!(error = %e, "could not notify the service manager ($NOTIFY_SOCKET)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn why(s: &str) -> Vec<String> {
        vec![s.to_owned()]
    }

    #[test]
    fn ready_is_said_once_when_first_ready_and_the_status_on_each_change() {
        let mut n = Notifier::new(None);
        let t = Instant::now();
        let first = n.notes(t, &[], &why("no configuration published yet"));
        assert_eq!(first, Notes { ready: false, watchdog: false, status: Some("not ready: no configuration published yet".into()) });
        assert_eq!(n.notes(t, &[], &why("no configuration published yet")), Notes::default(), "nothing changed");
        assert_eq!(n.notes(t, &[], &[]), Notes { ready: true, watchdog: false, status: Some("serving".into()) });
        let later = n.notes(t, &[], &why("source file: last state refused"));
        assert_eq!(later, Notes { ready: false, watchdog: false, status: Some("not ready: source file: last state refused".into()) });
        assert!(!n.notes(t, &[], &[]).ready, "READY=1 is said once");
    }

    #[test]
    fn the_watchdog_is_fed_a_quarter_period_apart_and_only_while_healthy() {
        let mut n = Notifier::new(Some(Duration::from_secs(4)));
        let t = Instant::now();
        let ms = |m| t + Duration::from_millis(m);
        assert!(n.notes(t, &[], &why("not yet")).watchdog, "fed before ready too");
        assert!(!n.notes(ms(200), &[], &[]).watchdog, "a second apart");
        assert!(n.notes(ms(1000), &[], &[]).watchdog);
        let stalled = why("worker on lcore 1 has not polled for 1.2 s");
        assert!(!n.notes(ms(2000), &stalled, &stalled).watchdog, "not fed while a worker stalls");
        assert!(!n.notes(ms(9000), &stalled, &stalled).watchdog);
        assert!(n.notes(ms(9200), &[], &[]).watchdog, "fed again once it polls");
        let mut none = Notifier::new(None);
        assert!(!none.notes(t, &[], &[]).watchdog, "no watchdog asked for");
    }
}
