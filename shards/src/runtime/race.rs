//! Racing two futures on one shard without a select macro: the first to finish wins and the
//! other is dropped (so only race futures whose drop is harmless).

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;

pub enum Either<A, B> {
    Left(A),
    Right(B),
}

/// Polls `left` first, then `right`; returns whichever finishes first.
pub async fn race<A: Future, B: Future>(left: A, right: B) -> Either<A::Output, B::Output> {
    let mut left = pin!(left);
    let mut right = pin!(right);
    poll_fn(|cx| {
        if let Poll::Ready(value) = left.as_mut().poll(cx) {
            return Poll::Ready(Either::Left(value));
        }
        right.as_mut().poll(cx).map(Either::Right)
    })
    .await
}
