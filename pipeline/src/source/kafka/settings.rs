//! The `kafka` source's settings: topics, format and schema, assignment between ranks, where
//! reading starts and stops, batching, dead letters and outages. Compiled with or without the
//! `kafka` cargo feature, so a config naming the source is read, checked and (without the
//! feature) refused by name. The connection settings it shares with the Kafka sink and the
//! dead-letter topic are in `crate::config`.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use crate::config::{
    DeadLetterConfig, ErrorBudget, HumanDuration, KafkaConnection, OneOrMany, Properties,
};
use crate::types::{FieldTypeName, Literal};

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
                    let v: Literal = m.next_value()?;
                    out = Some(match v {
                        Literal::Int(ms) => ms,
                        Literal::Str(s) => humantime::parse_rfc3339_weak(&s)
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
