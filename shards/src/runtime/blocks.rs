//! Recycled heap blocks for the large futures a connection runs only part of the time.
//!
//! A connection's task is as large as the largest state its future can be in, and every
//! connection pays that size for its whole life, queued or idle. The exchange with a pod is by
//! far the largest state (its read and write operations, its timers), so it lives outside the
//! connection's future, in a block of its own. A fresh allocation per request would cost a
//! malloc and a free of several KiB each time; instead each shard keeps the blocks its exchanges
//! gave back and reuses them, so a busy shard allocates only when its concurrency grows.

// Blocks are raw allocations a future is placed into and dropped from (see each SAFETY).
#![allow(unsafe_code)]

use std::alloc::Layout;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll};

/// One shard's spare blocks, all of a single layout: large enough for every future placed so
/// far. A shard places a few kinds of exchange (its clients' and its pods' streams, plain or
/// TLS, make different futures): a smaller one takes a block of the kept layout; a larger one
/// makes the kept layout its own and the smaller spares are freed, so whatever the order the
/// kinds first come in, every exchange after that reuses a block.
pub struct Blocks {
    layout: Cell<Option<Layout>>,
    spare: RefCell<Vec<NonNull<u8>>>,
    /// Most spare blocks kept; past that they are freed.
    keep: usize,
}

impl Blocks {
    pub fn new(keep: usize) -> Blocks {
        Blocks {
            layout: Cell::new(None),
            spare: RefCell::new(Vec::new()),
            keep,
        }
    }

    /// Moves `future` into a block, reusing a spare one when there is one.
    pub fn place<F: Future>(&self, future: F) -> InBlock<'_, F> {
        let needed = Layout::new::<F>();
        assert!(needed.size() > 0, "a zero-sized future needs no block");
        let layout = match self.layout.get() {
            Some(kept) if kept.size() >= needed.size() && kept.align() >= needed.align() => kept,
            kept => {
                let grown = kept.map_or(needed, |kept| {
                    Layout::from_size_align(
                        kept.size().max(needed.size()),
                        kept.align().max(needed.align()),
                    )
                    .expect("the larger of two valid layouts is valid")
                });
                for block in self.spare.borrow_mut().drain(..) {
                    if let Some(kept) = kept {
                        // SAFETY: every spare block was allocated with the kept layout.
                        unsafe { std::alloc::dealloc(block.as_ptr(), kept) };
                    }
                }
                self.layout.set(Some(grown));
                grown
            }
        };
        let block = self.spare.borrow_mut().pop().unwrap_or_else(|| {
            // SAFETY: the layout is not zero-sized (it holds `F`, asserted above).
            let raw = unsafe { std::alloc::alloc(layout) };
            NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
        });
        let ptr = block.cast::<F>();
        // SAFETY: `block` is valid for writes of `layout`, whose size and alignment are at least
        // `F`'s, and unused: fresh, or a spare whose previous future was dropped in place.
        unsafe { ptr.as_ptr().write(future) };
        InBlock {
            ptr,
            layout,
            blocks: self,
            _owns: PhantomData,
        }
    }

    /// Spare blocks held.
    #[cfg(test)]
    fn spare(&self) -> usize {
        self.spare.borrow().len()
    }

    fn give_back(&self, block: NonNull<u8>, layout: Layout) {
        let mut spare = self.spare.borrow_mut();
        if self.layout.get() == Some(layout) && spare.len() < self.keep {
            spare.push(block);
        } else {
            // SAFETY: `block` came from `alloc(layout)` (in `place`) and is no longer used; a
            // block of a layout since outgrown is freed, not kept.
            unsafe { std::alloc::dealloc(block.as_ptr(), layout) };
        }
    }
}

impl Drop for Blocks {
    fn drop(&mut self) {
        if let Some(layout) = self.layout.get() {
            for block in self.spare.get_mut().drain(..) {
                // SAFETY: every spare block was allocated with the recorded layout.
                unsafe { std::alloc::dealloc(block.as_ptr(), layout) };
            }
        }
    }
}

/// A future living in a block; dropping it drops the future and gives the block back.
pub struct InBlock<'a, F> {
    ptr: NonNull<F>,
    /// The block's layout (at least `F`'s).
    layout: Layout,
    blocks: &'a Blocks,
    _owns: PhantomData<F>,
}

// The future itself never moves (it stays in its block), whatever happens to this handle.
impl<F> Unpin for InBlock<'_, F> {}

impl<F: Future> Future for InBlock<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: the future stays at `ptr` until `drop` drops it in place, so it is pinned;
        // `&mut self` gives exclusive access.
        unsafe { Pin::new_unchecked(&mut *self.ptr.as_ptr()) }.poll(cx)
    }
}

impl<F> Drop for InBlock<'_, F> {
    fn drop(&mut self) {
        // SAFETY: `ptr` holds a live `F` written in `place` and not dropped before.
        unsafe { std::ptr::drop_in_place(self.ptr.as_ptr()) };
        self.blocks.give_back(self.ptr.cast(), self.layout);
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;
    use std::task::Waker;

    use super::*;

    /// Counts its drops; ready on the second poll with `value`.
    struct Probe {
        value: u64,
        polled: bool,
        drops: Rc<Cell<usize>>,
        _room: [u64; 64],
    }

    impl Future for Probe {
        type Output = u64;
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u64> {
            if std::mem::replace(&mut self.polled, true) {
                Poll::Ready(self.value)
            } else {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    }

    impl Drop for Probe {
        fn drop(&mut self) {
            self.drops.set(self.drops.get() + 1);
        }
    }

    fn probe(value: u64, drops: &Rc<Cell<usize>>) -> Probe {
        Probe {
            value,
            polled: false,
            drops: drops.clone(),
            _room: [0; 64],
        }
    }

    fn run<F: Future>(mut future: Pin<&mut F>) -> F::Output {
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            if let Poll::Ready(value) = future.as_mut().poll(&mut cx) {
                return value;
            }
        }
    }

    #[test]
    fn a_placed_future_runs_and_its_block_is_reused_by_the_next() {
        let blocks = Blocks::new(4);
        let drops = Rc::new(Cell::new(0));
        let mut first = blocks.place(probe(7, &drops));
        let first_at = first.ptr.cast::<u8>();
        assert_eq!(run(Pin::new(&mut first)), 7);
        drop(first);
        assert_eq!(drops.get(), 1, "dropped in place");
        assert_eq!(blocks.spare(), 1);

        let mut second = blocks.place(probe(8, &drops));
        assert_eq!(second.ptr.cast::<u8>(), first_at, "same block");
        assert_eq!(blocks.spare(), 0);
        assert_eq!(run(Pin::new(&mut second)), 8);
    }

    #[test]
    fn a_future_dropped_before_completion_is_dropped_once() {
        let blocks = Blocks::new(4);
        let drops = Rc::new(Cell::new(0));
        let mut placed = blocks.place(probe(1, &drops));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(Pin::new(&mut placed).poll(&mut cx).is_pending());
        drop(placed);
        assert_eq!(drops.get(), 1);
        assert_eq!(blocks.spare(), 1);
    }

    #[test]
    fn spare_blocks_are_capped() {
        let blocks = Blocks::new(2);
        let drops = Rc::new(Cell::new(0));
        let placed: Vec<_> = (0..5).map(|i| blocks.place(probe(i, &drops))).collect();
        drop(placed);
        assert_eq!(drops.get(), 5);
        assert_eq!(blocks.spare(), 2, "the rest were freed");
    }

    /// A larger future than any before, with a stricter alignment.
    #[repr(align(64))]
    struct Large(Probe, #[allow(dead_code)] [u64; 32]);

    impl Future for Large {
        type Output = u64;
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u64> {
            // SAFETY (test): the probe is never moved out of the pinned pair.
            unsafe { self.map_unchecked_mut(|large| &mut large.0) }.poll(cx)
        }
    }

    #[test]
    fn futures_of_several_layouts_share_blocks_whichever_comes_first() {
        let blocks = Blocks::new(4);
        let drops = Rc::new(Cell::new(0));
        // The small kind first, then a larger one: the kept layout grows, old spares go.
        drop(blocks.place(probe(1, &drops)));
        assert_eq!(blocks.spare(), 1);
        let mut large = blocks.place(Large(probe(2, &drops), [0; 32]));
        assert_eq!(blocks.spare(), 0, "the smaller spare was freed");
        assert_eq!(large.ptr.cast::<u8>().as_ptr() as usize % 64, 0, "aligned");
        assert_eq!(run(Pin::new(&mut large)), 2);
        let large_at = large.ptr.cast::<u8>();
        drop(large);
        // Both kinds now reuse the one block, in either order.
        for i in 0..3 {
            let small = blocks.place(probe(i, &drops));
            assert_eq!(small.ptr.cast::<u8>(), large_at, "the small kind reuses it");
            drop(small);
            let large = blocks.place(Large(probe(i, &drops), [0; 32]));
            assert_eq!(large.ptr.cast::<u8>(), large_at, "the large kind reuses it");
            drop(large);
        }
        assert_eq!(blocks.spare(), 1);
        assert_eq!(drops.get(), 8, "every future dropped once");
    }
}
