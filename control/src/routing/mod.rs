//! TEMPORARY bridge over the old `ip`-based kernel module until the
//! netlink implementation lands (same API).
pub mod neighbours {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use sluice_dataplane::addr::Addr;
    use tokio::sync::watch;

    use crate::kernel::NeighborTable;
    use crate::reconcile::NeighMap;

    /// Keeps next hops resolved.
    #[derive(Debug, Clone)]
    pub struct Neighbours {
        table: Arc<Mutex<NeighborTable>>,
        want: Arc<Mutex<Vec<(u8, Addr)>>>,
    }

    impl Neighbours {
        /// Starts following the kernel's neighbours on `ifaces`.
        pub fn spawn(ifaces: Vec<String>) -> anyhow::Result<(Neighbours, watch::Receiver<NeighMap>)> {
            let (tx, rx) = watch::channel(NeighMap::new());
            let n = Neighbours { table: Arc::new(Mutex::new(NeighborTable::new(ifaces))), want: Arc::new(Mutex::new(Vec::new())) };
            let m = n.clone();
            tokio::spawn(async move {
                loop {
                    let m2 = m.clone();
                    let map = tokio::task::spawn_blocking(move || {
                        let w = m2.want.lock().map(|w| w.clone()).unwrap_or_default();
                        let mut t = m2.table.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                        t.sync(&w);
                        t.read().ok()
                    })
                    .await
                    .ok()
                    .flatten();
                    if let Some(map) = map {
                        tx.send_if_modified(|cur| if *cur == map { false } else { *cur = map; true });
                    }
                    if tx.is_closed() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            });
            Ok((n, rx))
        }

        /// The next hops to keep resolved.
        pub fn want(&self, hops: Vec<(u8, Addr)>) {
            if let Ok(mut w) = self.want.lock() {
                *w = hops;
            }
        }

        /// Removes every managed entry.
        pub async fn clear(&self) {
            let t = Arc::clone(&self.table);
            let _ = tokio::task::spawn_blocking(move || {
                if let Ok(mut t) = t.lock() {
                    t.clear();
                }
            })
            .await;
        }
    }
}

/// TEMPORARY: kernel interface counters from sysfs until netlink lands.
pub mod links {
    /// Reads kernel interface counters.
    #[derive(Debug, Clone, Default)]
    pub struct Counters;

    impl Counters {
        /// Frames the kernel interface received.
        pub async fn rx_packets(&self, iface: &str) -> Option<u64> {
            let p = format!("/sys/class/net/{iface}/statistics/rx_packets");
            std::fs::read_to_string(p).ok()?.trim().parse().ok()
        }
    }
}
