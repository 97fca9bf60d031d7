use super::*;
use crate::pod_state::QueueProxyEvent;
use proptest::prelude::*;
use std::time::Duration;

fn at(seconds: u64) -> Timestamp {
    Timestamp::from_epoch_offset(Duration::from_secs(seconds))
}

fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

fn key(name: &str) -> RevisionKey {
    RevisionKey::new("ns", name).unwrap()
}

fn spec(name: &str, cc: u32) -> RevisionSpec {
    let key = key(name);
    RevisionSpec {
        labels: RevisionLabels {
            namespace: key.namespace().to_string(),
            revision: key.name().to_string(),
            ..RevisionLabels::default()
        },
        key,
        container_concurrency: cc,
        protocol: Protocol::Http1,
        timeouts: Timeouts::default(),
        lb_policy: LbPolicy::default_for(cc),
        queue_depth: 100,
        priority: None,
        serving_port: DEFAULT_SERVING_PORT,
        cluster_ip: None,
        tls: None,
        rules: None,
        cold_start: Default::default(),
    }
}

/// What the standalone file sends: the gates, then each revision and its listed pods.
fn declare(revisions: &[(&str, u32, &[&str])], gates: Gates) -> Op {
    let mut ops = vec![Op::SetGates(gates)];
    for (name, cc, pods) in revisions {
        ops.push(Op::UpsertRevision(spec(name, *cc)));
        ops.push(Op::SetEndpoints {
            revision: key(name),
            ready: pods.iter().map(|pod| addr(pod)).collect(),
            scope: OmissionScope::ListedPods,
        });
    }
    Op::Batch(ops)
}

fn qp(name: &str, ip: &str, event: QueueProxyEvent) -> Op {
    Op::MutatePod {
        revision: key(name),
        target: PodTarget::Ip(ip.parse().unwrap()),
        event: Event::QueueProxy(event),
        source: Source::QueueProxy,
    }
}

fn health(name: &str, pod: &str, event: Event) -> Op {
    Op::MutatePod {
        revision: key(name),
        target: PodTarget::Addr(addr(pod)),
        event,
        source: Source::Prober,
    }
}

fn fresh_state() -> Shelled {
    Shelled::new(ControlState::new(
        2,
        Gates::HYBRID,
        Limits::default(),
        Arc::new(ProcessQueue::new(u32::MAX)),
    ))
}

/// The state as the shell drives it: after each op (or expiry) the capacities are set on
/// the trackers, before a test looks at any route, and the other effects are kept until the
/// test takes them.
struct Shelled {
    state: ControlState,
    kept: Effects,
}

impl Shelled {
    fn new(state: ControlState) -> Shelled {
        Shelled {
            state,
            kept: Effects::default(),
        }
    }

    fn apply(&mut self, op: Op, now: Timestamp) -> Result<(), OpError> {
        let result = self.state.apply(op, now);
        self.carry_out();
        result
    }

    fn expire_quarantines(&mut self, now: Timestamp) {
        self.state.expire_quarantines(now);
        self.carry_out();
    }

    fn carry_out(&mut self) {
        let effects = self.state.take_effects();
        crate::shell::set_capacities(effects.capacities);
        self.kept.updates.extend(effects.updates);
        self.kept.probe_updates.extend(effects.probe_updates);
        self.kept.journal.extend(effects.journal);
    }

    fn take_updates(&mut self) -> Vec<RoutingUpdate> {
        std::mem::take(&mut self.kept.updates)
    }

    fn take_journal(&mut self) -> Vec<Journal> {
        std::mem::take(&mut self.kept.journal)
    }

    fn take_probe_updates(&mut self) -> Vec<ProbeUpdate> {
        std::mem::take(&mut self.kept.probe_updates)
    }
}

impl std::ops::Deref for Shelled {
    type Target = ControlState;

    fn deref(&self) -> &ControlState {
        &self.state
    }
}

/// The route of the last update, which must be an upsert.
fn last_upsert(updates: &[RoutingUpdate]) -> &Arc<RevisionRoute> {
    match updates.last() {
        Some(RoutingUpdate::Upsert { route, .. }) => route,
        other => panic!("expected an upsert last, got {other:?}"),
    }
}

/// The pods and capacities of the last route published for `name`.
fn last_route(updates: &[RoutingUpdate], name: &str) -> Option<Vec<(SocketAddr, u32)>> {
    updates.iter().rev().find_map(|update| match update {
        RoutingUpdate::Upsert { route, .. } if route.labels.revision == name => Some(
            route
                .pods
                .iter()
                .map(|pod| (pod.addr, pod.slots.capacity()))
                .collect(),
        ),
        _ => None,
    })
}

/// The core decides capacities; only the shell writes them. Applying an op leaves every
/// tracker as it was, and the effects say what to set: each routed pod's share, and 0 for
/// a pod that left, in the same take as the update that drops it.
#[test]
fn capacities_are_effects_the_state_never_writes_itself() {
    let mut state = fresh_state().state;
    let pods = ["10.0.0.1:8012", "10.0.0.2:8012"];
    state
        .apply(declare(&[("a", 2, &pods)], Gates::HYBRID), at(0))
        .unwrap();
    let effects = state.take_effects();
    let route = last_upsert(&effects.updates).clone();
    assert!(
        route.pods.iter().all(|pod| pod.slots.capacity() == 0),
        "the state set no capacity itself"
    );
    let decided: Vec<(SocketAddr, u32)> = effects
        .capacities
        .iter()
        .map(|change| (change.tracker.addr, change.slots))
        .collect();
    assert_eq!(decided, vec![(addr(pods[0]), 2), (addr(pods[1]), 2)]);
    for change in &effects.capacities {
        assert!(route
            .pods
            .iter()
            .any(|pod| Arc::ptr_eq(pod, &change.tracker)));
        change.tracker.slots.set_capacity(change.slots);
    }
    // The same view again: nothing to set, nothing to publish.
    state
        .apply(declare(&[("a", 2, &pods)], Gates::HYBRID), at(1))
        .unwrap();
    let effects = state.take_effects();
    assert!(effects.capacities.is_empty() && effects.updates.is_empty());
    // The second pod leaves: its capacity goes to 0 with the update that drops it, and
    // only the shell's carrying it out makes it so.
    let leaving = route.pods[1].clone();
    state
        .apply(declare(&[("a", 2, &pods[..1])], Gates::HYBRID), at(2))
        .unwrap();
    let effects = state.take_effects();
    assert_eq!(last_route_of(&effects.updates), vec![addr(pods[0])]);
    assert_eq!(leaving.slots.capacity(), 2, "untouched until carried out");
    assert!(effects
        .capacities
        .iter()
        .any(|change| Arc::ptr_eq(&change.tracker, &leaving) && change.slots == 0));
    assert_eq!(
        effects.capacities.len(),
        1,
        "the pod that stays keeps its share"
    );
}

fn last_route_of(updates: &[RoutingUpdate]) -> Vec<SocketAddr> {
    last_upsert(updates)
        .pods
        .iter()
        .map(|pod| pod.addr)
        .collect()
}

/// A restart after a panic re-sends every decision, in case the panicking op's effects
/// were lost with it.
#[test]
fn republishing_everything_sends_every_capacity_and_the_queue_limit_again() {
    let mut state = fresh_state().state;
    let pods = ["10.0.0.1:8012", "10.0.0.2:8012"];
    state
        .apply(
            Op::Batch(vec![
                declare(&[("a", 2, &pods)], Gates::HYBRID),
                Op::SetMaxQueuedRequests(7),
            ]),
            at(0),
        )
        .unwrap();
    state.take_effects();
    state.republish_everything();
    let effects = state.take_effects();
    let decided: Vec<(SocketAddr, u32)> = effects
        .capacities
        .iter()
        .map(|change| (change.tracker.addr, change.slots))
        .collect();
    assert_eq!(decided, vec![(addr(pods[0]), 2), (addr(pods[1]), 2)]);
    assert_eq!(effects.max_queued_requests, Some(7));
    assert_eq!(
        last_route_of(&effects.updates),
        vec![addr(pods[0]), addr(pods[1])]
    );
}

/// The capacities an op decided, as (pod, slots) in order.
fn decided(effects: &Effects) -> Vec<(SocketAddr, u32)> {
    effects
        .capacities
        .iter()
        .map(|change| (change.tracker.addr, change.slots))
        .collect()
}

/// A pod that becomes ready gets its share as an effect of the op that made it ready, and
/// loses it as one when it stops being ready; nothing while it stays out of the route.
#[test]
fn a_pod_becoming_ready_or_not_is_a_capacity_effect() {
    let mut state = fresh_state().state;
    let pod = "10.0.0.7:8012";
    state
        .apply(declare(&[("a", 3, &[])], Gates::HYBRID), at(0))
        .unwrap();
    state.take_effects();
    state
        .apply(qp("a", "10.0.0.7", QueueProxyEvent::Startup), at(1))
        .unwrap();
    assert_eq!(decided(&state.take_effects()), [], "not ready: no capacity");
    state
        .apply(qp("a", "10.0.0.7", QueueProxyEvent::Ready), at(2))
        .unwrap();
    assert_eq!(decided(&state.take_effects()), [(addr(pod), 3)]);
    state
        .apply(qp("a", "10.0.0.7", QueueProxyEvent::NotReady), at(3))
        .unwrap();
    assert_eq!(decided(&state.take_effects()), [(addr(pod), 0)]);
}

/// Quarantine on simulated time: a failed check takes the pod's capacity at once; the
/// quarantine's end (probation) gives none back; only a passing probe does.
#[test]
fn quarantine_and_recovery_are_capacity_effects_on_simulated_time() {
    let mut state = fresh_state().state;
    let pod = "10.0.0.1:8012";
    state
        .apply(declare(&[("a", 2, &[pod])], Gates::HYBRID), at(0))
        .unwrap();
    assert_eq!(decided(&state.take_effects()), [(addr(pod), 2)]);
    state
        .apply(health("a", pod, Event::HealthCheckFailed), at(10))
        .unwrap();
    assert_eq!(decided(&state.take_effects()), [(addr(pod), 0)]);
    let end = state.next_deadline().expect("quarantined");
    state.expire_quarantines(end);
    let effects = state.take_effects();
    assert!(
        effects.capacities.is_empty(),
        "recovering is not routable: {:?}",
        decided(&effects)
    );
    state
        .apply(health("a", pod, Event::HealthCheckPassed), at(20))
        .unwrap();
    assert_eq!(decided(&state.take_effects()), [(addr(pod), 2)]);
}

/// A new containerConcurrency, or a second activator sharing the pods, moves every
/// routed pod's share: one effect per pod whose share moved.
#[test]
fn container_concurrency_and_activator_changes_move_each_share() {
    let mut state = fresh_state().state;
    let pods = ["10.0.0.1:8012", "10.0.0.2:8012"];
    state
        .apply(declare(&[("a", 2, &pods)], Gates::HYBRID), at(0))
        .unwrap();
    state.take_effects();
    state
        .apply(declare(&[("a", 10, &pods)], Gates::HYBRID), at(1))
        .unwrap();
    assert_eq!(
        decided(&state.take_effects()),
        [(addr(pods[0]), 10), (addr(pods[1]), 10)]
    );
    // A second activator: with as many pods as activators each owns one pod whole, so one
    // pod leaves this activator's route (0) and the other keeps its 10: one effect.
    let me: IpAddr = "10.1.0.1".parse().unwrap();
    let other: IpAddr = "10.1.0.2".parse().unwrap();
    state
        .apply(
            Op::SetActivators(Activators {
                all: vec![me, other],
                me: Some(me),
            }),
            at(2),
        )
        .unwrap();
    let shares = decided(&state.take_effects());
    assert!(
        matches!(shares.as_slice(), [(pod, 0)] if pods.iter().any(|p| addr(p) == *pod)),
        "{shares:?}"
    );
}

/// A revision removed takes every tracker's capacity, its pods' and cluster-IP mode's
/// Service's, in the take that removes its route.
#[test]
fn removing_a_revision_zeroes_every_tracker_it_had() {
    let mut state = fresh_state().state;
    let pods = ["10.0.0.1:8012", "10.0.0.2:8012"];
    state
        .apply(declare(&[("a", 2, &pods)], Gates::HYBRID), at(0))
        .unwrap();
    let service: SocketAddr = "10.96.0.9:80".parse().unwrap();
    state
        .apply(
            Op::UpsertRevision(RevisionSpec {
                cluster_ip: Some(service),
                ..spec("b", 2)
            }),
            at(0),
        )
        .unwrap();
    state
        .apply(
            Op::SetEndpoints {
                revision: key("b"),
                ready: vec![addr("10.0.1.1:8012")],
                scope: OmissionScope::ListedPods,
            },
            at(0),
        )
        .unwrap();
    let effects = state.take_effects();
    assert!(
        decided(&effects).contains(&(service, 2)),
        "{:?}",
        decided(&effects)
    );
    for (name, zeroed) in [
        ("a", vec![addr(pods[0]), addr(pods[1])]),
        ("b", vec![service]),
    ] {
        state
            .apply(
                Op::RemoveRevision {
                    revision: key(name),
                },
                at(1),
            )
            .unwrap();
        let effects = state.take_effects();
        assert!(matches!(
            effects.updates.as_slice(),
            [RoutingUpdate::Remove { .. }]
        ));
        let expected: Vec<(SocketAddr, u32)> = zeroed.into_iter().map(|addr| (addr, 0)).collect();
        assert_eq!(decided(&effects), expected, "{name}");
    }
}

/// With a memory limit, a queue cap asked above what it holds is lowered to it, and the
/// journal names both figures for the shell's warning; at or below it, it is kept as is.
#[test]
fn a_queue_cap_above_the_memory_ceiling_is_lowered_to_it_naming_both() {
    let queue = Arc::new(ProcessQueue::new(100));
    let limits = Limits {
        queue_ceiling: Some(5_000),
        ..Limits::default()
    };
    let mut state = ControlState::new(2, Gates::HYBRID, limits, queue);
    state
        .apply(Op::SetMaxQueuedRequests(u32::MAX), at(0))
        .unwrap();
    let effects = state.take_effects();
    assert_eq!(effects.max_queued_requests, Some(5_000));
    assert_eq!(
        effects.journal,
        [Journal::QueueCapLowered {
            asked: u32::MAX,
            ceiling: 5_000
        }]
    );
    for (asked, limit) in [(5_000, None), (1, Some(1)), (5_001, Some(5_000))] {
        state.apply(Op::SetMaxQueuedRequests(asked), at(1)).unwrap();
        let effects = state.take_effects();
        assert_eq!(effects.max_queued_requests, limit, "{asked}");
        assert_eq!(
            effects.journal.is_empty(),
            asked <= 5_000,
            "{asked}: {:?}",
            effects.journal
        );
    }
}

/// `activator.max-queued-requests` has one writer: the op decides, the shell sets it.
#[test]
fn the_queue_limit_is_an_effect_of_its_op_when_it_changes() {
    let queue = Arc::new(ProcessQueue::new(100));
    let mut state = ControlState::new(2, Gates::HYBRID, Limits::default(), queue.clone());
    state.apply(Op::SetMaxQueuedRequests(100), at(0)).unwrap();
    assert_eq!(state.take_effects().max_queued_requests, None, "unchanged");
    state.apply(Op::SetMaxQueuedRequests(5), at(1)).unwrap();
    assert_eq!(state.take_effects().max_queued_requests, Some(5));
    assert_eq!(queue.limit(), 100, "the state does not set it itself");
    state.apply(Op::SetMaxQueuedRequests(5), at(2)).unwrap();
    assert_eq!(state.take_effects().max_queued_requests, None);
}

#[test]
fn listed_pods_route_at_once_with_their_whole_concurrency() {
    let mut state = fresh_state();
    state
        .apply(
            declare(
                &[("a", 2, &["10.0.0.1:8012", "10.0.0.2:8012"])],
                Gates::HYBRID,
            ),
            at(0),
        )
        .unwrap();
    let updates = state.take_updates();
    assert_eq!(
        last_route(&updates, "a").unwrap(),
        vec![(addr("10.0.0.1:8012"), 2), (addr("10.0.0.2:8012"), 2)]
    );
    // The same view again publishes nothing.
    state
        .apply(
            declare(
                &[("a", 2, &["10.0.0.1:8012", "10.0.0.2:8012"])],
                Gates::HYBRID,
            ),
            at(1),
        )
        .unwrap();
    assert!(state.take_updates().is_empty());
}

#[test]
fn a_queue_proxy_ready_makes_a_bare_ip_routable_on_the_serving_port() {
    let mut state = fresh_state();
    state
        .apply(declare(&[("a", 1, &[])], Gates::HYBRID), at(0))
        .unwrap();
    assert_eq!(last_route(&state.take_updates(), "a").unwrap(), vec![]);
    state
        .apply(qp("a", "10.0.0.7", QueueProxyEvent::Startup), at(1))
        .unwrap();
    assert!(state.take_updates().is_empty(), "startup is not ready");
    state
        .apply(qp("a", "10.0.0.7", QueueProxyEvent::Ready), at(2))
        .unwrap();
    assert_eq!(
        last_route(&state.take_updates(), "a").unwrap(),
        vec![(addr("10.0.0.7:8012"), 1)]
    );
    // A file reload that does not list it leaves it alone: the file never listed it.
    state
        .apply(declare(&[("a", 1, &[])], Gates::HYBRID), at(100))
        .unwrap();
    assert_eq!(
        state.pod_state(&key("a"), addr("10.0.0.7:8012")),
        Some(PodState::Ready)
    );
}

#[test]
fn pods_announced_before_their_revision_is_declared_route_once_it_is() {
    let mut state = fresh_state();
    state
        .apply(qp("late", "10.0.0.9", QueueProxyEvent::Ready), at(0))
        .unwrap();
    assert!(
        state.take_updates().is_empty(),
        "nothing to route without a spec"
    );
    state
        .apply(declare(&[("late", 3, &[])], Gates::HYBRID), at(1))
        .unwrap();
    assert_eq!(
        last_route(&state.take_updates(), "late").unwrap(),
        vec![(addr("10.0.0.9:8012"), 3)]
    );
}

#[test]
fn not_ready_leaves_routing_but_keeps_the_tracker_and_its_in_flight_count() {
    let mut state = fresh_state();
    state
        .apply(declare(&[("a", 1, &[])], Gates::HYBRID), at(0))
        .unwrap();
    state
        .apply(qp("a", "10.0.0.7", QueueProxyEvent::Ready), at(0))
        .unwrap();
    let updates = state.take_updates();
    let route = last_upsert(&updates);
    let tracker = route.pods[0].clone();
    assert!(tracker.slots.try_acquire(), "a request in flight");
    state
        .apply(qp("a", "10.0.0.7", QueueProxyEvent::NotReady), at(1))
        .unwrap();
    assert_eq!(last_route(&state.take_updates(), "a").unwrap(), vec![]);
    assert_eq!(
        tracker.slots.capacity(),
        0,
        "no shard may start another request there"
    );
    state
        .apply(qp("a", "10.0.0.7", QueueProxyEvent::Ready), at(2))
        .unwrap();
    let updates = state.take_updates();
    let route = last_upsert(&updates);
    assert!(
        Arc::ptr_eq(&route.pods[0], &tracker),
        "the same tracker comes back"
    );
    assert!(!tracker.slots.try_acquire(), "still one in flight at CC 1");
}

#[test]
fn quarantine_takes_a_pod_out_until_it_ends_then_probation_then_ready() {
    let mut state = fresh_state();
    let pod = "10.0.0.1:8012";
    state
        .apply(declare(&[("a", 1, &[pod])], Gates::HYBRID), at(0))
        .unwrap();
    state.take_updates();
    state
        .apply(health("a", pod, Event::HealthCheckFailed), at(10))
        .unwrap();
    assert_eq!(last_route(&state.take_updates(), "a").unwrap(), vec![]);
    assert_eq!(
        state.next_deadline(),
        Some(at(11)),
        "first quarantine lasts 1 s"
    );
    state.expire_quarantines(at(10));
    assert_eq!(
        state.pod_state(&key("a"), addr(pod)),
        Some(PodState::Quarantined)
    );
    state.expire_quarantines(at(11));
    assert_eq!(
        state.pod_state(&key("a"), addr(pod)),
        Some(PodState::Recovering)
    );
    assert!(
        last_route(&state.take_updates(), "a").is_none_or(|route| route.is_empty()),
        "probation does not route"
    );
    // The prober is told at once, with the pod on probation.
    let probes = state.take_probe_updates();
    let last = probes.last().expect("a probe set after the expiry");
    assert_eq!(last.pods.len(), 1);
    assert!(last.pods[0].recovering);
    state
        .apply(health("a", pod, Event::HealthCheckPassed), at(12))
        .unwrap();
    assert_eq!(state.pod_state(&key("a"), addr(pod)), Some(PodState::Ready));
    assert_eq!(
        last_route(&state.take_updates(), "a").unwrap().len(),
        1,
        "a passing probe routes it again"
    );
    assert_eq!(state.next_deadline(), None);
}

#[test]
fn a_probe_set_carries_its_revisions_protocol_and_is_sent_again_when_it_changes() {
    let mut state = fresh_state();
    let pod = "10.0.0.1:8012";
    state
        .apply(declare(&[("a", 1, &[pod])], Gates::HYBRID), at(0))
        .unwrap();
    let sent = state.take_probe_updates();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].protocol, Protocol::Http1);
    // The revision is h2c now, same pods: the prober must probe them over h2c.
    let h2c = RevisionSpec {
        protocol: Protocol::H2c,
        ..spec("a", 1)
    };
    state.apply(Op::UpsertRevision(h2c.clone()), at(1)).unwrap();
    let sent = state.take_probe_updates();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].protocol, Protocol::H2c);
    let pods: Vec<SocketAddr> = sent[0].pods.iter().map(|pod| pod.addr).collect();
    assert_eq!(pods, [addr(pod)]);
    // Unchanged: nothing sent.
    state.apply(Op::UpsertRevision(h2c), at(2)).unwrap();
    assert!(state.take_probe_updates().is_empty());
    // Gone: an empty set.
    state
        .apply(Op::RemoveRevision { revision: key("a") }, at(3))
        .unwrap();
    let sent = state.take_probe_updates();
    assert_eq!(sent.len(), 1);
    assert!(sent[0].pods.is_empty());
}

/// A revision's TLS to its pods, made once: standalone `[revisions.tls]`'s (dialled at the
/// listed address), and the same dialled on Knative's ports (`system-internal-tls`: TLS on
/// 8112, the listed 8012 plain).
fn pod_tls(knative_ports: bool) -> Box<crate::tls::PodTls> {
    static BUILT: std::sync::OnceLock<(crate::tls::PodTls, crate::tls::PodTls)> =
        std::sync::OnceLock::new();
    let (standalone, knative) = BUILT.get_or_init(|| {
        let ca = crate::tls::tests::ca("pods").cert.pem();
        let tls = crate::tls::PodTls::new("ca.pem", ca.as_bytes(), "data-plane.knative.dev", None)
            .unwrap();
        (tls.clone(), tls.with_ports(crate::tls::KNATIVE_TLS_PORTS))
    });
    Box::new(if knative_ports { knative } else { standalone }.clone())
}

#[test]
fn a_probe_set_carries_the_revisions_tls_only_where_its_listed_address_is_dialled_over_tls() {
    let mut state = fresh_state();
    let pod = "10.0.0.1:8012";
    state
        .apply(declare(&[("a", 1, &[pod])], Gates::HYBRID), at(0))
        .unwrap();
    assert_eq!(state.take_probe_updates()[0].tls, None);
    // Standalone `[revisions.tls]`: nothing at the listed address speaks plain, so the pods
    // are probed over the revision's TLS, the route's own client (the same `Arc`, not a copy).
    let standalone = RevisionSpec {
        tls: Some(pod_tls(false)),
        ..spec("a", 1)
    };
    state
        .apply(Op::UpsertRevision(standalone.clone()), at(1))
        .unwrap();
    let sent = state.take_probe_updates();
    assert_eq!(sent.len(), 1);
    let probed = sent[0].tls.as_deref().expect("probed over TLS");
    assert_eq!(Some(probed), standalone.tls.as_deref());
    assert!(Arc::ptr_eq(
        &probed.upstream(false),
        &standalone.tls.as_ref().unwrap().upstream(false)
    ));
    let pods: Vec<SocketAddr> = sent[0].pods.iter().map(|pod| pod.addr).collect();
    assert_eq!(pods, [addr(pod)]);
    // The same again (the file read again): nothing sent.
    state.apply(Op::UpsertRevision(standalone), at(2)).unwrap();
    assert!(state.take_probe_updates().is_empty());
    // Knative's `system-internal-tls`: TLS on 8112, the listed port plain, where upstream's
    // activator probes it plain: so does the prober.
    let knative = RevisionSpec {
        tls: Some(pod_tls(true)),
        ..spec("a", 1)
    };
    state.apply(Op::UpsertRevision(knative), at(3)).unwrap();
    let sent = state.take_probe_updates();
    assert_eq!(sent.len(), 1);
    assert_eq!((sent[0].tls.as_ref(), sent[0].pods.len()), (None, 1));
}

#[test]
fn turning_quarantine_off_releases_quarantined_pods_and_stops_probing() {
    let mut state = fresh_state();
    let pod = "10.0.0.1:8012";
    state
        .apply(declare(&[("a", 1, &[pod])], Gates::HYBRID), at(0))
        .unwrap();
    state
        .apply(health("a", pod, Event::HealthCheckFailed), at(1))
        .unwrap();
    assert_eq!(last_route(&state.take_updates(), "a").unwrap(), vec![]);
    // Same file, quarantine off: nothing would ever end the quarantine, so the informer's
    // listing releases the pod (pod_state's table) and the timer is dropped.
    state
        .apply(declare(&[("a", 1, &[pod])], Gates::QUEUE_PROXY_ONLY), at(3))
        .unwrap();
    assert_eq!(state.pod_state(&key("a"), addr(pod)), Some(PodState::Ready));
    assert_eq!(last_route(&state.take_updates(), "a").unwrap().len(), 1);
    assert!(state.recount_probe_sets().is_empty());
    let last = state
        .take_probe_updates()
        .pop()
        .expect("the prober is told");
    assert!(last.pods.is_empty());
    assert_eq!(state.next_deadline(), None);
}

#[test]
fn ip_reuse_removes_the_tracker_at_once_and_removal_is_idempotent() {
    let mut state = fresh_state();
    let pod = "10.0.0.1:8012";
    state
        .apply(
            declare(&[("a", 4, &[pod, "10.0.0.2:8012"])], Gates::HYBRID),
            at(0),
        )
        .unwrap();
    let updates = state.take_updates();
    let route = last_upsert(&updates);
    let reused = route.pods[0].clone();
    let remove = Op::RemovePod {
        revision: key("a"),
        addr: addr(pod),
        reason: Reason::IpReused,
        source: Source::Proxy,
    };
    state.apply(remove.clone(), at(1)).unwrap();
    assert_eq!(reused.slots.capacity(), 0);
    assert_eq!(
        last_route(&state.take_updates(), "a").unwrap(),
        vec![(addr("10.0.0.2:8012"), 4)]
    );
    state.apply(remove, at(2)).unwrap();
    assert!(state.take_updates().is_empty());
    let removals = state
        .take_journal()
        .into_iter()
        .filter(|entry| matches!(entry, Journal::Transition { to: None, .. }))
        .count();
    assert_eq!(removals, 1);
}

#[test]
fn the_tracker_limit_refuses_new_pods_and_says_so() {
    let mut state = Shelled::new(ControlState::new(
        1,
        Gates::HYBRID,
        Limits {
            max_trackers_per_revision: 2,
            ..Limits::default()
        },
        Arc::new(ProcessQueue::new(u32::MAX)),
    ));
    state
        .apply(declare(&[("a", 1, &[])], Gates::HYBRID), at(0))
        .unwrap();
    for ip in ["10.0.0.1", "10.0.0.2"] {
        state
            .apply(qp("a", ip, QueueProxyEvent::Ready), at(0))
            .unwrap();
    }
    let error = state.apply(qp("a", "10.0.0.3", QueueProxyEvent::Ready), at(0));
    assert_eq!(error, Err(OpError::TrackerLimit(key("a"), 2)));
    assert!(state.take_journal().iter().any(
        |entry| matches!(entry, Journal::TrackerLimit { revision } if revision.name() == "a")
    ));
    // A known pod's events still apply at the limit.
    state
        .apply(qp("a", "10.0.0.1", QueueProxyEvent::NotReady), at(1))
        .unwrap();
}

#[test]
fn revisions_nobody_declared_are_bounded() {
    let mut state = fresh_state();
    for i in 0..MAX_UNDECLARED_REVISIONS {
        state
            .apply(
                qp(&format!("ghost-{i}"), "10.0.0.1", QueueProxyEvent::Ready),
                at(0),
            )
            .unwrap();
    }
    let refused = state.apply(qp("one-more", "10.0.0.1", QueueProxyEvent::Ready), at(0));
    assert!(
        matches!(refused, Err(OpError::TooManyUndeclared(..))),
        "{refused:?}"
    );
    // A declared revision is not affected by the bound.
    state
        .apply(declare(&[("real", 1, &[])], Gates::HYBRID), at(0))
        .unwrap();
    state
        .apply(qp("real", "10.0.0.2", QueueProxyEvent::Ready), at(0))
        .unwrap();
}

#[test]
fn idle_not_ready_trackers_are_collected_after_ten_minutes() {
    let mut state = fresh_state();
    state
        .apply(declare(&[("a", 1, &[])], Gates::HYBRID), at(0))
        .unwrap();
    state
        .apply(qp("a", "10.0.0.1", QueueProxyEvent::NotReady), at(0))
        .unwrap();
    state
        .apply(qp("a", "10.0.0.2", QueueProxyEvent::Ready), at(0))
        .unwrap();
    state.apply(Op::CleanupStale, at(600)).unwrap();
    assert!(state.pod_state(&key("a"), addr("10.0.0.1:8012")).is_some());
    state.apply(Op::CleanupStale, at(601)).unwrap();
    assert_eq!(state.pod_state(&key("a"), addr("10.0.0.1:8012")), None);
    assert!(state.pod_state(&key("a"), addr("10.0.0.2:8012")).is_some());
}

#[test]
fn activators_split_the_pods_and_never_multiply_a_shared_pods_concurrency() {
    let pods = ["10.0.0.1:8012", "10.0.0.2:8012", "10.0.0.3:8012"];
    let everyone: Vec<IpAddr> = ["10.1.0.1", "10.1.0.2"]
        .iter()
        .map(|ip| ip.parse().unwrap())
        .collect();
    let mut per_pod: BTreeMap<SocketAddr, u32> = BTreeMap::new();
    for me in &everyone {
        let mut state = fresh_state();
        state
            .apply(
                Op::SetActivators(Activators {
                    me: Some(*me),
                    all: everyone.clone(),
                }),
                at(0),
            )
            .unwrap();
        state
            .apply(declare(&[("a", 10, &pods)], Gates::HYBRID), at(0))
            .unwrap();
        let route = last_route(&state.take_updates(), "a").unwrap();
        assert!(!route.is_empty(), "every activator gets a pod");
        for (pod, capacity) in route {
            *per_pod.entry(pod).or_default() += capacity;
        }
    }
    assert_eq!(per_pod.len(), 3);
    assert!(per_pod.values().all(|&total| total == 10), "{per_pod:?}");
}

#[test]
fn a_removed_revision_leaves_routing_with_its_trackers() {
    let mut state = fresh_state();
    state
        .apply(
            declare(
                &[("a", 1, &["10.0.0.1:8012"]), ("b", 1, &[])],
                Gates::HYBRID,
            ),
            at(0),
        )
        .unwrap();
    let tracker = state
        .take_updates()
        .iter()
        .find_map(|update| match update {
            RoutingUpdate::Upsert { route, .. } if route.key == key("a") => {
                Some(route.pods[0].clone())
            }
            _ => None,
        })
        .unwrap();
    assert!(tracker.slots.try_acquire(), "a request in flight");
    state
        .apply(Op::RemoveRevision { revision: key("a") }, at(1))
        .unwrap();
    let updates = state.take_updates();
    assert!(matches!(&updates[..], [RoutingUpdate::Remove { key, .. }] if key.as_str() == "ns/a"));
    assert_eq!(state.revision_count(), 1);
    assert_eq!(state.pod_state(&key("a"), addr("10.0.0.1:8012")), None);
    assert_eq!(tracker.slots.capacity(), 0, "no new request goes there");
    assert!(tracker.slots.release(), "the one in flight finishes");
    // Again: nothing left to remove.
    state
        .apply(Op::RemoveRevision { revision: key("a") }, at(2))
        .unwrap();
    assert!(state.take_updates().is_empty());
}

#[test]
fn a_batch_publishes_each_revision_it_touched_once() {
    let mut state = fresh_state();
    state
        .apply(
            declare(
                &[("a", 1, &["10.0.0.1:8012", "10.0.0.2:8012"]), ("b", 0, &[])],
                Gates::HYBRID,
            ),
            at(0),
        )
        .unwrap();
    let upserts: Vec<String> = state
        .take_updates()
        .iter()
        .filter_map(|update| match update {
            RoutingUpdate::Upsert { route, .. } => Some(route.key.to_string()),
            RoutingUpdate::Remove { .. } => None,
        })
        .collect();
    assert_eq!(upserts, ["ns/a", "ns/b"]);
    // Declaring the same spec again changes nothing.
    state
        .apply(Op::UpsertRevision(spec("a", 1)), at(1))
        .unwrap();
    assert!(state.take_updates().is_empty());
}

#[test]
fn evidence_applies_only_to_the_tracker_it_is_about() {
    let mut state = fresh_state();
    let pod = "10.0.0.1:8012";
    state
        .apply(declare(&[("a", 1, &[pod])], Gates::HYBRID), at(0))
        .unwrap();
    let old = last_upsert(&state.take_updates()).pods[0].clone();
    // The pod goes and a new one comes at the same address: another tracker.
    state
        .apply(
            Op::RemovePod {
                revision: key("a"),
                addr: addr(pod),
                reason: Reason::IpReused,
                source: Source::Prober,
            },
            at(1),
        )
        .unwrap();
    state
        .apply(
            declare(&[("a", 1, &[pod, "10.0.0.2:8012"])], Gates::HYBRID),
            at(2),
        )
        .unwrap();
    let new = last_upsert(&state.take_updates()).pods[0].clone();
    assert!(!Arc::ptr_eq(&old, &new));
    let evidence = |tracker: &Arc<PodTracker>, kind: EvidenceKind| Op::Evidence {
        revision: key("a"),
        addr: addr(pod),
        tracker: tracker.id,
        kind,
    };
    // Late evidence about the old pod says nothing about the new one.
    state
        .apply(evidence(&old, EvidenceKind::TransportFailure), at(3))
        .unwrap();
    assert_eq!(state.pod_state(&key("a"), addr(pod)), Some(PodState::Ready));
    // About the new one it counts: a transport failure quarantines.
    state
        .apply(evidence(&new, EvidenceKind::TransportFailure), at(4))
        .unwrap();
    assert_eq!(
        state.pod_state(&key("a"), addr(pod)),
        Some(PodState::Quarantined)
    );
}

/// Upstream's cluster-IP rows (`capacity`'s table), through the publish path:
/// one target, the Service, with `max(1, CC × routable pods / activators)` slots.
#[test]
fn cluster_ip_mode_routes_to_the_service_with_the_shared_capacity() {
    let service = addr("10.96.0.5:80");
    let mut state = fresh_state();
    let everyone: Vec<IpAddr> = ["10.1.0.1", "10.1.0.2"]
        .iter()
        .map(|ip| ip.parse().unwrap())
        .collect();
    state
        .apply(
            Op::SetActivators(Activators {
                me: Some(everyone[0]),
                all: everyone,
            }),
            at(0),
        )
        .unwrap();
    let mut cluster_ip = spec("a", 3);
    cluster_ip.cluster_ip = Some(service);
    let endpoints = |pods: &[&str]| Op::SetEndpoints {
        revision: key("a"),
        ready: pods.iter().map(|pod| addr(pod)).collect(),
        scope: OmissionScope::ListedPods,
    };
    state.apply(Op::UpsertRevision(cluster_ip), at(0)).unwrap();
    assert_eq!(
        last_route(&state.take_updates(), "a").unwrap(),
        vec![],
        "no ready pod: closed"
    );
    let five = [
        "10.0.0.1:8012",
        "10.0.0.2:8012",
        "10.0.0.3:8012",
        "10.0.0.4:8012",
        "10.0.0.5:8012",
    ];
    state.apply(endpoints(&five), at(1)).unwrap();
    let updates = state.take_updates();
    assert_eq!(
        last_route(&updates, "a").unwrap(),
        vec![(service, 7)],
        "3 × 5 / 2"
    );
    let virtual_tracker = last_upsert(&updates).pods[0].clone();
    assert!(
        state.recount_probe_sets().is_empty(),
        "pods behind a Service are not probed"
    );
    assert!(state.take_journal().iter().any(|entry| matches!(
        entry,
        Journal::Route {
            pods: 5,
            capacity: Capacity::Limited(7),
            ..
        }
    )));
    state.apply(endpoints(&five[..1]), at(2)).unwrap();
    let updates = state.take_updates();
    assert_eq!(
        last_route(&updates, "a").unwrap(),
        vec![(service, 1)],
        "floor of 1"
    );
    assert!(
        Arc::ptr_eq(&last_upsert(&updates).pods[0], &virtual_tracker),
        "the same target, so its in-flight count carries over"
    );
    // Back to pod mode: the Service takes nothing new, the pod gets its share.
    state
        .apply(Op::UpsertRevision(spec("a", 3)), at(3))
        .unwrap();
    assert_eq!(virtual_tracker.slots.capacity(), 0);
    let route = last_route(&state.take_updates(), "a").unwrap();
    assert_eq!(route.len(), 1);
    assert_ne!(route[0].0, service);
}

#[test]
fn a_pod_replaced_at_its_address_within_one_op_is_published_with_its_new_tracker() {
    let mut state = fresh_state();
    let pod = "10.0.0.1:8012";
    state
        .apply(declare(&[("a", 2, &[pod])], Gates::HYBRID), at(0))
        .unwrap();
    let old = last_upsert(&state.take_updates()).pods[0].clone();
    // Gone and back in one batch: same address, same share, another tracker.
    state
        .apply(
            Op::Batch(vec![
                Op::RemovePod {
                    revision: key("a"),
                    addr: addr(pod),
                    reason: Reason::IpReused,
                    source: Source::Prober,
                },
                Op::SetEndpoints {
                    revision: key("a"),
                    ready: vec![addr(pod)],
                    scope: OmissionScope::ListedPods,
                },
            ]),
            at(1),
        )
        .unwrap();
    let route = last_upsert(&state.take_updates()).clone();
    assert!(
        !Arc::ptr_eq(&route.pods[0], &old),
        "the new pod's tracker is routed"
    );
    assert_eq!(route.pods[0].slots.capacity(), 2);
    assert_eq!(old.slots.capacity(), 0);
}

#[test]
fn cluster_ip_mode_gets_a_fresh_target_when_the_service_moves() {
    let mut state = fresh_state();
    let mut service = spec("a", 0);
    service.cluster_ip = Some(addr("10.96.0.5:80"));
    state
        .apply(
            Op::Batch(vec![
                Op::UpsertRevision(service.clone()),
                Op::SetEndpoints {
                    revision: key("a"),
                    ready: vec![addr("10.0.0.1:8012")],
                    scope: OmissionScope::ListedPods,
                },
            ]),
            at(0),
        )
        .unwrap();
    let first = last_upsert(&state.take_updates()).pods[0].clone();
    assert_eq!(first.slots.capacity(), UNLIMITED, "CC 0 with a ready pod");
    // The Service moves: the old target takes nothing new.
    service.cluster_ip = Some(addr("10.96.0.6:80"));
    state.apply(Op::UpsertRevision(service), at(2)).unwrap();
    let second = last_upsert(&state.take_updates()).pods[0].clone();
    assert_eq!(second.addr, addr("10.96.0.6:80"));
    assert_eq!(first.slots.capacity(), 0);
    assert!(
        second.slots.try_acquire(),
        "the revision has somewhere to go again"
    );
}

#[test]
fn a_revision_with_activators_of_its_own_ignores_the_default_set() {
    let mut state = fresh_state();
    let pods = ["10.0.0.1:8012", "10.0.0.2:8012"];
    state
        .apply(
            declare(&[("a", 4, &pods), ("b", 4, &pods)], Gates::HYBRID),
            at(0),
        )
        .unwrap();
    state.take_updates();
    let me: IpAddr = "10.1.0.1".parse().unwrap();
    let crowd = Activators {
        me: Some(me),
        all: vec![me, "10.1.0.2".parse().unwrap(), "10.1.0.3".parse().unwrap()],
    };
    state
        .apply(
            Op::SetRevisionActivators {
                revision: key("a"),
                activators: Some(crowd.clone()),
            },
            at(1),
        )
        .unwrap();
    let updates = state.take_updates();
    let shared: u32 = last_route(&updates, "a")
        .unwrap()
        .iter()
        .map(|(_, capacity)| capacity)
        .sum();
    assert!(shared < 8, "a's pods are shared three ways: {shared}");
    assert!(
        last_route(&updates, "b").is_none(),
        "b keeps the default (alone)"
    );
    // The default set changing does not touch a.
    state.apply(Op::SetActivators(crowd), at(2)).unwrap();
    let updates = state.take_updates();
    assert!(last_route(&updates, "a").is_none());
    assert!(last_route(&updates, "b").is_some());
}

fn any_op() -> impl Strategy<Value = (Op, u64)> {
    let pod = prop::sample::select(vec!["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
    let name = prop::sample::select(vec!["a", "b"]);
    let qp_event = prop::sample::select(vec![
        QueueProxyEvent::Startup,
        QueueProxyEvent::Ready,
        QueueProxyEvent::NotReady,
        QueueProxyEvent::Draining,
    ]);
    let gates = prop::sample::select(vec![
        Gates::HYBRID,
        Gates::QUEUE_PROXY_ONLY,
        Gates::QUARANTINE_ONLY,
        Gates::MINIMAL,
    ]);
    let op = prop_oneof![
        (name.clone(), pod.clone(), qp_event).prop_map(|(name, ip, event)| qp(name, ip, event)),
        (name.clone(), pod.clone(), 0..4u8).prop_map(|(name, ip, which)| {
            let event = match which {
                0 => Event::HealthCheckFailed,
                1 => Event::HealthCheckPassed,
                2 => Event::RequestSucceeded,
                _ => Event::QuarantineExpired,
            };
            health(name, &format!("{ip}:8012"), event)
        }),
        (name.clone(), pod.clone()).prop_map(|(name, ip)| Op::RemovePod {
            revision: key(name),
            addr: addr(&format!("{ip}:8012")),
            reason: Reason::IpReused,
            source: Source::Proxy,
        }),
        (prop::collection::vec(pod, 0..3), gates, any::<bool>()).prop_map(
            |(pods, gates, with_b)| {
                let listed: Vec<String> = pods.iter().map(|ip| format!("{ip}:8012")).collect();
                let listed: Vec<&str> = listed.iter().map(String::as_str).collect();
                let mut revisions = vec![("a", 2, &listed[..])];
                if with_b {
                    revisions.push(("b", 0, &[][..]));
                }
                declare(&revisions, gates)
            }
        ),
        name.clone().prop_map(|name| Op::RemoveRevision {
            revision: key(name)
        }),
        // The same revision in the other protocol, or over TLS (probed over it or not): its
        // probe set is sent again.
        (name.clone(), any::<bool>(), 0..3u8).prop_map(|(name, h2c, tls)| {
            let protocol = if h2c { Protocol::H2c } else { Protocol::Http1 };
            Op::UpsertRevision(RevisionSpec {
                protocol,
                tls: (tls > 0).then(|| pod_tls(tls == 2)),
                ..spec(name, 2)
            })
        }),
        Just(Op::CleanupStale),
    ];
    (op, 0..700u64)
}

proptest! {
    /// Whatever happens: the published route is exactly the routable pods; trackers outside
    /// it take no new requests; every per-state gauge folded from the journal equals a
    /// recount (never leaks), so the shell may fold instead of recounting.
    #[test]
    fn routes_gauges_and_journal_stay_consistent(ops in prop::collection::vec(any_op(), 1..60)) {
        let mut state = fresh_state();
        let mut now = 0;
        let metrics = crate::shell::PodMetrics::new(&prometheus::Registry::new());
        let mut routes: BTreeMap<String, Vec<(SocketAddr, u32)>> = BTreeMap::new();
        for (op, step) in ops {
            now += step;
            let _ = state.apply(op, at(now));
            state.expire_quarantines(at(now));
            for update in state.take_updates() {
                match update {
                    RoutingUpdate::Upsert { route, .. } => {
                        routes.insert(route.labels.revision.clone(), route.pods.iter().map(|pod| (pod.addr, pod.slots.capacity())).collect());
                    }
                    RoutingUpdate::Remove { key, .. } => {
                        routes.remove(key.name());
                    }
                }
            }
            for entry in state.take_journal() {
                metrics.observe(&entry);
            }
            let counts = state.state_counts();
            for pod_state in PodState::ALL {
                let recount = counts.get(pod_state.label()).copied().unwrap_or(0) as i64;
                prop_assert_eq!(metrics.trackers(pod_state), recount, "{}", pod_state.label());
            }
            prop_assert_eq!(metrics.quarantined(), counts.get("quarantined").copied().unwrap_or(0) as i64);
            for (key, revision) in &state.revisions {
                let Some(spec) = &revision.spec else { continue };
                let expected: Vec<SocketAddr> = revision.pods.iter().filter(|(_, pod)| pod.pod.is_routable()).map(|(addr, _)| *addr).collect();
                let published: Vec<SocketAddr> = routes.get(&spec.labels.revision).map(|route| route.iter().map(|(addr, _)| *addr).collect()).unwrap_or_default();
                prop_assert_eq!(&expected, &published, "revision {}", key);
                for (addr, pod) in &revision.pods {
                    if !expected.contains(addr) {
                        prop_assert_eq!(pod.tracker.slots.capacity(), 0);
                    }
                }
            }
        }
    }

    /// The probe sets the prober is sent, one touched revision at a time, always equal a
    /// recount of every revision: deriving only what an op touched loses nothing.
    #[test]
    fn probe_sets_sent_incrementally_equal_a_recount(ops in prop::collection::vec(any_op(), 1..60)) {
        let mut state = fresh_state();
        let mut now = 0;
        let mut sent: BTreeMap<RevisionKey, crate::state::RecountedProbes> = BTreeMap::new();
        for (op, step) in ops {
            now += step;
            let _ = state.apply(op, at(now));
            state.expire_quarantines(at(now));
            for update in state.take_probe_updates() {
                if update.pods.is_empty() {
                    sent.remove(&update.revision);
                } else {
                    sent.insert(update.revision, (update.protocol, update.tls, update.pods));
                }
            }
            prop_assert_eq!(&sent, &state.recount_probe_sets());
        }
    }
}
