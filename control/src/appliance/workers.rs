//! The workers as a group: launched on their lcores, stopped together, and
//! always stopped before anyone waits for them.
//!
//! [`Workers`] is a guard: dropping it (on an error path as well as at the
//! end) raises the stop flag first and then waits, so the process can
//! never hang waiting for a worker that nobody told to stop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Result;
use sluice_ffi::{Eal, LcoreId, LcoreTask};
use tracing::error;

/// Launched workers and their stop flag.
#[derive(Debug)]
pub(super) struct Workers {
    stop: Arc<AtomicBool>,
    tasks: Vec<LcoreTask>,
}

impl Workers {
    /// No workers yet; `stop` is the flag they poll.
    pub(super) fn new(stop: Arc<AtomicBool>) -> Workers {
        Workers { stop, tasks: Vec::new() }
    }

    /// Runs `task` on `lcore`; the task polls the stop flag it is given.
    pub(super) fn launch(&mut self, eal: &Eal, lcore: LcoreId, task: impl FnOnce(&AtomicBool) -> i32 + Send + 'static) -> Result<()> {
        self.tasks.push(eal.launch(lcore, Arc::clone(&self.stop), task)?);
        Ok(())
    }

    /// How many run.
    pub(super) fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Stops every worker and waits for each; returns false if one failed.
    pub(super) fn stop(mut self) -> bool {
        self.stop_and_wait()
    }

    fn stop_and_wait(&mut self) -> bool {
        self.stop.store(true, Ordering::Relaxed);
        let mut ok = true;
        for t in self.tasks.drain(..) {
            let lcore = t.lcore();
            if let Err(e) = t.wait() {
                error!(%lcore, error = %e, "worker failed");
                ok = false;
            }
        }
        ok
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        if !self.tasks.is_empty() {
            self.stop_and_wait();
        }
    }
}
