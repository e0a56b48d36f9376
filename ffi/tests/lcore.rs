//! Tasks on worker lcores: results, panics, refusals, and a task handle
//! dropped without waiting (it stops the task instead of hanging).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use sluice_ffi::{Eal, LcoreId};

fn eal_args() -> Vec<String> {
    common::eal_args(&common::file_prefix("lcore"), 128, "0,1", &[])
}

fn on_main<R: Send + 'static>(f: impl FnOnce(&Eal) -> R + Send + 'static) -> R {
    common::on_main(eal_args, f)
}

fn worker(eal: &Eal) -> LcoreId {
    *eal.worker_lcores().first().expect("-l 0,1 gives one worker")
}

#[test]
fn dropping_an_unwaited_task_stops_it_instead_of_hanging() {
    let _dog = common::Watchdog::new(30, "dropping an LcoreTask that was not waited for");
    on_main(|eal| {
        let stop = Arc::new(AtomicBool::new(false));
        let spins = Arc::new(AtomicU64::new(0));
        let task = {
            let spins = Arc::clone(&spins);
            eal.launch(worker(eal), Arc::clone(&stop), move |stop| {
                while !stop.load(Ordering::Relaxed) {
                    spins.fetch_add(1, Ordering::Relaxed);
                    std::hint::spin_loop();
                }
                0
            })
            .unwrap()
        };
        while spins.load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        assert_eq!(eal.holders().tasks, 1);
        drop(task);
        assert!(stop.load(Ordering::SeqCst), "the drop set the stop flag");
        assert_eq!(eal.holders().tasks, 0);
        // The lcore is free again.
        let again = eal.launch(worker(eal), Arc::new(AtomicBool::new(false)), |_| 3).unwrap();
        assert_eq!(again.wait().unwrap(), 3);
    });
}

#[test]
fn wait_gives_the_result_and_a_panic_is_an_error() {
    let _dog = common::Watchdog::new(60, "waiting for short tasks");
    on_main(|eal| {
        let stop = Arc::new(AtomicBool::new(false));
        let t = eal
            .launch(worker(eal), Arc::clone(&stop), |stop| if stop.load(Ordering::SeqCst) { -1 } else { 42 })
            .unwrap();
        assert_eq!(t.lcore(), worker(eal));
        assert_eq!(t.wait().unwrap(), 42);
        assert!(!stop.load(Ordering::SeqCst), "wait does not set the stop flag");

        let t = eal.launch(worker(eal), stop, |_| panic!("task failure on purpose")).unwrap();
        let e = t.wait().unwrap_err().to_string();
        assert!(e.contains("panicked"), "{e}");
    });
}

#[test]
fn launch_refuses_lcores_that_are_not_workers() {
    on_main(|eal| {
        let stop = Arc::new(AtomicBool::new(false));
        for l in [eal.main_lcore(), LcoreId(5)] {
            let e = eal.launch(l, Arc::clone(&stop), |_| 0).unwrap_err().to_string();
            assert!(e.contains("not an enabled worker lcore"), "{e}");
        }
        assert_eq!(eal.holders().tasks, 0);
    });
}
