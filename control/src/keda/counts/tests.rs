//! The fleet's sums on a clock we pass in, against what the add-on's scaler would report.

use super::*;

fn route() -> RouteId {
    ("apps".into(), "app".into())
}

fn replicas(counts: &[(&str, i64, u64)]) -> BTreeMap<String, BTreeMap<RouteId, ReplicaCount>> {
    counts
        .iter()
        .map(|(replica, concurrency, requests)| {
            let count = ReplicaCount {
                concurrency: *concurrency,
                requests: *requests,
            };
            (replica.to_string(), BTreeMap::from([(route(), count)]))
        })
        .collect()
}

fn windows() -> BTreeMap<RouteId, Option<RateWindow>> {
    BTreeMap::from([(route(), None)])
}

fn at(seconds: u64) -> Duration {
    Duration::from_secs(1_800_000_000 + seconds)
}

#[test]
fn concurrency_is_summed_over_replicas_and_a_first_count_adds_no_rate() {
    let mut tally = FleetTally::default();
    let counts = tally.observe(at(0), &replicas(&[("a", 3, 100), ("b", 2, 50)]), &windows());
    assert_eq!(counts[&route()].concurrency, 5);
    assert_eq!(
        counts[&route()].rate,
        0.0,
        "the first look sees no increase"
    );
}

#[test]
fn increases_go_into_the_buckets_and_a_restart_counts_its_whole_count() {
    let mut tally = FleetTally::default();
    tally.observe(at(0), &replicas(&[("a", 0, 100), ("b", 0, 50)]), &windows());
    // One second later: a served 10 more, b 20 more: 30 in the second bucket.
    let counts = tally.observe(at(1), &replicas(&[("a", 0, 110), ("b", 0, 70)]), &windows());
    // Two buckets used (0 and 30): the add-on's per-bucket average.
    assert_eq!(counts[&route()].rate, 15.0);
    // b restarted and has served 4 since: 4 new, not a fall of 66.
    let counts = tally.observe(at(2), &replicas(&[("a", 0, 110), ("b", 0, 4)]), &windows());
    assert_eq!(
        counts[&route()].rate,
        11.333,
        "34 over three buckets, to three digits"
    );
}

#[test]
fn a_replica_that_does_not_answer_keeps_its_last_count_for_when_it_does() {
    let mut tally = FleetTally::default();
    tally.observe(at(0), &replicas(&[("a", 1, 100), ("b", 1, 50)]), &windows());
    let counts = tally.observe(at(1), &replicas(&[("a", 1, 100)]), &windows());
    assert_eq!(
        counts[&route()].concurrency,
        1,
        "b is not counted while it is silent"
    );
    let counts = tally.observe(at(2), &replicas(&[("a", 1, 100), ("b", 1, 56)]), &windows());
    assert_eq!(counts[&route()].concurrency, 2);
    assert_eq!(counts[&route()].rate, 2.0, "6 over three buckets");
}

#[test]
fn a_route_no_replica_mentions_counts_zero_and_a_gone_route_is_forgotten() {
    let mut tally = FleetTally::default();
    let other: RouteId = ("apps".into(), "other".into());
    let mut both = windows();
    both.insert(other.clone(), None);
    let counts = tally.observe(at(0), &replicas(&[("a", 2, 1)]), &both);
    assert_eq!(counts[&other], RouteCount::default());
    let counts = tally.observe(at(1), &replicas(&[("a", 2, 1)]), &windows());
    assert!(!counts.contains_key(&other));
    assert!(!tally.buckets.contains_key(&other));
}

/// A route created while requests already arrive: the requests a replica counted for it before
/// the tally first saw it are new ones (its count began at zero with the route), or a route
/// that a placeholder answers, whose requests are over at once, would never show a rate.
#[test]
fn a_new_routes_first_requests_count_on_a_replica_already_heard_from() {
    let mut tally = FleetTally::default();
    let new: RouteId = ("apps".into(), "new".into());
    let mut both = windows();
    both.insert(new.clone(), None);
    tally.observe(at(0), &replicas(&[("a", 0, 100)]), &both);
    let mut counts = replicas(&[("a", 0, 100)]);
    counts.get_mut("a").unwrap().insert(
        new.clone(),
        ReplicaCount {
            concurrency: 0,
            requests: 2,
        },
    );
    let observed = tally.observe(at(1), &counts, &both);
    assert_eq!(observed[&new].rate, 1.0, "2 over two buckets");
    assert_eq!(observed[&route()].rate, 0.0);
}

#[test]
fn the_queue_json_is_the_add_ons_and_reads_back() {
    let counts = BTreeMap::from([(
        route(),
        ReplicaCount {
            concurrency: 2,
            requests: 7,
        },
    )]);
    let json = queue_json(&counts);
    assert_eq!(json, r#"{"apps/app":{"Concurrency":2,"RequestCount":7}}"#);
    assert_eq!(parse_queue(json.as_bytes()).unwrap(), counts);
    assert!(parse_queue(b"[1]").is_err());
    assert!(
        parse_queue(br#"{"no-slash":{"Concurrency":1,"RequestCount":1}}"#)
            .unwrap()
            .is_empty()
    );
}

/// A replica's counts of routes not routed (yet, or any more) are passed over: they are not
/// in the answer, and a route that becomes routed later counts, from a replica already heard
/// from, every request it had as new, as a route new to that replica does.
#[test]
fn counts_of_routes_not_routed_are_passed_over_until_they_are() {
    let other: RouteId = ("apps".into(), "other".into());
    let mut tally = FleetTally::default();
    let answer = |app: u64, other_requests: u64| {
        BTreeMap::from([(
            "a".to_string(),
            BTreeMap::from([
                (
                    route(),
                    ReplicaCount {
                        concurrency: 1,
                        requests: app,
                    },
                ),
                (
                    other.clone(),
                    ReplicaCount {
                        concurrency: 4,
                        requests: other_requests,
                    },
                ),
            ]),
        )])
    };
    let counts = tally.observe(at(0), &answer(10, 30), &windows());
    assert_eq!(counts.keys().collect::<Vec<_>>(), [&route()]);
    assert_eq!(counts[&route()].concurrency, 1);
    let both = BTreeMap::from([(route(), None), (other.clone(), None)]);
    let counts = tally.observe(at(1), &answer(10, 30), &both);
    assert_eq!(counts[&other].concurrency, 4);
    assert_eq!(counts[&other].rate, 30.0, "all of its 30 are new");
    assert_eq!(counts[&route()].rate, 0.0);
}

/// [`among`] keeps, in order, exactly the routes both maps have, whichever holds more.
#[test]
fn among_walks_both_maps_once_keeping_the_routes_they_share() {
    let id = |name: &str| -> RouteId { ("ns".into(), name.into()) };
    let counts: BTreeMap<RouteId, u8> = ["a", "c", "d", "f", "z"]
        .iter()
        .map(|name| (id(name), 0))
        .collect();
    let windows: BTreeMap<RouteId, ()> = ["b", "c", "f", "g", "y", "z"]
        .iter()
        .map(|name| (id(name), ()))
        .collect();
    let kept: Vec<&RouteId> = among(&counts, &windows).map(|(route, _)| route).collect();
    assert_eq!(kept, [&id("c"), &id("f"), &id("z")]);
    assert_eq!(among(&counts, &BTreeMap::<RouteId, ()>::new()).count(), 0);
    assert_eq!(among(&BTreeMap::<RouteId, u8>::new(), &windows).count(), 0);
}
