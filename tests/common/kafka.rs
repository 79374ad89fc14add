//! The real Kafka-protocol broker (Tansu, started by `scripts/services.sh start`): topics,
//! producing test records and reading topics back, with rdkafka.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::Message;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

/// Brokers of the test broker; the suite cannot run without it.
pub fn brokers() -> String {
    std::env::var("SLUICE_TEST_KAFKA_BROKERS").unwrap_or_else(|_| {
        panic!(
            "SLUICE_TEST_KAFKA_BROKERS is not set: the Kafka tests need the real broker. Run the suite with \
             scripts/test.sh, or `eval \"$(scripts/services.sh start)\"` first"
        )
    })
}

/// The Tansu binary (for tests that start their own broker).
pub fn tansu() -> String {
    std::env::var("SLUICE_TEST_TANSU").expect("SLUICE_TEST_TANSU is not set; use scripts/test.sh")
}

/// A unique topic name.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Asks `brokers` to create the topic `name` with `partitions` partitions (the client with
/// `config` too, e.g. TLS settings): the broker's answer for it.
async fn create_named(
    brokers: &str,
    name: &str,
    partitions: i32,
    config: &[(&str, &str)],
) -> Result<(), rdkafka::types::RDKafkaErrorCode> {
    let mut client = ClientConfig::new();
    client.set("bootstrap.servers", brokers);
    for (k, v) in config {
        client.set(*k, *v);
    }
    let admin: AdminClient<DefaultClientContext> = client.create().unwrap();
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    let res = admin
        .create_topics(
            [&topic],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap();
    res.into_iter()
        .next()
        .unwrap()
        .map(|_| ())
        .map_err(|(_, e)| e)
}

/// Creates a topic with `partitions` partitions on `brokers` and returns its name.
pub async fn create_topic_on(brokers: &str, prefix: &str, partitions: i32) -> String {
    create_topic_with(brokers, prefix, partitions, &[]).await
}

/// As [`create_topic_on`], the admin client configured with `config` too (TLS settings).
pub async fn create_topic_with(
    brokers: &str,
    prefix: &str,
    partitions: i32,
    config: &[(&str, &str)],
) -> String {
    let name = unique(prefix);
    if let Err(e) = create_named(brokers, &name, partitions, config).await {
        panic!("creating topic {name}: {e}");
    }
    name
}

/// A topic of a fixed name holding exactly `records` (`(partition, value)`, produced in
/// order), for fixtures that name their topic: created and filled if missing; if it exists
/// (a second run against the same broker), it must hold exactly those records at those
/// offsets, or the test stops saying so.
pub async fn fixed_topic(brokers: &str, name: &str, partitions: i32, records: Vec<(i32, Vec<u8>)>) {
    match create_named(brokers, name, partitions, &[]).await {
        Ok(()) => {
            let n = records.len();
            assert_eq!(produce_on(brokers, name, records).await, n);
        }
        Err(rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists) => {
            // Read back, not compared by watermarks: Tansu's are not exact.
            let hint = format!(
                "topic {name} exists on {brokers} with other contents: restart the test broker (scripts/services.sh stop)"
            );
            let read = std::panic::catch_unwind(|| {
                read_topic(brokers, name, records.len(), Duration::from_secs(60))
            })
            .unwrap_or_else(|_| panic!("{hint}"));
            let mut offsets = vec![0i64; partitions as usize];
            let mut want = BTreeMap::new();
            for (p, value) in records {
                let o = &mut offsets[p as usize];
                want.insert((p, *o), value);
                *o += 1;
            }
            let have: BTreeMap<(i32, i64), Vec<u8>> = read
                .into_iter()
                .map(|r| ((r.partition, r.offset), r.value.unwrap_or_default()))
                .collect();
            assert!(have == want, "{hint}");
        }
        Err(e) => panic!("creating topic {name}: {e}"),
    }
}

/// Creates a topic on the shared test broker.
pub async fn create_topic(prefix: &str, partitions: i32) -> String {
    create_topic_on(&brokers(), prefix, partitions).await
}

/// A plain (non-idempotent) producer.
pub fn producer(brokers: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "5")
        .set("message.timeout.ms", "30000")
        .create()
        .unwrap()
}

/// Produces `(partition, value)` records in order and waits for every acknowledgement.
pub async fn produce(topic: &str, records: impl IntoIterator<Item = (i32, Vec<u8>)>) -> usize {
    produce_on(&brokers(), topic, records).await
}

/// As [`produce`], on given brokers.
pub async fn produce_on(
    brokers: &str,
    topic: &str,
    records: impl IntoIterator<Item = (i32, Vec<u8>)>,
) -> usize {
    let p = producer(brokers);
    let mut pending = Vec::new();
    for (partition, value) in records {
        let mut rec: FutureRecord<'_, (), [u8]> =
            FutureRecord::to(topic).partition(partition).payload(&value);
        loop {
            match p.send_result(rec) {
                Ok(f) => {
                    pending.push(f);
                    break;
                }
                Err((rdkafka::error::KafkaError::MessageProduction(_), back)) => {
                    rec = back;
                    // Queue full: wait for the oldest acknowledgement.
                    if let Some(f) = (!pending.is_empty()).then(|| pending.remove(0)) {
                        f.await.unwrap().unwrap();
                    } else {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
                Err((e, _)) => panic!("produce: {e}"),
            }
        }
    }
    let n = pending.len();
    for f in pending {
        f.await.unwrap().unwrap();
    }
    n
}

/// A record read back.
#[derive(Debug, Clone)]
pub struct Read {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
}

/// Reads `expected` records of a topic from the beginning (all partitions), failing after
/// `timeout`. Counting, not the broker's end offsets, decides when all are there.
pub fn read_topic(brokers: &str, topic: &str, expected: usize, timeout: Duration) -> Vec<Read> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "sluice-tests-reader")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "100")
        .create()
        .unwrap();
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in md.topics()[0].partitions() {
        tpl.add_partition_offset(topic, p.id(), Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    while out.len() < expected {
        assert!(
            Instant::now() < deadline,
            "read {} of {expected} records of {topic} before the timeout",
            out.len()
        );
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            let m = m.unwrap();
            out.push(Read {
                partition: m.partition(),
                offset: m.offset(),
                key: m.key().map(<[u8]>::to_vec),
                value: m.payload().map(<[u8]>::to_vec),
                headers: m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                            .collect()
                    })
                    .unwrap_or_default(),
            });
        }
    }
    // Nothing beyond what was expected.
    let extra_deadline = Instant::now() + Duration::from_millis(500);
    while Instant::now() < extra_deadline {
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            let m = m.unwrap();
            panic!(
                "unexpected extra record in {topic}: partition {} offset {}",
                m.partition(),
                m.offset()
            );
        }
    }
    out
}

/// A JSON record of the standard test shape.
pub fn json_record(id: i64) -> Vec<u8> {
    format!(
        r#"{{"id": {id}, "label": {}, "x": [{}, {}, {}, {}]}}"#,
        id % 10,
        id as f32 * 0.5,
        -(id as f32),
        (id % 7) as f32,
        1.0
    )
    .into_bytes()
}

/// The schema of [`json_record`] as YAML.
pub const JSON_SCHEMA: &str = r#"{id: int64, label: int64, x: "float32[4]"}"#;

/// A loopback port nothing listens on (now).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A Tansu broker of the test's own, storing topics in an S3 bucket on the test S3 server, so
/// that its data survives `kill -9`.
pub struct DurableBroker {
    pub port: u16,
    pub bucket: String,
    child: Option<std::process::Child>,
    log: std::path::PathBuf,
}

impl DurableBroker {
    pub fn start(bucket: String, log_dir: &std::path::Path) -> DurableBroker {
        let port = free_port();
        let mut b = DurableBroker {
            port,
            bucket,
            child: None,
            log: log_dir.join("tansu.log"),
        };
        b.restart();
        b
    }

    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts (again) on the same port and storage, and waits until it answers.
    pub fn restart(&mut self) {
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = std::process::Command::new(tansu())
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
                "--storage-engine",
                &format!("s3://{}/", self.bucket),
            ])
            .env("AWS_ENDPOINT", super::s3::endpoint())
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", super::s3::ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", super::s3::SECRET)
            .env("AWS_DEFAULT_REGION", "us-east-1")
            .env("AWS_REGION", "us-east-1")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = std::process::Command::new(tansu())
                .args(["topic", "list", "--broker", &url])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "durable broker did not start: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `kill -9`.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }
}

impl Drop for DurableBroker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The offsets a consumer group has committed, per partition.
pub fn committed(topic: &str, group: &str, partitions: i32) -> BTreeMap<i32, i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let got = c.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
    got.elements()
        .iter()
        .map(|e| {
            let o = match e.offset() {
                Offset::Offset(o) => o,
                _ => 0,
            };
            (e.partition(), o)
        })
        .collect()
}
