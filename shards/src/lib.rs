//! The data plane: one monoio reactor per CPU, each proxying HTTP from its own replica of routing.
