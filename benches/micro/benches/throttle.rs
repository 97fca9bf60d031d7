//! Criterion micro-benchmarks of the throttling core: a pod slot's acquire/release on one
//! thread and contended by two, a load-balancer pick over 8 and 64 pods for each policy, and
//! admission through the cross-shard gate when nobody waits and when a request must queue.
//!
//! Run: `cargo bench -p kactivator-microbench` (results in target/criterion/).

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use kactivator_shards::routing::LbPolicy;
use kactivator_shards::throttle::gate::{Admission, LocalQueue, QueueLimits, RevisionGate};
use kactivator_shards::throttle::lb::Balancer;
use kactivator_shards::throttle::slots::PodSlots;

fn slots(c: &mut Criterion) {
    let mut group = c.benchmark_group("slots");
    let pod = PodSlots::new(8);
    group.bench_function("acquire_release_uncontended", |b| {
        b.iter(|| {
            assert!(black_box(&pod).try_acquire());
            black_box(&pod).release();
        })
    });
    // Another thread hammers the same pod: the cost of sharing its cache line across cores.
    let shared = Arc::new(PodSlots::new(1_000_000));
    let stop = Arc::new(AtomicBool::new(false));
    let noise = {
        let (shared, stop) = (shared.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if shared.try_acquire() {
                    shared.release();
                }
            }
        })
    };
    group.bench_function("acquire_release_contended_by_another_thread", |b| {
        b.iter(|| {
            assert!(black_box(&*shared).try_acquire());
            black_box(&*shared).release();
        })
    });
    stop.store(true, Ordering::Relaxed);
    let _ = noise.join();
    group.finish();
}

fn load_balancing(c: &mut Criterion) {
    let mut group = c.benchmark_group("lb_pick");
    for pods in [8usize, 64] {
        // Half the pods are busy, so policies have something to decide.
        let set: Vec<PodSlots> = (0..pods)
            .map(|i| PodSlots::new(if i % 2 == 0 { 0 } else { 4 }))
            .collect();
        for policy in [
            LbPolicy::RandomChoice2,
            LbPolicy::FirstAvailable,
            LbPolicy::RoundRobin,
            LbPolicy::LeastConnections,
        ] {
            let mut balancer = Balancer::new(policy, 42);
            group.bench_with_input(BenchmarkId::new(policy.as_str(), pods), &set, |b, set| {
                b.iter(|| {
                    let picked = balancer.pick(black_box(set)).expect("a free pod");
                    set[picked].release();
                })
            });
        }
    }
    group.finish();
}

fn admission(c: &mut Criterion) {
    let mut group = c.benchmark_group("gate");
    let limits = QueueLimits {
        revision_depth: 1_000_000,
    };
    // Fast path: nobody waits, a slot is free.
    let gate = RevisionGate::new(2);
    let pod = PodSlots::new(1_000);
    let mut queue = LocalQueue::new(0);
    let mut effects = Vec::new();
    group.bench_function("admit_fast_path", |b| {
        b.iter(|| {
            let admission = queue.admit(
                &gate,
                limits,
                || pod.try_acquire().then_some(()),
                &mut effects,
            );
            assert_eq!(admission, Admission::Proceed(()));
            pod.release();
        })
    });
    // Slow path: the pod is full, the request queues; then a release hands the slot to it.
    let gate = RevisionGate::new(2);
    let pod = PodSlots::new(1);
    assert!(pod.try_acquire());
    let mut queue = LocalQueue::new(0);
    group.bench_function("queue_then_hand_off_on_release", |b| {
        b.iter(|| {
            effects.clear();
            let admission = queue.admit(
                &gate,
                limits,
                || pod.try_acquire().then_some(()),
                &mut effects,
            );
            assert!(matches!(admission, Admission::Queued(_)));
            pod.release();
            queue.dispatch(&gate, || pod.try_acquire().then_some(()), &mut effects);
            assert_eq!(effects.len(), 1);
        })
    });
    group.finish();
}

criterion_group!(benches, slots, load_balancing, admission);
criterion_main!(benches);
