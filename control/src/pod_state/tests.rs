use super::*;

const ALL_MODES: [Gates; 4] = [
    Gates::HYBRID,
    Gates::QUEUE_PROXY_ONLY,
    Gates::QUARANTINE_ONLY,
    Gates::MINIMAL,
];

fn at(seconds: u64) -> Timestamp {
    Timestamp::from_epoch_offset(Duration::from_secs(seconds))
}

fn at_millis(milliseconds: u64) -> Timestamp {
    Timestamp::from_epoch_offset(Duration::from_millis(milliseconds))
}

fn windows() -> Windows {
    Windows::default()
}

fn qp(event: QueueProxyEvent) -> Event {
    Event::QueueProxy(event)
}

fn omitted(in_flight: u32) -> Event {
    Event::InformerOmitted { in_flight }
}

fn transition(from: PodState, to: PodState, reason: Reason) -> Outcome {
    Outcome::Transition { from, to, reason }
}

/// The rows of the tables in the module doc.
fn documented_rows() -> Vec<&'static str> {
    include_str!("../pod_state.rs")
        .lines()
        .filter_map(|line| line.strip_prefix("//! "))
        .filter(|line| line.starts_with('|'))
        .collect()
}

/// Every row of the transition table (the one whose last column is `test`) names the test
/// that checks it, and that test is here.
#[test]
fn every_row_of_the_transition_table_names_a_test_of_this_module() {
    let source = include_str!("tests.rs");
    let rows = documented_rows();
    let header = rows
        .iter()
        .position(|row| row.starts_with("| from "))
        .expect("the module doc has the transition table");
    let mut named = 0;
    // Its rows follow the header and the separator, up to the first line of another table.
    for row in rows[header + 2..]
        .iter()
        .take_while(|row| !row.starts_with("|--"))
    {
        let test = row
            .trim_end_matches([' ', '|'])
            .rsplit('|')
            .next()
            .map(|cell| cell.trim().trim_matches('`'))
            .unwrap_or_default();
        assert!(
            !test.is_empty() && source.contains(&format!("fn {test}()")),
            "the row {row:?} names {test:?}, which is not a test here"
        );
        named += 1;
    }
    assert!(named >= 40, "only {named} rows name a test");
}

/// ARCHITECTURE.md repeats the module's tables; a copy that drifts from the rules tells a
/// reader something false.
#[test]
fn architecture_md_repeats_the_tables_row_for_row() {
    let architecture = include_str!("../../../ARCHITECTURE.md");
    let section = architecture
        .split("\n## Pod state\n")
        .nth(1)
        .expect("ARCHITECTURE.md has a \"Pod state\" section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let repeated: Vec<&str> = section
        .lines()
        .filter(|line| line.starts_with('|'))
        .collect();
    assert_eq!(repeated, documented_rows());
}

/// A Ready pod the informer created at `now` (the QP never spoke).
fn ready_from_informer(now: Timestamp) -> Pod {
    Pod::first_seen(Event::InformerListed, Gates::HYBRID, now).expect("informer creates")
}

/// A pod the QP created at `now` with `event`, authority on.
fn from_queue_proxy(event: QueueProxyEvent, now: Timestamp) -> Pod {
    Pod::first_seen(qp(event), Gates::HYBRID, now).expect("QP creates")
}

/// A pod in `state`, reached through real events in hybrid mode, by `now`. Quarantined was
/// quarantined at `now` (count 1, until `now` + 1 s); Recovering expired at `now`.
fn pod_in(state: PodState, now: Timestamp) -> Pod {
    let mut pod = ready_from_informer(now);
    match state {
        PodState::Ready => {}
        PodState::NotReady => {
            pod.apply(qp(QueueProxyEvent::NotReady), Gates::HYBRID, windows(), now);
        }
        PodState::Quarantined => {
            pod.apply(Event::HealthCheckFailed, Gates::HYBRID, windows(), now);
        }
        PodState::Recovering => {
            // Quarantined one backoff before `now`, so it expires exactly at `now`.
            let start = Timestamp::from_epoch_offset(
                now.epoch_offset()
                    .saturating_sub(Pod::quarantine_backoff(1)),
            );
            pod = ready_from_informer(start);
            pod.apply(Event::HealthCheckFailed, Gates::HYBRID, windows(), start);
            pod.apply(Event::QuarantineExpired, Gates::HYBRID, windows(), now);
        }
    }
    assert_eq!(pod.state(), state, "helper must reach {state}");
    pod
}

const ALL_STATES: [PodState; 4] = PodState::ALL;

// === First sighting ===

#[test]
fn first_qp_ready_creates_a_ready_pod() {
    let pod = Pod::first_seen(qp(QueueProxyEvent::Ready), Gates::HYBRID, at(5)).unwrap();
    assert_eq!(pod.state(), PodState::Ready);
    assert_eq!(pod.reason(), Reason::QueueProxyReady);
    assert_eq!(pod.created_at(), at(5));
    assert_eq!(
        pod.last_queue_proxy_event(),
        Some((QueueProxyEvent::Ready, at(5)))
    );
}

#[test]
fn first_qp_not_ready_creates_a_not_ready_pod() {
    let pod = Pod::first_seen(qp(QueueProxyEvent::NotReady), Gates::HYBRID, at(0)).unwrap();
    assert_eq!(pod.state(), PodState::NotReady);
    assert_eq!(pod.reason(), Reason::QueueProxyNotReady);
}

#[test]
fn startup_for_an_unknown_pod_creates_it_not_ready() {
    for gates in [Gates::HYBRID, Gates::QUEUE_PROXY_ONLY] {
        let pod = Pod::first_seen(qp(QueueProxyEvent::Startup), gates, at(0)).unwrap();
        assert_eq!(pod.state(), PodState::NotReady);
        assert_eq!(pod.reason(), Reason::QueueProxyStartup);
    }
}

/// ★ Diverges from the fork, which created the pod Ready (`informer-added`) whatever the
/// event, even `not-ready`. Here the informer promotes it (next test in the table).
#[test]
fn first_qp_event_creates_a_pending_pod_when_authority_is_off() {
    for gates in [Gates::QUARANTINE_ONLY, Gates::MINIMAL] {
        for event in [
            QueueProxyEvent::Ready,
            QueueProxyEvent::NotReady,
            QueueProxyEvent::Startup,
        ] {
            let mut pod = Pod::first_seen(qp(event), gates, at(0)).unwrap();
            assert_eq!(pod.state(), PodState::NotReady, "{event:?}");
            assert_eq!(pod.reason(), Reason::InformerPending);
            assert_eq!(pod.last_queue_proxy_event(), Some((event, at(0))));
            assert_eq!(
                pod.apply(Event::InformerListed, gates, windows(), at(1)),
                transition(
                    PodState::NotReady,
                    PodState::Ready,
                    Reason::InformerPromoted
                )
            );
        }
    }
}

/// Acceptance case 10.
#[test]
fn draining_for_an_unknown_pod_is_ignored_in_every_mode() {
    for gates in ALL_MODES {
        assert_eq!(
            Pod::first_seen(qp(QueueProxyEvent::Draining), gates, at(0)),
            None,
            "{}",
            gates.mode_label()
        );
    }
}

/// Acceptance case 19 (new pods start Ready) and the fork's "informer creates and promotes
/// pods immediately": the fork's NotReady-then-promoted step is not observable, so it is
/// one step here.
#[test]
fn informer_listing_creates_a_ready_pod_in_every_mode() {
    for gates in ALL_MODES {
        let pod = Pod::first_seen(Event::InformerListed, gates, at(3)).unwrap();
        assert_eq!(pod.state(), PodState::Ready);
        assert_eq!(pod.reason(), Reason::InformerAdded);
        assert_eq!(pod.last_queue_proxy_event(), None);
        assert!(pod.is_routable());
    }
}

#[test]
fn other_events_do_not_create_a_pod() {
    for gates in ALL_MODES {
        for event in [
            omitted(0),
            Event::HealthCheckFailed,
            Event::HealthCheckPassed,
            Event::QuarantineExpired,
            Event::RequestSucceeded,
            Event::IpReused,
        ] {
            assert_eq!(Pod::first_seen(event, gates, at(0)), None, "{event:?}");
        }
    }
}

// === QP events on a known pod ===

#[test]
fn qp_ready_promotes_not_ready() {
    for gates in [Gates::HYBRID, Gates::QUEUE_PROXY_ONLY] {
        let mut pod = from_queue_proxy(QueueProxyEvent::NotReady, at(0));
        assert_eq!(
            pod.apply(qp(QueueProxyEvent::Ready), gates, windows(), at(2)),
            transition(PodState::NotReady, PodState::Ready, Reason::QueueProxyReady)
        );
        assert_eq!(pod.state_since(), at(2));
    }
}

#[test]
fn qp_ready_on_ready_only_refreshes_freshness() {
    let mut pod = from_queue_proxy(QueueProxyEvent::Ready, at(0));
    assert_eq!(
        pod.apply(qp(QueueProxyEvent::Ready), Gates::HYBRID, windows(), at(25)),
        Outcome::Unchanged
    );
    assert_eq!(
        pod.last_queue_proxy_event(),
        Some((QueueProxyEvent::Ready, at(25)))
    );
    // The refresh extends the shield: 50 s after the first `ready`, 25 s after the second.
    assert_eq!(
        pod.apply(omitted(0), Gates::HYBRID, windows(), at(50)),
        Outcome::Unchanged
    );
}

/// Acceptance case 20: "A QP `ready` does not lift quarantine".
#[test]
fn qp_ready_does_not_lift_quarantine() {
    for state in [PodState::Quarantined, PodState::Recovering] {
        let mut pod = pod_in(state, at(10));
        assert_eq!(
            pod.apply(qp(QueueProxyEvent::Ready), Gates::HYBRID, windows(), at(10)),
            Outcome::Unchanged
        );
        assert_eq!(pod.state(), state);
    }
}

/// ★ Extension: the quarantine gate was turned off while the pod was Quarantined or
/// Recovering; the fork left it unroutable until the informer dropped it.
#[test]
fn qp_ready_releases_a_pod_left_in_quarantine_when_quarantine_is_off() {
    for state in [PodState::Quarantined, PodState::Recovering] {
        let mut pod = pod_in(state, at(10));
        assert_eq!(
            pod.apply(
                qp(QueueProxyEvent::Ready),
                Gates::QUEUE_PROXY_ONLY,
                windows(),
                at(11)
            ),
            transition(state, PodState::Ready, Reason::QueueProxyReady)
        );
        assert_eq!(pod.quarantine_count(), 0);
        assert_eq!(pod.quarantine_until(), None);
    }
}

#[test]
fn qp_not_ready_demotes_ready() {
    for gates in [Gates::HYBRID, Gates::QUEUE_PROXY_ONLY] {
        let mut pod = ready_from_informer(at(0));
        assert_eq!(
            pod.apply(qp(QueueProxyEvent::NotReady), gates, windows(), at(1)),
            transition(
                PodState::Ready,
                PodState::NotReady,
                Reason::QueueProxyNotReady
            )
        );
        assert!(!pod.is_routable());
    }
}

/// Acceptance case 8 ("`not-ready` on NotReady is a no-op"; fork "probe flapping").
#[test]
fn qp_not_ready_on_not_ready_is_a_no_op() {
    let mut pod = from_queue_proxy(QueueProxyEvent::NotReady, at(0));
    assert_eq!(
        pod.apply(
            qp(QueueProxyEvent::NotReady),
            Gates::HYBRID,
            windows(),
            at(1)
        ),
        Outcome::Unchanged
    );
    assert_eq!(pod.state_since(), at(0));
}

/// Acceptance case 20, fork "podRecovering can receive QP events": kept as the fork does.
#[test]
fn qp_not_ready_does_not_change_recovering() {
    let mut pod = pod_in(PodState::Recovering, at(10));
    assert_eq!(
        pod.apply(
            qp(QueueProxyEvent::NotReady),
            Gates::HYBRID,
            windows(),
            at(10)
        ),
        Outcome::Unchanged
    );
    assert_eq!(pod.state(), PodState::Recovering);
    assert_eq!(
        pod.last_queue_proxy_event(),
        Some((QueueProxyEvent::NotReady, at(10)))
    );
}

#[test]
fn qp_not_ready_does_not_change_quarantined() {
    let mut pod = pod_in(PodState::Quarantined, at(10));
    assert_eq!(
        pod.apply(
            qp(QueueProxyEvent::NotReady),
            Gates::HYBRID,
            windows(),
            at(10)
        ),
        Outcome::Unchanged
    );
    assert_eq!(pod.state(), PodState::Quarantined);
    assert_eq!(pod.quarantine_until(), Some(at(11)));
}

/// Acceptance cases 9 and 20: "QP `draining` works from Ready and from Recovering".
#[test]
fn qp_draining_takes_ready_and_recovering_out_of_routing() {
    for state in [PodState::Ready, PodState::Recovering] {
        let mut pod = pod_in(state, at(10));
        assert_eq!(
            pod.apply(
                qp(QueueProxyEvent::Draining),
                Gates::HYBRID,
                windows(),
                at(12)
            ),
            transition(state, PodState::NotReady, Reason::QueueProxyDraining)
        );
        assert!(!pod.is_routable());
    }
}

#[test]
fn qp_draining_on_not_ready_only_updates_the_reason() {
    let mut pod = from_queue_proxy(QueueProxyEvent::NotReady, at(0));
    assert_eq!(
        pod.apply(
            qp(QueueProxyEvent::Draining),
            Gates::HYBRID,
            windows(),
            at(4)
        ),
        Outcome::Unchanged
    );
    assert_eq!(pod.state(), PodState::NotReady);
    assert_eq!(pod.reason(), Reason::QueueProxyDraining);
    assert_eq!(
        pod.state_since(),
        at(0),
        "a refined reason is not a transition"
    );
}

/// ★ Diverges from the fork, where Quarantined ignored `draining` and its expiry later made
/// the shutting-down pod Recovering, hence routable.
#[test]
fn qp_draining_takes_a_quarantined_pod_out_for_good() {
    let mut pod = pod_in(PodState::Quarantined, at(10));
    assert_eq!(
        pod.apply(
            qp(QueueProxyEvent::Draining),
            Gates::HYBRID,
            windows(),
            at(10)
        ),
        transition(
            PodState::Quarantined,
            PodState::NotReady,
            Reason::QueueProxyDraining
        )
    );
    assert_eq!(pod.quarantine_until(), None);
    assert_eq!(
        pod.apply(Event::QuarantineExpired, Gates::HYBRID, windows(), at(20)),
        Outcome::Unchanged
    );
    assert!(!pod.is_routable());
}

/// ★ The fork reached `logger.Fatalw` here and crashed the activator.
#[test]
fn startup_for_a_known_pod_is_a_no_op() {
    for gates in ALL_MODES {
        for state in ALL_STATES {
            let mut pod = pod_in(state, at(10));
            let before = pod.clone();
            assert_eq!(
                pod.apply(qp(QueueProxyEvent::Startup), gates, windows(), at(11)),
                Outcome::Unchanged
            );
            assert_eq!(pod.state(), before.state());
            assert_eq!(pod.reason(), before.reason());
            assert_eq!(
                pod.last_queue_proxy_event(),
                Some((QueueProxyEvent::Startup, at(11)))
            );
        }
    }
}

/// Acceptance case 19 and fork "QP events received but do not trigger state changes".
#[test]
fn qp_events_only_refresh_freshness_when_authority_is_off() {
    for gates in [Gates::QUARANTINE_ONLY, Gates::MINIMAL] {
        for state in ALL_STATES {
            for event in [
                QueueProxyEvent::Startup,
                QueueProxyEvent::Ready,
                QueueProxyEvent::NotReady,
                QueueProxyEvent::Draining,
            ] {
                let mut pod = pod_in(state, at(10));
                assert_eq!(
                    pod.apply(qp(event), gates, windows(), at(12)),
                    Outcome::Unchanged,
                    "{state} {event:?}"
                );
                assert_eq!(pod.state(), state);
                assert_eq!(pod.last_queue_proxy_event(), Some((event, at(12))));
            }
        }
    }
}

// === Informer listing ===

/// Acceptance case 15: never heard from the QP → the informer is authoritative. A NotReady
/// pod without QP history is one the informer dropped while busy and lists again.
#[test]
fn informer_promotes_not_ready_when_the_queue_proxy_is_silent() {
    let mut pod = ready_from_informer(at(0));
    pod.apply(omitted(1), Gates::HYBRID, windows(), at(1));
    assert_eq!(pod.state(), PodState::NotReady);
    assert_eq!(
        pod.authority(Gates::HYBRID, windows(), at(2)),
        Authority::Informer
    );
    assert_eq!(
        pod.apply(Event::InformerListed, Gates::HYBRID, windows(), at(2)),
        transition(
            PodState::NotReady,
            PodState::Ready,
            Reason::InformerPromoted
        )
    );
}

/// Acceptance case 12 and fork "fresh QP data blocks informer promotion".
#[test]
fn qp_not_ready_blocks_informer_promotion_while_fresh() {
    let mut pod = from_queue_proxy(QueueProxyEvent::NotReady, at(0));
    pod.apply(
        qp(QueueProxyEvent::NotReady),
        Gates::HYBRID,
        windows(),
        at(1),
    );
    assert_eq!(
        pod.apply(Event::InformerListed, Gates::HYBRID, windows(), at(5)),
        Outcome::Unchanged
    );
    assert_eq!(pod.state(), PodState::NotReady);
}

/// The band between the windows: a non-ready word keeps the pod out until `qp_staleness`.
/// Also covers `startup` and `draining`, which claim the same.
#[test]
fn qp_not_ready_blocks_informer_promotion_until_staleness() {
    for event in [
        QueueProxyEvent::NotReady,
        QueueProxyEvent::Startup,
        QueueProxyEvent::Draining,
    ] {
        let mut pod = ready_from_informer(at(0));
        pod.apply(qp(event), Gates::HYBRID, windows(), at(100));
        pod.apply(omitted(1), Gates::HYBRID, windows(), at(100));
        assert_eq!(pod.state(), PodState::NotReady, "{event:?}");
        for blocked in [at(130), at(145), at_millis(159_999)] {
            assert_eq!(
                pod.apply(Event::InformerListed, Gates::HYBRID, windows(), blocked),
                Outcome::Unchanged,
                "{event:?} at {blocked:?}"
            );
        }
        assert_eq!(
            pod.apply(Event::InformerListed, Gates::HYBRID, windows(), at(160)),
            transition(
                PodState::NotReady,
                PodState::Ready,
                Reason::InformerPromoted
            )
        );
    }
}

/// Acceptance case 14, first half: QP `not-ready` 70 s old, informer lists → Ready.
#[test]
fn informer_promotes_not_ready_after_qp_staleness() {
    let mut pod = from_queue_proxy(QueueProxyEvent::NotReady, at(0));
    assert_eq!(
        pod.apply(Event::InformerListed, Gates::HYBRID, windows(), at(70)),
        transition(
            PodState::NotReady,
            PodState::Ready,
            Reason::InformerPromoted
        )
    );
}

/// The fork's "or lastQPState == ready": a `ready` never holds a pod out of routing.
#[test]
fn informer_promotes_not_ready_whose_last_qp_event_was_ready() {
    let mut pod = from_queue_proxy(QueueProxyEvent::Ready, at(0));
    // Dropped by the informer once the `ready` was no longer fresh, while busy.
    pod.apply(omitted(2), Gates::HYBRID, windows(), at(40));
    assert_eq!(pod.state(), PodState::NotReady);
    assert_eq!(
        pod.apply(Event::InformerListed, Gates::HYBRID, windows(), at(41)),
        transition(
            PodState::NotReady,
            PodState::Ready,
            Reason::InformerPromoted
        )
    );
}

/// ★ The fork had no promotion path with QP authority off.
#[test]
fn informer_promotes_not_ready_when_authority_is_off() {
    for gates in [Gates::QUARANTINE_ONLY, Gates::MINIMAL] {
        // NotReady while authority was on, with a fresh `not-ready` on record; then the gate
        // went off: the informer decides alone.
        let mut pod = from_queue_proxy(QueueProxyEvent::NotReady, at(0));
        assert_eq!(pod.authority(gates, windows(), at(1)), Authority::Informer);
        assert_eq!(
            pod.apply(Event::InformerListed, gates, windows(), at(1)),
            transition(
                PodState::NotReady,
                PodState::Ready,
                Reason::InformerPromoted
            )
        );
    }
}

#[test]
fn informer_listing_leaves_ready_unchanged() {
    for gates in ALL_MODES {
        let mut pod = ready_from_informer(at(0));
        assert_eq!(
            pod.apply(Event::InformerListed, gates, windows(), at(1)),
            Outcome::Unchanged
        );
        assert_eq!(pod.reason(), Reason::InformerAdded);
    }
}

/// Acceptance case 25 and fork "external state updates preserve recovering pods".
#[test]
fn informer_listing_does_not_force_recovering_or_quarantined_to_ready() {
    for gates in [Gates::HYBRID, Gates::QUARANTINE_ONLY] {
        for state in [PodState::Recovering, PodState::Quarantined] {
            let mut pod = pod_in(state, at(10));
            assert_eq!(
                pod.apply(Event::InformerListed, gates, windows(), at(10)),
                Outcome::Unchanged
            );
            assert_eq!(pod.state(), state);
        }
    }
}

/// ★ Extension, like `qp_ready_releases_a_pod_left_in_quarantine_when_quarantine_is_off`.
/// The QP rule for NotReady applies: a fresh `not-ready` still blocks.
#[test]
fn informer_releases_a_pod_left_in_quarantine_when_quarantine_is_off() {
    for gates in [Gates::QUEUE_PROXY_ONLY, Gates::MINIMAL] {
        for state in [PodState::Quarantined, PodState::Recovering] {
            let mut pod = pod_in(state, at(10));
            assert_eq!(
                pod.apply(Event::InformerListed, gates, windows(), at(11)),
                transition(state, PodState::Ready, Reason::InformerPromoted)
            );
            assert_eq!(pod.quarantine_count(), 0);
        }
    }
    let mut pod = pod_in(PodState::Quarantined, at(10));
    pod.apply(
        qp(QueueProxyEvent::NotReady),
        Gates::HYBRID,
        windows(),
        at(10),
    );
    assert_eq!(
        pod.apply(
            Event::InformerListed,
            Gates::QUEUE_PROXY_ONLY,
            windows(),
            at(11)
        ),
        Outcome::Unchanged
    );
}

// === Informer omission ===

/// Acceptance case 13, adapted (★): the fork shielded for 60 s; the shield is now
/// `qp_freshness`, 30 s, so the pod is checked at 10 s and 29.999 s instead of "< 60 s".
#[test]
fn fresh_qp_ready_protects_against_informer_removal() {
    for gates in [Gates::HYBRID, Gates::QUEUE_PROXY_ONLY] {
        let mut pod = from_queue_proxy(QueueProxyEvent::Ready, at(0));
        for protected in [at(10), at_millis(29_999)] {
            assert_eq!(
                pod.apply(omitted(0), gates, windows(), protected),
                Outcome::Unchanged
            );
            assert_eq!(pod.state(), PodState::Ready);
        }
    }
}

/// ★ The band between the windows: a `ready` of 30 s or more no longer shields (the fork
/// shielded until 60 s).
#[test]
fn qp_ready_older_than_freshness_no_longer_protects_against_removal() {
    let mut idle = from_queue_proxy(QueueProxyEvent::Ready, at(0));
    assert_eq!(
        idle.apply(omitted(0), Gates::HYBRID, windows(), at(30)),
        Outcome::Remove {
            from: PodState::Ready,
            reason: Reason::InformerRemoved
        }
    );
    let mut busy = from_queue_proxy(QueueProxyEvent::Ready, at(0));
    assert_eq!(
        busy.apply(omitted(3), Gates::HYBRID, windows(), at(45)),
        transition(PodState::Ready, PodState::NotReady, Reason::InformerRemoved)
    );
}

/// Acceptance case 19 (informer removal with nothing in flight → deleted) and fork "pods
/// transition to not-ready when removed by informer".
#[test]
fn informer_removal_deletes_an_idle_ready_pod() {
    for gates in ALL_MODES {
        for state in [PodState::Ready, PodState::Recovering] {
            let mut pod = pod_in(state, at(10));
            assert_eq!(
                pod.apply(omitted(0), gates, windows(), at(11)),
                Outcome::Remove {
                    from: state,
                    reason: Reason::InformerRemoved
                }
            );
            assert_eq!(pod.state(), PodState::NotReady);
        }
    }
}

/// Acceptance case 16: removal with 5 in flight → NotReady and kept; after the releases the
/// next informer update without the pod deletes it.
#[test]
fn informer_removal_keeps_a_busy_pod_not_ready_until_idle() {
    for gates in ALL_MODES {
        let mut pod = ready_from_informer(at(0));
        assert_eq!(
            pod.apply(omitted(5), gates, windows(), at(1)),
            transition(PodState::Ready, PodState::NotReady, Reason::InformerRemoved)
        );
        assert!(!pod.is_routable());
        assert_eq!(
            pod.apply(omitted(2), gates, windows(), at(2)),
            Outcome::Unchanged
        );
        assert_eq!(
            pod.apply(omitted(0), gates, windows(), at(3)),
            Outcome::Remove {
                from: PodState::NotReady,
                reason: Reason::InformerRemoved
            }
        );
    }
}

#[test]
fn informer_removal_of_recovering_ignores_qp_freshness() {
    let mut pod = pod_in(PodState::Recovering, at(10));
    pod.apply(qp(QueueProxyEvent::Ready), Gates::HYBRID, windows(), at(10));
    assert_eq!(
        pod.authority(Gates::HYBRID, windows(), at(11)),
        Authority::QueueProxyReady
    );
    assert_eq!(
        pod.apply(omitted(1), Gates::HYBRID, windows(), at(11)),
        transition(
            PodState::Recovering,
            PodState::NotReady,
            Reason::InformerRemoved
        )
    );
}

#[test]
fn informer_removal_of_not_ready_waits_for_in_flight_requests() {
    let mut pod = from_queue_proxy(QueueProxyEvent::NotReady, at(0));
    assert_eq!(
        pod.apply(omitted(1), Gates::HYBRID, windows(), at(1)),
        Outcome::Unchanged
    );
    assert_eq!(pod.reason(), Reason::QueueProxyNotReady);
    assert_eq!(
        pod.apply(omitted(0), Gates::HYBRID, windows(), at(2)),
        Outcome::Remove {
            from: PodState::NotReady,
            reason: Reason::InformerRemoved
        }
    );
}

/// ★ The fork deleted a quarantined tracker at once, whatever was in flight.
#[test]
fn informer_removal_of_quarantined_waits_for_in_flight_requests() {
    let mut idle = pod_in(PodState::Quarantined, at(10));
    assert_eq!(
        idle.apply(omitted(0), Gates::HYBRID, windows(), at(10)),
        Outcome::Remove {
            from: PodState::Quarantined,
            reason: Reason::InformerRemoved
        }
    );
    let mut busy = pod_in(PodState::Quarantined, at(10));
    assert_eq!(
        busy.apply(omitted(2), Gates::HYBRID, windows(), at(10)),
        transition(
            PodState::Quarantined,
            PodState::NotReady,
            Reason::InformerRemoved
        )
    );
    // Out of quarantine for good: the expiry timer cannot make it routable again.
    assert_eq!(
        busy.apply(Event::QuarantineExpired, Gates::HYBRID, windows(), at(20)),
        Outcome::Unchanged
    );
    assert!(!busy.is_routable());
}

// === Health and quarantine ===

/// Acceptance case 20: "a health-check failure quarantines a QP-ready pod".
#[test]
fn health_check_failure_quarantines_ready_with_backoff() {
    // Ready from the QP where it has authority, from the informer where it has not.
    let ways_to_ready = [
        (Gates::HYBRID, qp(QueueProxyEvent::Ready)),
        (Gates::QUARANTINE_ONLY, Event::InformerListed),
    ];
    for (gates, creation) in ways_to_ready {
        let mut pod = Pod::first_seen(creation, gates, at(0)).unwrap();
        assert_eq!(pod.state(), PodState::Ready);
        assert_eq!(
            pod.apply(Event::HealthCheckFailed, gates, windows(), at(100)),
            transition(
                PodState::Ready,
                PodState::Quarantined,
                Reason::HealthCheckFailed
            )
        );
        assert_eq!(pod.quarantine_count(), 1);
        assert_eq!(pod.quarantine_until(), Some(at(101)));
        assert!(!pod.is_routable());
    }
}

/// Acceptance case 24, second half: count + 1 and the backoff grows along the schedule.
#[test]
fn health_check_failure_on_recovering_requarantines_with_a_longer_backoff() {
    let mut pod = ready_from_informer(at(0));
    let mut now = at(0);
    let mut lengths = Vec::new();
    for expected_count in 1..=6 {
        pod.apply(Event::HealthCheckFailed, Gates::HYBRID, windows(), now);
        assert_eq!(pod.quarantine_count(), expected_count);
        let until = pod.quarantine_until().unwrap();
        lengths.push(until.elapsed_since(now).as_secs());
        now = until;
        assert_eq!(
            pod.apply(Event::QuarantineExpired, Gates::HYBRID, windows(), now),
            transition(
                PodState::Quarantined,
                PodState::Recovering,
                Reason::QuarantineExpired
            )
        );
    }
    assert_eq!(lengths, [1, 1, 2, 3, 5, 5]);
}

#[test]
fn health_check_failure_on_not_ready_or_quarantined_is_ignored() {
    let mut not_ready = from_queue_proxy(QueueProxyEvent::NotReady, at(0));
    assert_eq!(
        not_ready.apply(Event::HealthCheckFailed, Gates::HYBRID, windows(), at(1)),
        Outcome::Unchanged
    );
    assert_eq!(not_ready.quarantine_count(), 0);
    let mut quarantined = pod_in(PodState::Quarantined, at(10));
    assert_eq!(
        quarantined.apply(Event::HealthCheckFailed, Gates::HYBRID, windows(), at(10)),
        Outcome::Unchanged
    );
    assert_eq!(
        quarantined.quarantine_count(),
        1,
        "a quarantine is not stretched"
    );
    assert_eq!(quarantined.quarantine_until(), Some(at(11)));
}

/// Acceptance case 22: an end in the past → Recovering (on probation); in the future → stays
/// Quarantined and excluded.
#[test]
fn quarantine_expiry_moves_to_recovering_only_when_due() {
    let mut pod = pod_in(PodState::Quarantined, at(10));
    assert_eq!(
        pod.apply(
            Event::QuarantineExpired,
            Gates::HYBRID,
            windows(),
            at_millis(10_999)
        ),
        Outcome::Unchanged
    );
    assert!(!pod.is_routable());
    assert_eq!(
        pod.apply(Event::QuarantineExpired, Gates::HYBRID, windows(), at(11)),
        transition(
            PodState::Quarantined,
            PodState::Recovering,
            Reason::QuarantineExpired
        )
    );
    assert!(
        !pod.is_routable(),
        "on probation, not routable until a probe passes"
    );
    assert_eq!(pod.quarantine_until(), None);
    // A late duplicate of the timer does nothing.
    assert_eq!(
        pod.apply(Event::QuarantineExpired, Gates::HYBRID, windows(), at(50)),
        Outcome::Unchanged
    );
}

/// Acceptance case 24, first half: a success on Recovering → Ready and count 0.
#[test]
fn success_on_recovering_promotes_to_ready_and_resets_the_count() {
    for success in [Event::RequestSucceeded, Event::HealthCheckPassed] {
        let mut pod = pod_in(PodState::Recovering, at(10));
        assert_eq!(pod.quarantine_count(), 1);
        assert_eq!(
            pod.apply(success, Gates::HYBRID, windows(), at(12)),
            transition(PodState::Recovering, PodState::Ready, Reason::Recovered)
        );
        assert_eq!(pod.quarantine_count(), 0);
    }
}

#[test]
fn success_outside_recovering_changes_nothing() {
    for state in [PodState::Ready, PodState::NotReady, PodState::Quarantined] {
        for success in [Event::RequestSucceeded, Event::HealthCheckPassed] {
            let mut pod = pod_in(state, at(10));
            let before = pod.clone();
            assert_eq!(
                pod.apply(success, Gates::HYBRID, windows(), at(10)),
                Outcome::Unchanged
            );
            assert_eq!(pod, before, "{state} {success:?}");
        }
    }
}

/// Acceptance case 27: quarantine off → no quarantine, and only Ready is routable.
#[test]
fn health_events_are_ignored_when_quarantine_is_off() {
    for gates in [Gates::QUEUE_PROXY_ONLY, Gates::MINIMAL] {
        for state in ALL_STATES {
            for event in [
                Event::HealthCheckFailed,
                Event::HealthCheckPassed,
                Event::QuarantineExpired,
                Event::RequestSucceeded,
            ] {
                let mut pod = pod_in(state, at(10));
                let before = pod.clone();
                assert_eq!(
                    pod.apply(event, gates, windows(), at(100)),
                    Outcome::Unchanged
                );
                assert_eq!(pod, before, "{state} {event:?}");
            }
            assert_eq!(
                pod_in(state, at(10)).is_routable(),
                state == PodState::Ready
            );
        }
    }
}

/// Acceptance case 26, the state half: a mismatched revision removes the pod (never
/// quarantines it), whatever its state and the in-flight count.
#[test]
fn ip_reuse_removes_the_pod_in_every_state_and_mode() {
    for gates in ALL_MODES {
        for state in ALL_STATES {
            let mut pod = pod_in(state, at(10));
            assert_eq!(
                pod.apply(Event::IpReused, gates, windows(), at(10)),
                Outcome::Remove {
                    from: state,
                    reason: Reason::IpReused
                }
            );
            assert_eq!(pod.state(), PodState::NotReady);
            assert_eq!(pod.quarantine_until(), None);
        }
    }
}

// === Routability ===

/// Acceptance case 23: {Ready, Recovering, Quarantined (not expired), NotReady} → exactly
/// {Ready, Recovering}; with quarantine off → {Ready}.
#[test]
fn only_ready_is_routable_whatever_the_gates() {
    let pods: Vec<Pod> = ALL_STATES.iter().map(|&s| pod_in(s, at(10))).collect();
    let routable: Vec<PodState> = pods
        .iter()
        .filter(|pod| pod.is_routable())
        .map(Pod::state)
        .collect();
    assert_eq!(routable, [PodState::Ready]);
}

/// Acceptance case 18, the routing half: 3 NotReady + 2 Ready → 2 routable. The fork's
/// capacity of 5 is not copied (SPEC §3: capacity counts routable pods); capacity lives
/// in the throttling core, not here.
#[test]
fn only_ready_pods_of_a_mixed_set_are_routable() {
    let mut pods = Vec::new();
    for _ in 0..3 {
        pods.push(from_queue_proxy(QueueProxyEvent::NotReady, at(0)));
    }
    for _ in 0..2 {
        pods.push(from_queue_proxy(QueueProxyEvent::Ready, at(0)));
    }
    let routable = pods.iter().filter(|pod| pod.is_routable()).count();
    assert_eq!(routable, 2);
}

// === Stale collection ===

/// ★ Measured from when the pod became NotReady (the fork measured from creation).
#[test]
fn not_ready_pod_is_stale_ten_minutes_after_it_became_not_ready() {
    let mut pod = ready_from_informer(at(0));
    pod.apply(
        qp(QueueProxyEvent::NotReady),
        Gates::HYBRID,
        windows(),
        at(1_200),
    );
    // Created 20 min ago, NotReady for 1 s: the fork would collect it, we do not.
    assert!(!pod.is_stale(at(1_201), 0));
    assert!(
        !pod.is_stale(at(1_800), 0),
        "exactly 10 min is not more than 10 min"
    );
    assert!(pod.is_stale(at(1_801), 0));
}

/// Acceptance case 35: Ready or in-flight > 0 → kept.
#[test]
fn busy_or_routable_pods_are_never_stale() {
    let not_ready = from_queue_proxy(QueueProxyEvent::NotReady, at(0));
    assert!(!not_ready.is_stale(at(10_000), 1));
    for state in [PodState::Ready, PodState::Quarantined, PodState::Recovering] {
        assert!(!pod_in(state, at(10)).is_stale(at(10_000), 0), "{state}");
    }
}

// === Backoff schedule ===

/// Acceptance case 21.
#[test]
fn quarantine_backoff_follows_the_schedule() {
    let schedule = [
        (0, 1),
        (1, 1),
        (2, 1),
        (3, 2),
        (4, 3),
        (5, 5),
        (10, 5),
        (u32::MAX, 5),
    ];
    for (count, seconds) in schedule {
        assert_eq!(
            Pod::quarantine_backoff(count),
            Duration::from_secs(seconds),
            "count {count}"
        );
    }
}

// === Scenarios from the fork's acceptance cases ===

/// Acceptance case 8: `not-ready` creates NotReady, then `ready`, `not-ready`, `ready`.
#[test]
fn qp_full_cycle_not_ready_ready_not_ready_ready() {
    let mut pod = from_queue_proxy(QueueProxyEvent::NotReady, at(0));
    let steps = [
        (QueueProxyEvent::Ready, PodState::Ready),
        (QueueProxyEvent::NotReady, PodState::NotReady),
        (QueueProxyEvent::Ready, PodState::Ready),
    ];
    for (second, (event, expected)) in (1..).zip(steps) {
        pod.apply(qp(event), Gates::HYBRID, windows(), at(second));
        assert_eq!(pod.state(), expected, "after {event:?}");
    }
}

/// Acceptance case 9 and fork "draining pod not removed until refCount zero": the pod
/// leaves routing at once, survives the informer while busy, and goes once idle.
#[test]
fn draining_pod_keeps_in_flight_requests_until_informer_removal() {
    let mut pod = from_queue_proxy(QueueProxyEvent::NotReady, at(0));
    pod.apply(qp(QueueProxyEvent::Ready), Gates::HYBRID, windows(), at(1));
    pod.apply(
        qp(QueueProxyEvent::Draining),
        Gates::HYBRID,
        windows(),
        at(2),
    );
    assert!(!pod.is_routable());
    assert_eq!(
        pod.apply(omitted(5), Gates::HYBRID, windows(), at(3)),
        Outcome::Unchanged
    );
    assert_eq!(
        pod.apply(omitted(0), Gates::HYBRID, windows(), at(4)),
        Outcome::Remove {
            from: PodState::NotReady,
            reason: Reason::InformerRemoved
        }
    );
}

/// Acceptance case 11: a QP event records itself and its time.
#[test]
fn qp_events_record_event_and_time() {
    let mut pod = from_queue_proxy(QueueProxyEvent::NotReady, at(7));
    assert_eq!(
        pod.last_queue_proxy_event(),
        Some((QueueProxyEvent::NotReady, at(7)))
    );
    pod.apply(qp(QueueProxyEvent::Ready), Gates::HYBRID, windows(), at(9));
    assert_eq!(
        pod.last_queue_proxy_event(),
        Some((QueueProxyEvent::Ready, at(9)))
    );
}

/// Acceptance case 14, second half, and fork "stale QP data allows informer to drain":
/// `ready` 70 s old, informer omits, a request in flight → NotReady, not deleted.
#[test]
fn stale_qp_ready_lets_informer_demote_a_busy_pod() {
    let mut pod = from_queue_proxy(QueueProxyEvent::Ready, at(0));
    assert_eq!(
        pod.apply(omitted(1), Gates::HYBRID, windows(), at(70)),
        transition(PodState::Ready, PodState::NotReady, Reason::InformerRemoved)
    );
}

/// Acceptance case 17: the informer removes the pod, then a QP `not-ready` re-creates it.
#[test]
fn informer_removal_then_qp_not_ready_recreates_the_pod() {
    let mut pod = ready_from_informer(at(0));
    assert!(matches!(
        pod.apply(omitted(0), Gates::HYBRID, windows(), at(1)),
        Outcome::Remove { .. }
    ));
    let recreated = from_queue_proxy(QueueProxyEvent::NotReady, at(2));
    assert_eq!(recreated.state(), PodState::NotReady);
    assert_eq!(recreated.created_at(), at(2));
}

/// Acceptance cases 20, 22 and 24 in one life: quarantine beats QP readiness, probation is
/// routable and left by a success.
#[test]
fn hybrid_quarantine_round_trip() {
    let gates = Gates::HYBRID;
    let mut pod = from_queue_proxy(QueueProxyEvent::NotReady, at(0));
    pod.apply(qp(QueueProxyEvent::Ready), gates, windows(), at(1));
    pod.apply(Event::HealthCheckFailed, gates, windows(), at(2));
    assert_eq!(pod.state(), PodState::Quarantined);
    pod.apply(qp(QueueProxyEvent::Ready), gates, windows(), at(2));
    assert_eq!(
        pod.state(),
        PodState::Quarantined,
        "QP ready does not lift it"
    );
    pod.apply(Event::QuarantineExpired, gates, windows(), at(3));
    assert_eq!(pod.state(), PodState::Recovering);
    assert!(!pod.is_routable(), "on probation, not routable");
    pod.apply(qp(QueueProxyEvent::NotReady), gates, windows(), at(4));
    assert_eq!(
        pod.state(),
        PodState::Recovering,
        "QP not-ready keeps probation"
    );
    pod.apply(Event::RequestSucceeded, gates, windows(), at(5));
    assert_eq!(pod.state(), PodState::Ready);
    assert_eq!(pod.quarantine_count(), 0);
}

/// The four modes side by side: one row of observations per mode.
#[test]
fn every_gate_mode_behaves_as_documented() {
    struct Expected {
        gates: Gates,
        qp_not_ready_demotes_ready: bool,
        health_failure_quarantines: bool,
        fresh_not_ready_blocks_informer: bool,
    }
    let table = [
        Expected {
            gates: Gates::HYBRID,
            qp_not_ready_demotes_ready: true,
            health_failure_quarantines: true,
            fresh_not_ready_blocks_informer: true,
        },
        Expected {
            gates: Gates::QUEUE_PROXY_ONLY,
            qp_not_ready_demotes_ready: true,
            health_failure_quarantines: false,
            fresh_not_ready_blocks_informer: true,
        },
        Expected {
            gates: Gates::QUARANTINE_ONLY,
            qp_not_ready_demotes_ready: false,
            health_failure_quarantines: true,
            fresh_not_ready_blocks_informer: false,
        },
        Expected {
            gates: Gates::MINIMAL,
            qp_not_ready_demotes_ready: false,
            health_failure_quarantines: false,
            fresh_not_ready_blocks_informer: false,
        },
    ];
    for row in table {
        let gates = row.gates;
        let mode = gates.mode_label();

        let mut pod = ready_from_informer(at(0));
        pod.apply(qp(QueueProxyEvent::NotReady), gates, windows(), at(1));
        assert_eq!(
            pod.state() == PodState::NotReady,
            row.qp_not_ready_demotes_ready,
            "{mode}: QP not-ready on Ready"
        );

        let mut pod = ready_from_informer(at(0));
        pod.apply(Event::HealthCheckFailed, gates, windows(), at(1));
        assert_eq!(
            pod.state() == PodState::Quarantined,
            row.health_failure_quarantines,
            "{mode}: health failure on Ready"
        );

        // A NotReady pod with a `not-ready` 10 s old, listed by the informer.
        let mut pod = ready_from_informer(at(0));
        pod.apply(qp(QueueProxyEvent::NotReady), gates, windows(), at(1));
        pod.apply(omitted(1), gates, windows(), at(1));
        assert_eq!(pod.state(), PodState::NotReady, "{mode}");
        pod.apply(Event::InformerListed, gates, windows(), at(11));
        assert_eq!(
            pod.state() == PodState::NotReady,
            row.fresh_not_ready_blocks_informer,
            "{mode}: informer listing with a fresh not-ready"
        );
        // Whatever the mode, once the word is stale the informer decides.
        pod.apply(Event::InformerListed, gates, windows(), at(61));
        assert_eq!(pod.state(), PodState::Ready, "{mode}: after staleness");
    }
}

// === Vocabulary ===

#[test]
fn reason_labels_are_distinct_kebab_case_metric_labels() {
    let reasons = [
        Reason::QueueProxyReady,
        Reason::QueueProxyNotReady,
        Reason::QueueProxyDraining,
        Reason::QueueProxyStartup,
        Reason::InformerAdded,
        Reason::InformerPending,
        Reason::InformerPromoted,
        Reason::InformerRemoved,
        Reason::HealthCheckFailed,
        Reason::QuarantineExpired,
        Reason::Recovered,
        Reason::IpReused,
        Reason::Stale,
    ];
    let mut labels: Vec<&str> = reasons.iter().map(|reason| reason.label()).collect();
    assert!(labels
        .iter()
        .all(|label| label.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')));
    labels.sort_unstable();
    labels.dedup();
    assert_eq!(labels.len(), reasons.len());
}

#[test]
fn queue_proxy_wire_names_round_trip() {
    for event in [
        QueueProxyEvent::Startup,
        QueueProxyEvent::Ready,
        QueueProxyEvent::NotReady,
        QueueProxyEvent::Draining,
    ] {
        assert_eq!(
            QueueProxyEvent::from_wire_name(event.wire_name()),
            Some(event)
        );
    }
    assert_eq!(QueueProxyEvent::from_wire_name("Ready"), None);
    assert_eq!(QueueProxyEvent::from_wire_name("terminated"), None);
}
