//! The pipeline crate's error type: one enum, one variant per kind of failure, each carrying
//! where it happened (config file line:column, object URL, row group, stage) and what to do.

use std::fmt;

use crate::config::ConfigErrors;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Identifies a stage in error messages: its position in `stages:`, its type and where it is
/// declared in the YAML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageRef {
    /// 0-based index in the `stages:` list.
    pub index: usize,
    /// The stage's `type`.
    pub kind: &'static str,
    /// `file:line:column` of the stage in its config file, when it came from one.
    pub location: Option<String>,
}

impl fmt::Display for StageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stages[{}] ({})", self.index, self.kind)?;
        if let Some(loc) = &self.location {
            write!(f, " at {loc}")?;
        }
        Ok(())
    }
}

/// Everything that can go wrong in `sluice-pipeline`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The pipeline description is invalid; every problem found is listed.
    #[error("{0}")]
    Config(#[from] ConfigErrors),

    /// A checkpointed state does not fit this pipeline.
    #[error("cannot resume: {0}")]
    Resume(String),

    /// A config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    ConfigFile {
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// A path or URL that Sluice cannot turn into an object store location.
    #[error("invalid location `{url}`: {reason}")]
    InvalidUrl { url: String, reason: String },

    /// A glob or path matched nothing.
    #[error(
        "no files match `{pattern}` (looked in {listed}); check the path, which is resolved relative to the config file"
    )]
    NoMatch { pattern: String, listed: String },

    /// Listing, reading or writing an object failed.
    #[error("{url}: {operation} failed: {source}{}", storage_hint(source))]
    Storage {
        url: String,
        operation: &'static str,
        #[source]
        source: object_store::Error,
    },

    /// The source's configuration does not fit the data (unknown column, bad setting).
    #[error("source at {at}: {message}")]
    Source { at: String, message: String },

    /// Reading part of an object failed after the retry budget was spent.
    #[error("{url}{}: {message}. The object store kept failing past the retry budget (`storage.retry` of the source); check that it is reachable", .row_group.map(|rg| format!(" (row group {rg})")).unwrap_or_default())]
    Read {
        url: String,
        row_group: Option<usize>,
        message: String,
    },

    /// A file could not be decoded as Parquet (not Parquet, truncated, corrupt).
    #[error("{url}{}: cannot decode Parquet: {source}. {hint}", .row_group.map(|rg| format!(" (row group {rg})")).unwrap_or_default())]
    Parquet {
        url: String,
        row_group: Option<usize>,
        hint: &'static str,
        #[source]
        source: parquet::errors::ParquetError,
    },

    /// Files of one source disagree on their schema.
    #[error(
        "{url}: schema differs from {first_url}: {detail}. All files of a source must share one schema"
    )]
    SchemaMismatch {
        url: String,
        first_url: String,
        detail: String,
    },

    /// A stage's configuration does not fit the data it receives (unknown column, bad type).
    #[error("{stage}: {message}")]
    Stage { stage: StageRef, message: String },

    /// A stage failed on actual data (a cast that cannot convert a value, an out-of-range
    /// class). `rows` names the rows by their origin.
    #[error("{stage}: {message} (input rows: {rows})")]
    Data {
        stage: StageRef,
        message: String,
        rows: String,
    },

    /// An Arrow kernel failed where no more precise variant applies.
    #[error("{context}: {source}")]
    Arrow {
        context: String,
        #[source]
        source: arrow::error::ArrowError,
    },

    /// Kafka could not be reached or refused the request (unknown topic, authentication).
    #[error("kafka (brokers {brokers}): {message}")]
    Kafka { brokers: String, message: String },

    /// Records could not be decoded and no dead-letter sink took them, or the error budget
    /// is spent.
    #[error("{message}")]
    BadRecords { message: String },

    /// The run was cancelled (Ctrl-C, or the consumer went away).
    #[error("cancelled")]
    Cancelled,

    /// A bug in Sluice; please report it.
    #[error("internal error (this is a bug in Sluice, please report it): {0}")]
    Internal(String),
}

/// What to do about an object-store error, by kind.
fn storage_hint(e: &object_store::Error) -> &'static str {
    match e {
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => {
            ". Access denied: check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, GOOGLE_*, AZURE_* or `storage.options`) and this principal's permissions on the bucket"
        }
        object_store::Error::NotFound { .. } => ". Check the bucket and path",
        _ => "",
    }
}

impl Error {
    pub(crate) fn parquet(
        url: &str,
        row_group: Option<usize>,
        source: parquet::errors::ParquetError,
    ) -> Self {
        if let parquet::errors::ParquetError::External(inner) = &source
            && inner.is::<crate::source::reader::ReadError>()
        {
            return Error::Read {
                url: url.to_string(),
                row_group,
                message: inner.to_string(),
            };
        }
        let text = source.to_string();
        let hint = if text.contains("magic") || text.contains("footer") || text.contains("EOF") {
            "The file is not Parquet or is truncated (incomplete upload or copy?); `sluice inspect` shows what can be read"
        } else {
            "The file may be corrupt; `sluice inspect` shows what can be read"
        };
        Error::Parquet {
            url: url.to_string(),
            row_group,
            hint,
            source,
        }
    }
}
