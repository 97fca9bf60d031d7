//! The control plane: one tokio thread that owns configuration and publishes routing snapshots.
