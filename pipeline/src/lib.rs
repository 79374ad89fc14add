//! # sluice-pipeline
//!
//! The data side of Sluice: the YAML config model, sources (Parquet files on local disk or in
//! object stores through `object_store`, Kafka topics through librdkafka), Arrow stages
//! (column and value transforms, `filter`, `batch`, seeded augmentation and `image`
//! decoding, a seeded `shuffle` that can exchange rows across ranks) and the
//! [`Pipeline::stream`] API, which yields [`Batch`]es — Arrow record batches with the lineage
//! of every row — and resumes exactly from a [`SourceState`].
//!
//! Decode and transform work runs on a bounded rayon pool ([`CpuPool`]); stages are connected
//! by queues bounded in bytes; row order is preserved. Modules are layered (plain data, state,
//! config, runtime plumbing, stages, the pipeline document, sources, the executor:
//! `docs/architecture.md`), and the heavy components are cargo features (`kafka`, `s3`,
//! `gcs`, `azure`, `http`, `image`).

pub mod batch;
pub mod checkpoint;
pub mod collective;
pub mod config;
mod dead_letter;
mod error;
pub mod exec;
pub mod inspect;
#[cfg(feature = "kafka")]
pub mod kafka_log;
mod pipeline_config;
pub mod runtime;
mod source;
mod stage;
pub mod state;
pub mod storage;
pub mod types;

pub use batch::{Batch, Lineage, LineageSpan, Name, Origin};
pub use config::{ConfigDocument, ConfigError, ConfigErrors};
pub use error::{Error, ReadKind, Result, StageRef, feature_off};
pub use exec::{BatchStream, CpuPool, Pipeline, PipelineMetrics, Plan, PreparedPipeline};
pub use pipeline_config::PipelineConfig;
pub use source::input_objects;
pub use state::{
    Acknowledger, BatchRun, DataStamp, Draws, ErrorCounts, PlanStamp, Rescaled, SourceState,
};

/// The `source:` section: [`SourceConfig`](sources::SourceConfig), one variant per kind, and
/// each kind's settings. (They are defined in each source's folder, in the private `source`
/// module; this is their public path. Settings several components share, such as the Kafka
/// connection and dead letters, are in [`config`].)
pub mod sources {
    pub use crate::source::{
        Assignment, KafkaFormat, KafkaSourceConfig, Mix, OutageBudget, ParquetSourceConfig,
        Partitioning, SchemaSpec, ShardPolicy, SourceConfig, StartPosition, Until,
    };
}

/// The `stages:` list: [`StageConfig`](stages::StageConfig), one variant per kind, and each
/// kind's settings. (They are defined beside each kind's build step and kernel, in the
/// private `stage` module; this is their public path.)
pub mod stages {
    pub use crate::stage::{
        AugmentOn, BatchConfig, CastConfig, ClipConfig, CutmixConfig, DEVICE_IMAGE_KEY,
        DeviceImage, EraseValue, FeatureDropoutConfig, FillNullConfig, FilterConfig,
        GaussianNoiseConfig, GroupByLength, ImageConfig, ImageDtype, ImageFormat, ImageOp,
        MaskTokensConfig, MixupConfig, NonFinite, NumberOrList, OnError, OneHotConfig, PadFill,
        PaddingMode, RenameConfig, SelectConfig, ShuffleConfig, ShuffleMode, StageConfig,
        StandardizeConfig,
    };
}

/// The `image` stage's conversion kernel on its own, for `sluice bench`'s floor variant (what
/// any float32 loader must at least do); not part of the API.
#[doc(hidden)]
pub use stage::rgb_to_chw as bench_rgb_to_chw;
