//! The parts of KEDA's HTTP add-on kactivator answers for (issue 40; `reference/keda-http-add-on.md`):
//! what KEDA's external-scaler calls ask for and what they are answered, in the add-on's terms,
//! a route's request rate as the add-on computes it, and an HTTPScaledObject read as a route.
//! Pure: the gRPC service that carries these answers, and the source of HTTPScaledObjects, are
//! built on top of it.

pub mod object;
pub mod rate;
pub mod scaler;
