//! Settings several components share: how to reach a Kafka cluster (the `kafka` source, the
//! Kafka sink, a dead-letter topic), durations, and where bad records go and when they stop
//! a run (the `kafka` source, the `image` stage).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer};

use super::OneOrMany;

/// How to reach a Kafka cluster.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConnection {
    /// Bootstrap brokers: `host:port` or a list of them.
    pub brokers: OneOrMany,
    /// Any librdkafka property, passed through unchanged (`security.protocol: SASL_SSL`,
    /// `sasl.mechanism: SCRAM-SHA-512`, `sasl.username`, `sasl.password: ${KAFKA_PASSWORD}`,
    /// `ssl.ca.location`, …). Values of keys that look secret (`password`, `secret`, `key`)
    /// are never printed.
    #[serde(default)]
    pub properties: Properties,
}

impl KafkaConnection {
    /// librdkafka settings in one order for every client Sluice makes: brokers and client id,
    /// then Sluice's `defaults` for this client, then the user's `properties` (which override
    /// them). Settings Sluice must enforce are set by the caller afterwards.
    #[cfg(feature = "kafka")]
    pub fn client_config(&self, defaults: &[(&str, String)]) -> rdkafka::ClientConfig {
        let mut c = rdkafka::ClientConfig::new();
        c.set("bootstrap.servers", self.brokers.0.join(","));
        c.set("client.id", "sluice");
        for (k, v) in defaults {
            c.set(*k, v);
        }
        for (k, v) in &self.properties.0 {
            c.set(k, v);
        }
        c
    }
}

impl fmt::Debug for KafkaConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaConnection")
            .field("brokers", &self.brokers.0)
            .field("properties", &self.properties)
            .finish()
    }
}

/// librdkafka properties. `Debug` hides the values of secret-looking keys.
#[derive(Clone, PartialEq, Default)]
pub struct Properties(pub BTreeMap<String, String>);

impl Properties {
    /// Whether a property's value must never be printed.
    pub fn is_secret(key: &str) -> bool {
        let k = key.to_ascii_lowercase();
        ["password", "secret", "key", "token", "jaas"]
            .iter()
            .any(|s| k.contains(s))
    }
}

impl fmt::Debug for Properties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut m = f.debug_map();
        for (k, v) in &self.0 {
            if Properties::is_secret(k) {
                m.entry(k, &"<redacted>");
            } else {
                m.entry(k, v);
            }
        }
        m.finish()
    }
}

impl<'de> Deserialize<'de> for Properties {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = BTreeMap::<String, super::Literal>::deserialize(d)?;
        Ok(Properties(
            raw.into_iter()
                .map(|(k, v)| {
                    let v = match v {
                        super::Literal::Str(s) => s,
                        other => other.to_string(),
                    };
                    (k, v)
                })
                .collect(),
        ))
    }
}

/// A duration written as `100ms`, `30s`, `5m`, `1h 30m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s)
            .map(HumanDuration)
            .map_err(|e| {
                de::Error::custom(format!(
                    "`{s}` is not a duration ({e}); examples: 100ms, 30s, 5m"
                ))
            })
    }
}

/// Where records that cannot be decoded go.
#[derive(Debug, Clone, PartialEq)]
pub enum DeadLetterConfig {
    /// JSON-lines objects under a directory (local path or object-store URL).
    File(DeadLetterFile),
    /// A Kafka topic: the original key and value, with the error and origin in headers.
    Kafka(DeadLetterKafka),
}

impl<'de> Deserialize<'de> for DeadLetterConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            #[serde(rename = "type")]
            kind: String,
            #[serde(default)]
            path: Option<String>,
            #[serde(default)]
            storage: Option<crate::storage::StorageConfig>,
            #[serde(default)]
            topic: Option<String>,
            #[serde(default)]
            brokers: Option<OneOrMany>,
            #[serde(default)]
            properties: Option<Properties>,
        }
        let r = Raw::deserialize(d)?;
        match r.kind.as_str() {
            "file" => {
                if r.topic.is_some() || r.brokers.is_some() || r.properties.is_some() {
                    return Err(de::Error::custom(
                        "a `file` dead letter takes `path` and `storage`, not `topic`/`brokers`/`properties`",
                    ));
                }
                Ok(DeadLetterConfig::File(DeadLetterFile {
                    path: r.path.ok_or_else(|| de::Error::missing_field("path"))?,
                    storage: r.storage.unwrap_or_default(),
                }))
            }
            "kafka" => {
                if r.path.is_some() || r.storage.is_some() {
                    return Err(de::Error::custom(
                        "a `kafka` dead letter takes `topic` (and optionally `brokers`, `properties`), not `path`/`storage`",
                    ));
                }
                Ok(DeadLetterConfig::Kafka(DeadLetterKafka {
                    topic: r.topic.ok_or_else(|| de::Error::missing_field("topic"))?,
                    brokers: r.brokers,
                    properties: r.properties.unwrap_or_default(),
                }))
            }
            other => Err(de::Error::custom(format!(
                "unknown dead letter type `{other}`, expected `file` or `kafka`"
            ))),
        }
    }
}

/// `dead_letter: {type: file, path: …}`.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetterFile {
    /// Directory (path or URL) the JSON-lines objects are written under.
    pub path: String,
    /// Object-store options.
    pub storage: crate::storage::StorageConfig,
}

/// `dead_letter: {type: kafka, topic: …}`.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetterKafka {
    /// Topic to produce to.
    pub topic: String,
    /// Brokers; default: the source's.
    pub brokers: Option<OneOrMany>,
    /// librdkafka properties; default: the source's.
    pub properties: Properties,
}

/// When bad records stop the run.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ErrorBudget {
    /// Stop once more than this many records were dead-lettered.
    #[serde(default)]
    pub max_records: Option<u64>,
    /// Stop once more than this fraction of the records seen (after at least 100) was
    /// dead-lettered.
    #[serde(default)]
    pub max_ratio: Option<f64>,
}
