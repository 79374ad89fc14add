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
        "no files match `{pattern}` (looked in {listed}); check the path{}",
        if pattern.contains("://") { "" } else { ", which is resolved relative to the config file" }
    )]
    NoMatch { pattern: String, listed: String },

    /// Listing, reading or writing an object failed.
    #[error("{url}: {operation} failed: {}", storage_message(source))]
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
/// An object store's error on one line, with what to do: an S3-style XML error body is cut
/// down to its `Code` and `Message`, and common causes get a hint.
fn storage_message(e: &object_store::Error) -> String {
    let text = e.to_string();
    let tag = |name: &str| {
        let open = format!("<{name}>");
        let start = text.find(&open)? + open.len();
        let len = text[start..].find(&format!("</{name}>"))?;
        Some(text[start..start + len].trim().to_string())
    };
    let (code, message) = (tag("Code"), tag("Message"));
    let mut out = match text.find("<?xml").or_else(|| text.find("<Error>")) {
        Some(i) => text[..i].trim_end().trim_end_matches(':').to_string(),
        None => text.clone(),
    };
    if let Some(c) = &code {
        out.push_str(&format!(
            ": {c}{}",
            message.map(|m| format!(" ({m})")).unwrap_or_default()
        ));
    }
    let mut out = out.split_whitespace().collect::<Vec<_>>().join(" ");
    let credentials = "check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, GOOGLE_*, AZURE_* or `storage.options`) and this principal's permissions on the bucket";
    let hint = match (e, code.as_deref()) {
        (_, Some("NoSuchBucket")) => {
            "The bucket does not exist: check its name, and the endpoint and region it lives in".to_string()
        }
        (
            _,
            Some(
                "AccessDenied" | "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "ExpiredToken"
                | "InvalidToken",
            ),
        )
        | (
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. },
            _,
        ) => format!("Access denied: {credentials}"),
        (object_store::Error::NotFound { .. }, _) | (_, Some("NoSuchKey")) => {
            "Check the bucket and path".to_string()
        }
        _ if text.contains("error sending request") || text.contains("Connection refused") => {
            "The object store could not be reached: check the endpoint (AWS_ENDPOINT_URL or `storage.options`), that it is up, and the network".to_string()
        }
        _ => String::new(),
    };
    if !hint.is_empty() {
        out.push_str(". ");
        out.push_str(&hint);
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    fn storage(source: object_store::Error) -> String {
        Error::Storage {
            url: "s3://b/x".into(),
            operation: "list",
            source,
        }
        .to_string()
    }

    /// An S3 error body is cut to its code and message, on one line, with what to do.
    #[test]
    fn storage_errors_are_one_line_with_a_hint() {
        let xml = "Error performing list request: Server returned non-2xx status code: 404 Not Found: <?xml version=\"1.0\" encoding=\"utf-8\"?>\n<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message><BucketName>b</BucketName><RequestId>X</RequestId></Error>";
        let e = storage(object_store::Error::Generic {
            store: "S3",
            source: xml.into(),
        });
        assert_eq!(
            e,
            "s3://b/x: list failed: Generic S3 error: Error performing list request: Server returned non-2xx status code: 404 Not Found: NoSuchBucket (The specified bucket does not exist). The bucket does not exist: check its name, and the endpoint and region it lives in"
        );
        let e = storage(object_store::Error::Generic {
            store: "S3",
            source: "Server returned non-2xx status code: 403 Forbidden: <Error><Code>InvalidAccessKeyId</Code></Error>".into(),
        });
        assert!(
            e.ends_with("403 Forbidden: InvalidAccessKeyId. Access denied: check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, GOOGLE_*, AZURE_* or `storage.options`) and this principal's permissions on the bucket"),
            "{e}"
        );
        let e = storage(object_store::Error::Generic {
            store: "S3",
            source: "Error performing HEAD http://127.0.0.1:1/b in 7s, after 10 retries - HTTP error: error sending request".into(),
        });
        assert!(
            e.ends_with("error sending request. The object store could not be reached: check the endpoint (AWS_ENDPOINT_URL or `storage.options`), that it is up, and the network"),
            "{e}"
        );
    }
}
