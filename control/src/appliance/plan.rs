//! The port and queue plan: which queue of which device each worker polls
//! and sends on, and how the worker numbers its inputs and outputs.
//!
//! Every port and every exception tap has one receive and one transmit
//! queue per worker; worker `k` owns queue `k` of each. Outputs are the
//! ports in configuration order (so a snapshot's port index is an output
//! index), then the taps; inputs are the ports (through the pipeline, with
//! their tap as exception output), then the taps (passed through to their
//! port unchanged).

use sluice_dataplane::worker::Input;

/// A device queue, by the index of its port in the configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Queue {
    /// The port's own queue.
    Port(usize),
    /// The queue of the port's exception tap.
    Tap(usize),
}

/// The plan for all workers (each uses queue number = its own index).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Plan {
    /// Receive queues, by input index.
    pub(crate) rx: Vec<Queue>,
    /// Transmit queues, by output index.
    pub(crate) tx: Vec<Queue>,
    /// What the worker does with each input.
    pub(crate) inputs: Vec<Input>,
}

impl Plan {
    /// The plan for ports of which those with `has_tap[i]` have an exception tap.
    pub(super) fn new(has_tap: &[bool]) -> Plan {
        let ports = has_tap.len();
        let mut tx: Vec<Queue> = (0..ports).map(Queue::Port).collect();
        let mut tap_output = vec![None; ports];
        for (i, _) in has_tap.iter().enumerate().filter(|(_, t)| **t) {
            tap_output[i] = Some(tx.len());
            tx.push(Queue::Tap(i));
        }
        let mut rx: Vec<Queue> = (0..ports).map(Queue::Port).collect();
        let mut inputs: Vec<Input> = (0..ports)
            .map(|i| Input::Port { port: u8::try_from(i).unwrap_or(u8::MAX), exception: tap_output[i] })
            .collect();
        for (i, _) in has_tap.iter().enumerate().filter(|(_, t)| **t) {
            rx.push(Queue::Tap(i));
            inputs.push(Input::Passthrough { output: i });
        }
        Plan { rx, tx, inputs }
    }

    /// Number of outputs.
    pub(super) fn outputs(&self) -> usize {
        self.tx.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_then_taps_with_each_port_pointing_at_its_tap() {
        let p = Plan::new(&[true, false, true]);
        assert_eq!(p.tx, vec![Queue::Port(0), Queue::Port(1), Queue::Port(2), Queue::Tap(0), Queue::Tap(2)]);
        assert_eq!(p.rx, vec![Queue::Port(0), Queue::Port(1), Queue::Port(2), Queue::Tap(0), Queue::Tap(2)]);
        assert_eq!(
            p.inputs,
            vec![
                Input::Port { port: 0, exception: Some(3) },
                Input::Port { port: 1, exception: None },
                Input::Port { port: 2, exception: Some(4) },
                Input::Passthrough { output: 0 },
                Input::Passthrough { output: 2 },
            ]
        );
        assert_eq!(p.outputs(), 5);
        assert!(p.inputs.len() == p.rx.len());
    }
}
