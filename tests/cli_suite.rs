//! Command-line behaviour without servers: bad input, messages, configs, docs, examples, golden errors, the layer check, knobs, NaN handling, the quickstart and upgrades.
//!
//! One test binary for several files (each file its own module, as it was its own binary
//! before): every integration-test binary links all of Sluice and libtorch's wrappers, ~100 MB
//! each, and thirty of them filled CI's disk. Timing-sensitive files keep binaries of their
//! own (`shuffle_memory`, `bench`).

mod common;

#[path = "bad_input.rs"]
mod bad_input;
#[path = "cli.rs"]
mod cli;
#[path = "config_mutants.rs"]
mod config_mutants;
#[path = "config_mutants_binary.rs"]
mod config_mutants_binary;
#[path = "config_mutants_mutations.rs"]
mod config_mutants_mutations;
#[path = "configs.rs"]
mod configs;
#[path = "corrupt_parquet.rs"]
mod corrupt_parquet;
#[path = "docs.rs"]
mod docs;
#[path = "example.rs"]
mod example;
#[path = "golden_errors.rs"]
mod golden_errors;
#[path = "house.rs"]
mod house;
#[path = "k8s.rs"]
mod k8s;
#[path = "knobs.rs"]
mod knobs;
#[path = "messages.rs"]
mod messages;
#[path = "nan_cli.rs"]
mod nan_cli;
#[path = "quickstart.rs"]
mod quickstart;
#[path = "upgrade.rs"]
mod upgrade;
