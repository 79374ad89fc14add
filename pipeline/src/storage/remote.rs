//! One builder per object store, each behind its cargo feature (`s3`, `gcs`, `azure`,
//! `http`); a build without it refuses the scheme, naming the feature.

use std::sync::Arc;

use object_store::ObjectStore;

use super::{Options, RetrySettings};
use crate::error::{Error, Result};

/// A store that could not be configured (bad credentials setting, malformed URL).
#[allow(dead_code)] // unused when every remote store's feature is off
fn configured(
    root: &str,
    built: std::result::Result<Arc<dyn ObjectStore>, object_store::Error>,
) -> Result<Arc<dyn ObjectStore>> {
    built.map_err(|e| Error::InvalidUrl {
        url: root.to_string(),
        reason: format!("cannot configure the object store: {e}"),
    })
}

/// The refusal for a scheme whose store this build left out.
#[allow(dead_code)] // unused when every remote store's feature is on
fn left_out(root: &str, scheme: &str, feature: &str) -> Error {
    Error::InvalidUrl {
        url: root.to_string(),
        reason: crate::error::feature_off(&format!("`{scheme}` storage"), feature),
    }
}

#[cfg(feature = "s3")]
pub(super) fn s3(
    root: &str,
    retry: &RetrySettings,
    options: Options,
) -> Result<Arc<dyn ObjectStore>> {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
    let mut options = options;
    let client = client_with_ca(root, "AWS_", &mut options)?;
    let mut b = AmazonS3Builder::from_env()
        .with_url(root)
        .with_retry(retry.to_object_store());
    for (k, v) in options {
        let key: AmazonS3ConfigKey = k.parse().map_err(|e| super::option_error(root, &k, e))?;
        b = b.with_config(key, v);
    }
    if let Some(client) = client {
        b = b.with_client_options(client);
    }
    configured(root, b.build().map(|s| Arc::new(s) as _))
}

#[cfg(not(feature = "s3"))]
pub(super) fn s3(root: &str, _: &RetrySettings, _: Options) -> Result<Arc<dyn ObjectStore>> {
    Err(left_out(root, "s3://", "s3"))
}

#[cfg(feature = "gcs")]
pub(super) fn gcs(
    root: &str,
    retry: &RetrySettings,
    options: Options,
) -> Result<Arc<dyn ObjectStore>> {
    use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
    let mut options = options;
    let client = client_with_ca(root, "GOOGLE_", &mut options)?;
    let mut b = GoogleCloudStorageBuilder::from_env()
        .with_url(root)
        .with_retry(retry.to_object_store());
    for (k, v) in options {
        let key: GoogleConfigKey = k.parse().map_err(|e| super::option_error(root, &k, e))?;
        b = b.with_config(key, v);
    }
    if let Some(client) = client {
        b = b.with_client_options(client);
    }
    configured(root, b.build().map(|s| Arc::new(s) as _))
}

#[cfg(not(feature = "gcs"))]
pub(super) fn gcs(root: &str, _: &RetrySettings, _: Options) -> Result<Arc<dyn ObjectStore>> {
    Err(left_out(root, "gs://", "gcs"))
}

#[cfg(feature = "http")]
pub(super) fn http(
    root: &str,
    retry: &RetrySettings,
    options: Options,
) -> Result<Arc<dyn ObjectStore>> {
    use object_store::{ClientConfigKey, ClientOptions};
    let mut options = options;
    let ca = client_with_ca(root, "", &mut options)?;
    // An `http://` URL is the user's choice of plain HTTP: the client refuses it otherwise
    // (every `http://` read failed with "builder error" before the suite had an HTTP server).
    let mut client = ca
        .unwrap_or_else(ClientOptions::new)
        .with_allow_http(root.starts_with("http://"));
    for (k, v) in options {
        let key: ClientConfigKey = k.parse().map_err(|_| {
            super::option_error(
                root,
                &k,
                "http(s) stores take only HTTP client options (`timeout`, `connect_timeout`, `proxy_url`, `user_agent`, …) and `ca_certificate`",
            )
        })?;
        client = client.with_config(key, v);
    }
    let built = object_store::http::HttpBuilder::new()
        .with_url(root)
        .with_client_options(client)
        .with_retry(retry.to_object_store())
        .build();
    configured(root, built.map(|s| Arc::new(s) as _))
}

#[cfg(not(feature = "http"))]
pub(super) fn http(root: &str, _: &RetrySettings, _: Options) -> Result<Arc<dyn ObjectStore>> {
    Err(left_out(root, "http(s)://", "http"))
}

#[cfg(feature = "azure")]
pub(super) fn azure(
    root: &str,
    retry: &RetrySettings,
    options: Options,
) -> Result<Arc<dyn ObjectStore>> {
    use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
    let mut options = options;
    let client = client_with_ca(root, "AZURE_", &mut options)?;
    let mut b = MicrosoftAzureBuilder::from_env()
        .with_url(root)
        .with_retry(retry.to_object_store());
    for (k, v) in options {
        let key: AzureConfigKey = k.parse().map_err(|e| super::option_error(root, &k, e))?;
        b = b.with_config(key, v);
    }
    if let Some(client) = client {
        b = b.with_client_options(client);
    }
    configured(root, b.build().map(|s| Arc::new(s) as _))
}

#[cfg(not(feature = "azure"))]
pub(super) fn azure(root: &str, _: &RetrySettings, _: Options) -> Result<Arc<dyn ObjectStore>> {
    Err(left_out(root, "az:// / abfs(s)://", "azure"))
}

/// The HTTP client settings of a store whose `options` name a `ca_certificate` — a PEM file of
/// CA certificates trusted besides the system's (a private CA in front of an on-premises S3,
/// a TLS-intercepting proxy) — taken out of `options`; `None` without one. `object_store`
/// takes extra roots only as a whole `ClientOptions`, which replaces the client settings a
/// builder took from the environment and from `options`, so they are gathered here again:
/// the environment's `<env_prefix>…` client keys (as the builder's `from_env` reads them),
/// then the client keys in `options`.
#[cfg(any(feature = "s3", feature = "gcs", feature = "azure", feature = "http"))]
fn client_with_ca(
    root: &str,
    env_prefix: &str,
    options: &mut Options,
) -> Result<Option<object_store::ClientOptions>> {
    use object_store::{Certificate, ClientConfigKey, ClientOptions};
    let Some(at) = options.iter().position(|(k, _)| k == "ca_certificate") else {
        return Ok(None);
    };
    let (_, path) = options.remove(at);
    let bad = |reason: String| super::option_error(root, "ca_certificate", reason);
    let pem = std::fs::read(&path).map_err(|e| bad(format!("cannot read {path}: {e}")))?;
    let roots = Certificate::from_pem_bundle(&pem)
        .map_err(|e| bad(format!("{path} is not a PEM certificate bundle: {e}")))?;
    if roots.is_empty() {
        return Err(bad(format!(
            "{path} holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)"
        )));
    }
    let mut client = ClientOptions::new();
    if !env_prefix.is_empty() {
        // `vars_os`: a variable that is not UTF-8 is skipped (as the builders' `from_env`
        // does), where `vars` would panic.
        for (k, v) in std::env::vars_os() {
            let (Some(k), Some(v)) = (k.to_str(), v.to_str()) else {
                continue;
            };
            let key = k.strip_prefix(env_prefix).map(str::to_ascii_lowercase);
            if let Some(key) = key.and_then(|k| k.parse::<ClientConfigKey>().ok()) {
                client = client.with_config(key, v);
            }
        }
    }
    for (k, v) in options.iter() {
        if let Ok(key) = k.parse::<ClientConfigKey>() {
            client = client.with_config(key, v);
        }
    }
    Ok(Some(
        roots
            .into_iter()
            .fold(client, ClientOptions::with_root_certificate),
    ))
}

#[cfg(any(feature = "s3", feature = "gcs", feature = "azure", feature = "http"))]
impl RetrySettings {
    /// As `object_store`'s remote stores take it (it has no retry settings without one).
    fn to_object_store(&self) -> object_store::RetryConfig {
        use std::time::Duration;
        object_store::RetryConfig {
            backoff: object_store::BackoffConfig {
                init_backoff: Duration::from_secs_f64(self.initial_backoff_secs.max(0.001)),
                max_backoff: Duration::from_secs(15),
                base: 2.0,
            },
            max_retries: self.max_retries,
            retry_timeout: Duration::from_secs_f64(self.timeout_secs.max(0.0)),
        }
    }
}
