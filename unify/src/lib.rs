//! No code: see this crate's Cargo.toml. It exists so that every build of the workspace turns
//! on the same features in a few low dependencies, and each dependency is compiled once.
