//! Kafka configs: the `kafka` source, and the connection settings the Kafka sink and the
//! dead-letter topic share with it.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use super::OneOrMany;
use crate::types::FieldTypeName;

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

/// How Kafka messages become rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KafkaFormat {
    /// One JSON object per message, decoded with the declared `schema`.
    Json,
    /// One Arrow IPC stream per message (schema + record batches, any compression); every
    /// message must carry the same schema.
    ArrowIpc,
    /// No decoding: columns `key` (binary), `value` (binary), `timestamp` (ms), `headers`.
    Raw,
}

/// How partitions are divided among readers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Assignment {
    /// Every partition of the topics, split deterministically across ranks
    /// (`runtime.rank`/`world_size`): partition *i* of the sorted list goes to rank
    /// *i mod world_size*. Positions come from Sluice's checkpoint (exact resume); Kafka
    /// commits, when `group_id` is set, are only for lag monitoring.
    #[default]
    Static,
    /// A Kafka consumer group (`group_id` required): the broker assigns partitions and
    /// rebalances. Offsets are stored only after the sink has durably taken the rows:
    /// at-least-once.
    Group,
}

/// Where reading starts when no checkpoint (static) or committed offset (group) exists.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StartPosition {
    /// The oldest retained message.
    #[default]
    Earliest,
    /// Only messages produced after the start.
    Latest,
    /// The first message with a timestamp at or after this many ms since the Unix epoch.
    Timestamp(i64),
}

impl<'de> Deserialize<'de> for StartPosition {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StartPosition;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`earliest`, `latest` or `{timestamp: <ms since epoch or RFC 3339>}`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<StartPosition, E> {
                match v {
                    "earliest" => Ok(StartPosition::Earliest),
                    "latest" => Ok(StartPosition::Latest),
                    other => Err(E::custom(format!(
                        "unknown start position `{other}`, expected `earliest`, `latest` or `{{timestamp: …}}`"
                    ))),
                }
            }
            fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<StartPosition, M::Error> {
                let mut out = None;
                while let Some(k) = m.next_key::<String>()? {
                    if k != "timestamp" {
                        return Err(de::Error::unknown_field(&k, &["timestamp"]));
                    }
                    let v: super::Literal = m.next_value()?;
                    out = Some(match v {
                        super::Literal::Int(ms) => ms,
                        super::Literal::Str(s) => humantime::parse_rfc3339_weak(&s)
                            .map_err(|e| {
                                de::Error::custom(format!(
                                    "`{s}` is not an RFC 3339 time ({e}); example: 2026-01-31T12:00:00Z"
                                ))
                            })?
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_err(|_| de::Error::custom("timestamps before 1970 are not supported"))?
                            .as_millis() as i64,
                        other => {
                            return Err(de::Error::custom(format!(
                                "expected milliseconds since the epoch or an RFC 3339 time, found {other}"
                            )));
                        }
                    });
                }
                out.map(StartPosition::Timestamp)
                    .ok_or_else(|| de::Error::missing_field("timestamp"))
            }
        }
        d.deserialize_any(V)
    }
}

/// When a Kafka source stops. Unbounded when absent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Until {
    /// Each partition up to its end offset as of the start of the run.
    End,
    /// After this many records (rows plus dead-lettered records) in total.
    Records(u64),
    /// After this much time.
    Duration(Duration),
}

impl<'de> Deserialize<'de> for Until {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Until;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`end`, `{records: N}` or `{duration: 30s}`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Until, E> {
                match v {
                    "end" => Ok(Until::End),
                    other => Err(E::custom(format!(
                        "unknown `until` value `{other}`, expected `end`, `{{records: N}}` or `{{duration: 30s}}`"
                    ))),
                }
            }
            fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<Until, M::Error> {
                let mut out = None;
                while let Some(k) = m.next_key::<String>()? {
                    out = Some(match k.as_str() {
                        "records" => Until::Records(m.next_value()?),
                        "duration" => Until::Duration(m.next_value::<HumanDuration>()?.0),
                        other => {
                            return Err(de::Error::unknown_field(other, &["records", "duration"]));
                        }
                    });
                }
                out.ok_or_else(|| de::Error::custom("expected `records` or `duration`"))
            }
        }
        d.deserialize_any(V)
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

/// `outage_budget`: how long a source waits for unreachable brokers before it gives up —
/// a duration, or `forever`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutageBudget {
    /// Fail once the brokers have been unreachable this long.
    Within(Duration),
    /// Wait for the brokers however long they are gone (streaming jobs).
    Forever,
}

impl<'de> Deserialize<'de> for OutageBudget {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s.trim() == "forever" {
            return Ok(OutageBudget::Forever);
        }
        humantime::parse_duration(&s)
            .map(OutageBudget::Within)
            .map_err(|e| {
                de::Error::custom(format!(
                    "`{s}` is not a duration ({e}) nor `forever`; examples: 30s, 5m, forever"
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

/// `type: kafka` — records from Kafka topics.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSourceConfig {
    /// Bootstrap brokers: `host:port` or a list.
    pub brokers: OneOrMany,
    /// Topic or list of topics.
    pub topic: OneOrMany,
    /// `json`, `arrow_ipc` or `raw`.
    pub format: KafkaFormat,
    /// Columns and their types, in order (`json`: required; `arrow_ipc`: optional, checked
    /// against every message). Types: the scalar names of `cast`, plus `list<T>` and
    /// `fixed_size_list<T, N>` (or `T[N]`), e.g. `{id: int64, x: "float32[64]"}`.
    #[serde(default)]
    pub schema: Option<SchemaSpec>,
    /// `static` (default) or `group`.
    #[serde(default)]
    pub assignment: Assignment,
    /// Consumer group: required for `group`; with `static`, positions are also committed
    /// there (for lag monitoring only).
    #[serde(default)]
    pub group_id: Option<String>,
    /// `earliest` (default), `latest` or `{timestamp: …}`; a checkpoint (static) or committed
    /// offset (group) takes precedence.
    #[serde(default)]
    pub start: StartPosition,
    /// `end`, `{records: N}` or `{duration: 30s}`. Default: run until stopped.
    #[serde(default)]
    pub until: Option<Until>,
    /// Maximum rows per batch (`json`, `raw`). Default: 8192.
    #[serde(default = "default_batch_rows")]
    pub batch_rows: usize,
    /// Emit a partial batch once its first record is this old. Default: 100ms.
    #[serde(default = "default_batch_timeout")]
    pub batch_timeout: HumanDuration,
    /// Where undecodable records go. Without it, the first bad record stops the run.
    #[serde(default)]
    pub dead_letter: Option<DeadLetterConfig>,
    /// When dead-lettered records stop the run. Default: never (every one is counted and
    /// reported).
    #[serde(default)]
    pub error_budget: ErrorBudget,
    /// Give up connecting (metadata, topic lookup) after this long. Default: 10s.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout: HumanDuration,
    /// Once running, how long the brokers may stay unreachable before the run stops with an
    /// error: a duration or `forever`. Default: 5m for a bounded run (`until` set), forever
    /// for a stream.
    #[serde(default)]
    pub outage_budget: Option<OutageBudget>,
    /// Any librdkafka consumer property (SASL/TLS settings and the like). Secret values are
    /// never printed.
    #[serde(default)]
    pub properties: Properties,
}

impl KafkaSourceConfig {
    /// The outage budget in effect: as set, else 5m for a bounded run and forever for a
    /// stream.
    pub fn outage_budget(&self) -> OutageBudget {
        match (self.outage_budget, &self.until) {
            (Some(b), _) => b,
            (None, Some(_)) => OutageBudget::Within(Duration::from_secs(300)),
            (None, None) => OutageBudget::Forever,
        }
    }

    /// The connection part.
    pub fn connection(&self) -> KafkaConnection {
        KafkaConnection {
            brokers: self.brokers.clone(),
            properties: self.properties.clone(),
        }
    }
}

fn default_batch_rows() -> usize {
    8192
}
fn default_batch_timeout() -> HumanDuration {
    HumanDuration(Duration::from_millis(100))
}
fn default_connect_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}

/// Column names and types in declaration order.
#[derive(Debug, Clone, PartialEq)]
pub struct SchemaSpec(pub Vec<(String, FieldTypeName)>);

impl<'de> Deserialize<'de> for SchemaSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = SchemaSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of column name to type, e.g. {id: int64, x: \"float32[4]\"}")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<SchemaSpec, M::Error> {
                let mut out: Vec<(String, FieldTypeName)> = Vec::new();
                while let Some(k) = m.next_key::<String>()? {
                    if out.iter().any(|(n, _)| *n == k) {
                        return Err(de::Error::custom(format!("column `{k}` declared twice")));
                    }
                    out.push((k, m.next_value()?));
                }
                if out.is_empty() {
                    return Err(de::Error::custom("the schema declares no columns"));
                }
                Ok(SchemaSpec(out))
            }
        }
        d.deserialize_map(V)
    }
}

impl SchemaSpec {
    /// The Arrow schema (all columns nullable).
    pub fn to_arrow(&self) -> arrow::datatypes::Schema {
        arrow::datatypes::Schema::new(
            self.0
                .iter()
                .map(|(n, t)| arrow::datatypes::Field::new(n, t.data_type().clone(), true))
                .collect::<Vec<_>>(),
        )
    }
}
