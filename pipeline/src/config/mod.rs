//! The pipeline's config model: loading YAML (located errors, interpolation, size limits),
//! the `runtime` section, and the settings several components share. Each stage's and
//! source's own settings live with its build step and kernel (`stage`, `source`; public as
//! `crate::stages` and `crate::sources`); the whole document is `crate::PipelineConfig`.
//! Field doc comments are the reference documentation (`docs/config.md` follows them);
//! defaults are stated there.

mod common;
mod interpolate;
pub mod limits;
mod load;
mod overrides;

use std::fmt;

use bytesize::ByteSize;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

pub use common::{
    DeadLetterConfig, DeadLetterFile, DeadLetterKafka, ErrorBudget, HumanDuration, KafkaConnection,
    Properties,
};
pub use load::{Component, ConfigDocument, Located, component_fields, struct_fields};

pub use crate::error::config::{
    ConfigError, ConfigErrors, MAX_MESSAGE_BYTES, MAX_QUOTED_BYTES, MAX_SHOWN_ERRORS, did_you_mean,
};
use crate::state::Draws;
pub use crate::types::Literal;

/// Top-level sections a pipeline file may hold. `sink` is read by the `sluice` binary (crate
/// `sluice-sinks`); the pipeline crate accepts it so one file describes the whole job.
pub const TOP_LEVEL_SECTIONS: &[&str] = &[
    "source",
    "stages",
    "runtime",
    "sink",
    "checkpoint",
    "trainer",
    "loader",
];

/// Threads and memory of the pipeline.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Size of the CPU pool that decodes and transforms batches, at most 1024; `0` means one
    /// per core, as does leaving it out (at most 1024). Default: the number of cores.
    #[serde(default)]
    pub threads: Option<usize>,
    /// Batches transformed concurrently per group of stages (order is preserved). Default:
    /// `threads`.
    #[serde(default)]
    pub parallelism: Option<usize>,
    /// Capacity of each queue between stages, in bytes of Arrow memory (`16 MiB`, `1GB`, or a
    /// number). A single batch larger than this still passes, alone. Default: `16 MiB`.
    #[serde(default = "default_queue_bytes")]
    pub queue_bytes: ByteSize,
    /// This process's rank among the readers of the same source (0-based). Default: from the
    /// environment (`SLUICE_RANK`, `RANK`, `OMPI_COMM_WORLD_RANK`, `PMI_RANK`), else 0.
    #[serde(default)]
    pub rank: Option<usize>,
    /// Number of ranks reading the same source. Default: from the environment
    /// (`SLUICE_WORLD_SIZE`, `WORLD_SIZE`, `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE`), else 1.
    #[serde(default)]
    pub world_size: Option<usize>,
    /// How `gaussian_noise` draws its random numbers: `3` (ARS, today's), `2` (SplitMix64) or
    /// `1` (ChaCha8, what every Sluice before draws version 2 drew) — an older version to
    /// reproduce an older run's values in a fresh run. A resumed run keeps the version its
    /// state was written with. Default: 3.
    #[serde(default)]
    pub draws: Option<Draws>,
}

impl RuntimeConfig {
    /// `(rank, world_size)`: from the config, else the environment, else `(0, 1)`. Not
    /// checked here (an unusable variable counts as unset): opening the source refuses what
    /// [`RuntimeConfig::checked_rank_and_world`] refuses.
    pub fn rank_and_world(&self) -> (usize, usize) {
        let (rank, world) = self.configured_or_env();
        (
            rank.ok().flatten().unwrap_or(0),
            world.ok().flatten().unwrap_or(1),
        )
    }

    /// [`RuntimeConfig::rank_and_world`], refusing what would make a run read the wrong rows:
    /// an environment variable that is set but not a whole number (the first one set decides:
    /// a typo in `SLUICE_WORLD_SIZE` is not passed over for `WORLD_SIZE`), a rank that is not
    /// below the world size (so a world size of 0), and a world size over 65,536.
    pub fn checked_rank_and_world(&self) -> Result<(usize, usize), String> {
        let (rank, world) = self.configured_or_env();
        let (rank, world) = (rank?.unwrap_or(0), world?.unwrap_or(1));
        if rank >= world {
            return Err(format!(
                "rank {rank} is not below world_size {world} (`runtime.rank`/`world_size`, else SLUICE_RANK/RANK/OMPI_COMM_WORLD_RANK/PMI_RANK and SLUICE_WORLD_SIZE/WORLD_SIZE/OMPI_COMM_WORLD_SIZE/PMI_SIZE): ranks are numbered 0 to world_size − 1"
            ));
        }
        if world > MAX_WORLD_SIZE {
            return Err(format!(
                "world size {world} is out of range: allowed 1–{MAX_WORLD_SIZE} (`runtime.world_size`, else SLUICE_WORLD_SIZE/WORLD_SIZE/OMPI_COMM_WORLD_SIZE/PMI_SIZE)"
            ));
        }
        Ok((rank, world))
    }

    /// The rank and world size as configured, else from the first environment variable set.
    #[allow(clippy::type_complexity)]
    fn configured_or_env(&self) -> (Result<Option<usize>, String>, Result<Option<usize>, String>) {
        fn env(names: &[&str]) -> Result<Option<usize>, String> {
            let Some((name, value)) = names
                .iter()
                .find_map(|n| std::env::var(n).ok().map(|v| (n, v)))
            else {
                return Ok(None);
            };
            value.trim().parse().map(Some).map_err(|_| {
                format!("the environment variable {name}={value:?} is not a whole number; set it to this process's number (or unset it)")
            })
        }
        let rank = match self.rank {
            Some(r) => Ok(Some(r)),
            None => env(&["SLUICE_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"]),
        };
        let world = match self.world_size {
            Some(w) => Ok(Some(w)),
            None => env(&[
                "SLUICE_WORLD_SIZE",
                "WORLD_SIZE",
                "OMPI_COMM_WORLD_SIZE",
                "PMI_SIZE",
            ]),
        };
        (rank, world)
    }
}

/// The most ranks a pipeline may be split over (every rank plans the shares of all ranks).
pub const MAX_WORLD_SIZE: usize = 65_536;

/// 16 MiB: on the CIFAR-style bench, 4, 8, 16 and 32 MiB queues ran equally fast (within
/// this machine's noise) while each doubling added ~30 MiB of peak RSS.
fn default_queue_bytes() -> ByteSize {
    ByteSize::mib(16)
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            threads: None,
            parallelism: None,
            queue_bytes: default_queue_bytes(),
            rank: None,
            world_size: None,
            draws: None,
        }
    }
}

/// A string or a list of strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OneOrMany(pub Vec<String>);

impl<'de> Deserialize<'de> for OneOrMany {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OneOrMany;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a path or a list of paths")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<OneOrMany, E> {
                Ok(OneOrMany(vec![v.to_string()]))
            }
            fn visit_seq<S: de::SeqAccess<'de>>(self, mut s: S) -> Result<OneOrMany, S::Error> {
                let mut out = Vec::new();
                while let Some(v) = s.next_element::<String>()? {
                    out.push(v);
                }
                if out.is_empty() {
                    return Err(de::Error::invalid_length(0, &"at least one path"));
                }
                Ok(OneOrMany(out))
            }
        }
        d.deserialize_any(V)
    }
}

// The settings that decide the order are stamped into checkpoints as JSON of their effective
// values (see `exec::stamp`), so every config type serializes, in the form its YAML takes.
impl Serialize for OneOrMany {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}
