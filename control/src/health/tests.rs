use std::collections::{BTreeMap, BTreeSet};

use super::*;
use sluice_dataplane::handshake::{Answer, Outcome};

fn o(service: u32, endpoint: u16, answer: Answer) -> Outcome {
    Outcome { service, endpoint, incarnation: 1, answer, micros: if answer == Answer::SynAck { 100 } else { 0 } }
}

#[test]
fn an_endpoint_that_fails_fall_handshakes_in_a_row_is_wanted_out_then_back() {
    let mut p = Passive::default();
    let t0 = Instant::now();
    // Endpoint 2 answers with RSTs; 1 accepts.
    for k in 0..FALL - 1 {
        p.take(&[o(7, 1, Answer::SynAck), o(7, 2, Answer::Reset)], None, t0 + Duration::from_millis(u64::from(k)));
    }
    assert!(p.records[&(7, 2, 1)].out_until.is_none(), "one failure short");
    // A success between failures starts the count again.
    p.take(&[o(7, 2, Answer::SynAck)], None, t0);
    for _ in 0..FALL - 1 {
        p.take(&[o(7, 2, Answer::Reset)], None, t0);
    }
    assert!(p.records[&(7, 2, 1)].out_until.is_none());
    p.take(&[o(7, 2, Answer::Unanswered)], None, t0);
    let r = &p.records[&(7, 2, 1)];
    assert_eq!(r.out_until, Some(t0 + EJECTION));
    assert_eq!((r.reset, r.unanswered, r.succeeded), (2 * (u64::from(FALL) - 1), 1, 1));
    // While out, handshakes begun before count, but not towards the next time.
    for _ in 0..FALL {
        p.take(&[o(7, 2, Answer::Reset)], None, t0 + EJECTION / 2);
    }
    let r = &p.records[&(7, 2, 1)];
    assert_eq!((r.out_until, r.in_a_row), (Some(t0 + EJECTION), 0), "already out: the time stands");
    // Back when its time is up; out again after FALL more failures, for
    // twice as long.
    let snap = snapshot_with(7, "web", 2);
    let back = t0 + EJECTION;
    assert!(p.wanted(&snap, back - Duration::from_millis(1)).contains_key("web"));
    assert!(p.wanted(&snap, back).is_empty());
    for k in 0..FALL {
        assert!(p.records[&(7, 2, 1)].out_until.is_none(), "{k} failures after its return");
        p.take(&[o(7, 2, Answer::Reset)], None, back);
    }
    assert_eq!(p.records[&(7, 2, 1)].out_until, Some(back + 2 * EJECTION));
    assert_eq!(p.wanted(&snap, back), BTreeMap::from([("web".to_owned(), BTreeSet::from([2]))]));
}

/// A snapshot with service `key` named `name`, of endpoints 0..=`last`
/// (incarnation 1).
pub(crate) fn snapshot_with(key: u32, name: &str, last: u16) -> Snapshot {
    use crate::fixture::{endpoint, one_service, web};
    use sluice_dataplane::addr::Addr;
    use sluice_dataplane::service::{Algorithm, ServiceSpec};
    let endpoints = (0..=last).map(|id| endpoint(id, 1, Addr::v4([10, 0, 0, 10 + u8::try_from(id).unwrap()]))).collect();
    one_service(&ServiceSpec { name: name.to_owned(), limit: 32, table_size: 251, ..web(key, Algorithm::Maglev, true, endpoints) })
}

#[test]
fn unanswered_syns_count_only_where_answers_come_back_and_nothing_was_dropped_here() {
    let mut p = Passive::default();
    let t0 = Instant::now();
    // Service 3's answers never come through here: not judged.
    for _ in 0..2 * FALL {
        p.take(&[o(3, 0, Answer::Unanswered)], None, t0);
    }
    assert!(p.records.is_empty());
    assert_eq!(p.discounted, u64::from(2 * FALL));
    // Service 4 answers: judged, but not while this appliance drops.
    p.take(&[o(4, 0, Answer::SynAck)], None, t0);
    for _ in 0..2 * FALL {
        p.take(&[o(4, 1, Answer::Unanswered), o(4, 1, Answer::Retransmitted)], Some(t0), t0);
    }
    assert!(p.records.get(&(4, 1, 1)).is_none_or(|r| r.out_until.is_none()));
    // A drop up to the unanswered bound before still explains a loss; one
    // longer before does not.
    let d = p.discounted;
    p.take(&[o(4, 1, Answer::Unanswered)], Some(t0), t0 + UNANSWERED_AFTER);
    assert_eq!(p.discounted, d + 1);
    p.take(&[o(4, 1, Answer::Unanswered)], Some(t0), t0 + UNANSWERED_AFTER * 2);
    assert_eq!(p.discounted, d + 1);
    assert_eq!(p.records[&(4, 1, 1)].in_a_row, 1);
    for _ in 1..FALL {
        p.take(&[o(4, 1, Answer::Retransmitted)], None, t0);
    }
    assert!(p.records[&(4, 1, 1)].out_until.is_some());
}

#[test]
fn quantiles_of_recent_handshakes() {
    let v: VecDeque<u32> = (1..=10).rev().collect();
    assert_eq!(quantiles(&v), (Some(5), Some(9)));
    assert_eq!(quantiles(&VecDeque::new()), (None, None));
}
