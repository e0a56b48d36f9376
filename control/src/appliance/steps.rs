//! Bring-up as data: an ordered list of steps, each with its undo beside
//! it. A step that fails has the steps before it undone, last first, and
//! stopping undoes every step the same way, so the order of shutdown is
//! the order of bring-up read backwards and cannot drift from it.

use anyhow::{Context, Result};
use tracing::{debug, info};

/// One step of a bring-up over the state `S`.
pub(super) struct Step<S> {
    /// What it brings up, for the log and errors ("starting {name}").
    pub(crate) name: &'static str,
    /// Brings it up.
    pub(crate) up: fn(&mut S) -> Result<()>,
    /// Undoes it. Runs only after `up` succeeded, and must not fail: it
    /// reports what went wrong in the state it is given.
    pub(crate) down: fn(&mut S),
}

impl<S> std::fmt::Debug for Step<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Step").field("name", &self.name).finish_non_exhaustive()
    }
}

/// An undo with nothing to do: what the step changed goes away with a
/// later step's undo, or needs none.
pub(super) fn nothing<S>(_: &mut S) {}

/// Brings up `steps` in order. If one fails, the ones before it are undone
/// in reverse order and its error is returned, naming the step.
pub(super) fn up<S>(steps: &[Step<S>], state: &mut S) -> Result<()> {
    for (k, step) in steps.iter().enumerate() {
        debug!(step = step.name, "starting");
        if let Err(e) = (step.up)(state) {
            info!(step = step.name, undone = k, "bring-up failed: undoing the steps before it");
            undo(&steps[..k], state);
            return Err(e).with_context(|| format!("starting {}", step.name));
        }
    }
    Ok(())
}

/// Undoes `steps`, the last one first.
pub(super) fn undo<S>(steps: &[Step<S>], state: &mut S) {
    for step in steps.iter().rev() {
        debug!(step = step.name, "undoing");
        (step.down)(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state that records what ran, and fails the step it is told to.
    #[derive(Default)]
    struct Log {
        fail: Option<usize>,
        ran: Vec<String>,
    }

    fn step(k: usize) -> Step<Log> {
        // Function pointers cannot capture `k`: each step is its own function.
        fn up<const K: usize>(s: &mut Log) -> Result<()> {
            if s.fail == Some(K) {
                anyhow::bail!("step {K} broke");
            }
            s.ran.push(format!("up {K}"));
            Ok(())
        }
        fn down<const K: usize>(s: &mut Log) {
            s.ran.push(format!("down {K}"));
        }
        let names = ["one", "two", "three", "four", "five"];
        match k {
            1 => Step { name: names[0], up: up::<1>, down: down::<1> },
            2 => Step { name: names[1], up: up::<2>, down: down::<2> },
            3 => Step { name: names[2], up: up::<3>, down: down::<3> },
            4 => Step { name: names[3], up: up::<4>, down: down::<4> },
            _ => Step { name: names[4], up: up::<5>, down: down::<5> },
        }
    }

    /// Step k fails: steps k-1 down to 1 are undone, in that order, and
    /// nothing after k runs; the error names step k.
    #[test]
    fn a_failing_step_undoes_the_steps_before_it_last_first() {
        let steps: Vec<Step<Log>> = (1..=5).map(step).collect();
        for k in 1..=5 {
            let mut log = Log { fail: Some(k), ..Log::default() };
            let e = up(&steps, &mut log).unwrap_err();
            assert_eq!(format!("{e:#}"), format!("starting {}: step {k} broke", steps[k - 1].name));
            let mut want: Vec<String> = (1..k).map(|i| format!("up {i}")).collect();
            want.extend((1..k).rev().map(|i| format!("down {i}")));
            assert_eq!(log.ran, want, "step {k} failed");
        }
    }

    /// Stopping undoes every step, last first.
    #[test]
    fn stopping_undoes_every_step_last_first() {
        let steps: Vec<Step<Log>> = (1..=5).map(step).collect();
        let mut log = Log::default();
        up(&steps, &mut log).unwrap();
        undo(&steps, &mut log);
        let want: Vec<String> = (1..=5).map(|i| format!("up {i}")).chain((1..=5).rev().map(|i| format!("down {i}"))).collect();
        assert_eq!(log.ran, want);
    }
}
