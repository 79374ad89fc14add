//! The data side's resumable state: how far each source has been *durably* consumed.
//!
//! A consumer of the stream (the `sluice` job, or a user's training loop) reports every batch
//! it has handed off with [`Acknowledger::observe`], and calls [`Acknowledger::commit`] once
//! those rows are durable (the sink flushed, the checkpoint written). `commit` returns the
//! [`SourceState`] to store in a checkpoint and, for Kafka consumer groups, stores the offsets
//! with the group. Positions are derived from lineage, so they are exact per partition.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};

use crate::batch::{Batch, Lineage, Mark, Origin};

/// Where to resume one Kafka partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Position {
    /// The next message to read.
    pub offset: i64,
    /// Rows of that message already delivered (messages holding many rows: `arrow_ipc`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skip_rows: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// Positions of Kafka partitions: topic → partition → position.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaPositions(pub BTreeMap<String, BTreeMap<i32, Position>>);

/// A Kafka lineage span as positions: topic, partition, its first row and just past its last
/// row (`None` for other origins).
pub(crate) fn kafka_span(s: &crate::batch::LineageSpan) -> Option<(&str, i32, Position, Position)> {
    let at = |offset: i64, skip_rows: u64| Position { offset, skip_rows };
    match &s.origin {
        Origin::Kafka { topic, partition } => Some((
            topic,
            *partition,
            at(s.first as i64, 0),
            at((s.first + s.len) as i64, 0),
        )),
        Origin::KafkaMessage {
            topic,
            partition,
            offset,
            rows,
        } => {
            let done = s.first + s.len;
            let past = match done >= *rows {
                true => at(offset + 1, 0),
                false => at(*offset, done),
            };
            Some((topic, *partition, at(*offset, s.first), past))
        }
        Origin::Object { .. } => None,
    }
}

impl KafkaPositions {
    /// Advances positions past every Kafka row of `lineage`.
    pub fn observe(&mut self, lineage: &Lineage) {
        for s in lineage.spans() {
            let Some((topic, partition, _, pos)) = kafka_span(s) else {
                continue;
            };
            // The topic's map exists after its first span: no key allocated per span.
            let partitions = match self.0.get_mut(topic) {
                Some(ps) => ps,
                None => self.0.entry(topic.to_string()).or_default(),
            };
            let slot = partitions.entry(partition).or_insert(pos);
            if pos > *slot {
                *slot = pos;
            }
        }
    }

    /// The position of one partition, if any row of it was observed (or restored).
    pub fn get(&self, topic: &str, partition: i32) -> Option<Position> {
        self.0.get(topic).and_then(|p| p.get(&partition)).copied()
    }

    /// Every `(topic, partition, position)`.
    pub fn iter(&self) -> impl Iterator<Item = (&str, i32, Position)> {
        self.0
            .iter()
            .flat_map(|(t, ps)| ps.iter().map(move |(p, pos)| (t.as_str(), *p, *pos)))
    }

    /// Sets the position of one partition.
    pub fn set(&mut self, topic: &str, partition: i32, position: Position) {
        self.0
            .entry(topic.to_string())
            .or_default()
            .insert(partition, position);
    }
}

/// A shuffle window over a Kafka stream: the rows it holds, as positions. Its rows of each
/// partition are consecutive there (a window takes the stream's rows in arrival order, and
/// each partition arrives in offset order), so they are the rows from `starts` up to
/// `ends`; reading those again rebuilds the window exactly, whatever order the partitions
/// arrive in (the window is permuted from its rows sorted by partition and position).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaWindow {
    /// Index of the window since the stream began (it keys the window's permutation).
    pub window: u64,
    /// Rows it holds.
    pub rows: u64,
    /// Position of its first row in each partition it has rows of.
    pub starts: KafkaPositions,
    /// Just past every row taken into this window and the ones before it, per partition:
    /// where the source continues after rebuilding the window.
    pub ends: KafkaPositions,
}

/// Position in the output of a Kafka-fed shuffle: a window and how many of its (permuted)
/// rows come before. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaMark {
    /// The window being emitted.
    pub window: Arc<KafkaWindow>,
    /// Rows of it before this position.
    pub emitted: u64,
}

/// The state of a Kafka-fed shuffle (see [`SourceState::kafka_shuffle`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaShuffleState {
    /// Index of the window being emitted.
    pub window: u64,
    /// Rows it holds (0: none is being emitted; the next one is `window`).
    pub rows: u64,
    /// Rows of it already delivered.
    pub emitted: u64,
    /// Position of its first row in each partition it has rows of; its rows there end at
    /// [`SourceState::kafka`].
    #[serde(default)]
    pub starts: KafkaPositions,
}

impl KafkaMark {
    /// The state at this position.
    pub(crate) fn state(&self) -> KafkaShuffleState {
        if self.emitted >= self.window.rows {
            return KafkaShuffleState {
                window: self.window.window + 1,
                rows: 0,
                emitted: 0,
                starts: KafkaPositions::default(),
            };
        }
        KafkaShuffleState {
            window: self.window.window,
            rows: self.window.rows,
            emitted: self.emitted,
            starts: self.window.starts.clone(),
        }
    }
}

/// Where [`SourceState::next_epoch`] continues a Parquet pipeline whose ranks were
/// interrupted, on any number of ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextEpoch {
    /// The state to give every new rank.
    pub state: SourceState,
    /// The epoch the interrupted ranks were in, whose remaining rows are not read (`None`:
    /// no rank had delivered anything, so nothing is passed over).
    pub interrupted: Option<u64>,
}

impl SourceState {
    /// For a Parquet pipeline interrupted on some number of ranks (`states`, one per rank):
    /// a state at the start of the epoch after the latest one any rank was in. A position at
    /// the start of an epoch means the same rows under any plan (no rank had read any of
    /// it), so it resumes on any number of ranks, with any shard policy or shuffle — at the
    /// cost of the interrupted epoch's remaining rows, which the caller must report. (A
    /// position inside an epoch means rows only under the plan it was taken in.)
    pub fn next_epoch(states: &[SourceState]) -> Result<NextEpoch, String> {
        if states
            .iter()
            .any(|s| s.kafka.is_some() || s.kafka_shuffle.is_some())
        {
            return Err(
                "a Kafka stream's positions are per partition; resume it on as many ranks as wrote them".into(),
            );
        }
        let interrupted = states
            .iter()
            .filter_map(|s| s.parquet)
            .map(|m| m.epoch)
            .max();
        // The files are the same ones: keep their stamp, leave the settings (they may change).
        let plan = states
            .iter()
            .find_map(|s| s.plan.clone())
            .map(|p| PlanStamp {
                data: p.data.filter(|d| !d.prefix),
                order: BTreeMap::new(),
                form: ORDER_FORM,
            });
        Ok(NextEpoch {
            state: SourceState {
                parquet: Some(Mark::start_of(interrupted.map_or(0, |e| e + 1))),
                plan,
                ..SourceState::default()
            },
            interrupted,
        })
    }
}

/// A resumable position of the pipeline's source.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceState {
    /// Kafka partitions (static assignment resumes from here). Past a `shuffle`: just past
    /// every row taken into the window being emitted and the ones before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka: Option<KafkaPositions>,
    /// Past a `shuffle` of a Kafka stream: the window being emitted (rebuilt on resume by
    /// reading its rows again, from its `starts` up to `kafka`) and the rows of it already
    /// delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka_shuffle: Option<KafkaShuffleState>,
    /// Where a Parquet pipeline continues: epoch, unit, row, rows to skip and, past a
    /// shuffle, the window position. Shuffle windows and augmentation draws are pure
    /// functions of the seed and row identity, so this is all that is needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parquet: Option<Mark>,
    /// What `parquet` is relative to: the files and the order-deciding settings. Resuming a
    /// pipeline whose plan differs is refused (see [`PlanStamp`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanStamp>,
    /// Kafka: the records below `kafka` and how many of them could not be decoded — what the
    /// source's `error_budget` has spent, carried into a resumed run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka_errors: Option<ErrorCounts>,
    /// Resumed on another number of ranks mid-epoch: the batches of the interrupted epoch
    /// this rank delivers first (see [`Rescaled`]); `parquet` is unset meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescaled: Option<Box<Rescaled>>,
}

/// The rest of an epoch interrupted on some number of ranks, continued on another number
/// (made by `Pipeline::rescale`): the batches every old rank still owed in that epoch,
/// dealt out in contiguous runs — so each is delivered exactly once, exactly as its old rank
/// would have made it (same rows, order, augmentation) — then every new rank continues at
/// the start of the next epoch under the new split.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rescaled {
    /// The old ranks' states (index = old rank), which the runs count from.
    pub from: Vec<SourceState>,
    /// The runs of old ranks' batches this rank delivers, in order.
    pub runs: Vec<BatchRun>,
    /// Batches every new rank delivers before the next epoch: a rank whose runs hold fewer
    /// ends with empty batches (no rows), so all take the same number of steps.
    pub batches: u64,
    /// Of those, already delivered.
    pub delivered: u64,
    /// Where this rank continues afterwards: the start of the next epoch.
    pub then: Mark,
}

/// Batches `first..end` of what old rank `rank` delivers after its state in
/// [`Rescaled::from`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchRun {
    pub rank: usize,
    pub first: u64,
    pub end: u64,
}

impl Rescaled {
    /// The runs not yet delivered.
    pub(crate) fn remaining(&self) -> Vec<BatchRun> {
        let mut skip = self.delivered;
        let mut out = Vec::new();
        for r in &self.runs {
            let n = r.end - r.first;
            if skip >= n {
                skip -= n;
                continue;
            }
            out.push(BatchRun {
                first: r.first + skip,
                ..*r
            });
            skip = 0;
        }
        out
    }

    /// Deals `runs` (in order) to `world` ranks: contiguous shares, as equal as they can be
    /// (the first ones a batch longer when they do not divide evenly).
    pub(crate) fn deal(
        from: Vec<SourceState>,
        runs: &[BatchRun],
        world: usize,
        then: Mark,
    ) -> Vec<Rescaled> {
        let total: u64 = runs.iter().map(|r| r.end - r.first).sum();
        let w = world as u64;
        let mut left: Vec<BatchRun> = runs.iter().rev().copied().collect();
        (0..w)
            .map(|j| {
                let mut want = total / w + u64::from(j < total % w);
                let mut mine = Vec::new();
                while want > 0 {
                    let Some(r) = left.last_mut() else { break };
                    let take = want.min(r.end - r.first);
                    mine.push(BatchRun {
                        end: r.first + take,
                        ..*r
                    });
                    r.first += take;
                    want -= take;
                    if r.first == r.end {
                        left.pop();
                    }
                }
                Rescaled {
                    from: from.clone(),
                    runs: mine,
                    batches: total.div_ceil(w),
                    delivered: 0,
                    then,
                }
            })
            .collect()
    }
}

/// Records a Kafka source consumed, and how many of them could not be decoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorCounts {
    /// Records (messages) consumed, good and bad.
    pub records: u64,
    /// Records that could not be decoded (dead-lettered).
    pub bad: u64,
}

/// Consecutive offsets `first..first + len` of one partition, all decoded or all bad.
#[derive(Debug, Clone, Copy)]
struct Run {
    first: i64,
    len: u64,
    bad: bool,
}

impl Run {
    /// How many of its records lie below offset `end`.
    fn below(&self, end: i64) -> u64 {
        ((end - self.first).max(0) as u64).min(self.len)
    }
}

impl ErrorCounts {
    /// Adds `n` records, all bad or all decoded.
    fn add(&mut self, n: u64, bad: bool) {
        self.records += n;
        if bad {
            self.bad += n;
        }
    }
}

/// The error budget's counts of a Kafka source, to be split at the positions of a state:
/// `base` counts the records under every position any acknowledger sharing the ledger has
/// taken a state at (and what a restored state carried), `pending` the records counted
/// since, per partition, as runs of consecutive offsets (a partition's records arrive in
/// offset order; a gap, from compaction or transaction markers, starts a new run, so the
/// split at a position is exact). Runs below every sharer's last state are folded into
/// `base`, so `pending` holds about the records in flight.
#[derive(Debug, Default)]
struct ErrorLedger {
    base: ErrorCounts,
    /// Set once a Kafka source counted anything or a state carried counts.
    used: bool,
    pending: BTreeMap<(Arc<str>, i32), VecDeque<Run>>,
    /// Per sharer, the positions of its last state (`None`: it has taken none).
    seen: Vec<Option<KafkaPositions>>,
}

impl ErrorLedger {
    /// Adds `run` of `topic`/`partition` (after every earlier offset of the partition).
    fn consumed(&mut self, topic: &Arc<str>, partition: i32, run: Run) {
        self.used = true;
        let runs = self.pending.entry((topic.clone(), partition)).or_default();
        match runs.back_mut() {
            Some(r) if r.bad == run.bad && r.first + r.len as i64 == run.first => {
                r.len += run.len;
            }
            _ => runs.push_back(run),
        }
    }

    /// The counts below `positions`, for sharer `who`.
    fn count(&mut self, who: usize, positions: &KafkaPositions) -> ErrorCounts {
        let mut c = self.base;
        for ((topic, partition), runs) in &self.pending {
            let Some(end) = positions.get(topic, *partition).map(|p| p.offset) else {
                continue;
            };
            // Every run (not up to the first past `end`): runs are not assumed sorted.
            for r in runs {
                c.add(r.below(end), r.bad);
            }
        }
        if let Some(slot) = self.seen.get_mut(who) {
            *slot = Some(positions.clone());
        }
        self.fold();
        c
    }

    /// Folds the runs below every sharer's last state into `base`.
    fn fold(&mut self) {
        let seen: Vec<&KafkaPositions> = self.seen.iter().flatten().collect();
        if seen.is_empty() {
            return;
        }
        for ((topic, partition), runs) in &mut self.pending {
            let Some(end) = seen
                .iter()
                .map(|s| s.get(topic, *partition).map_or(i64::MIN, |p| p.offset))
                .min()
            else {
                continue;
            };
            while let Some(r) = runs.front_mut() {
                let n = r.below(end);
                if n == 0 {
                    break;
                }
                self.base.add(n, r.bad);
                r.first += n as i64;
                r.len -= n;
                if r.len > 0 {
                    break;
                }
                runs.pop_front();
            }
        }
    }
}

/// What the positions of a Parquet pipeline ([`Mark`]: epoch, unit, row, shuffle window) are
/// relative to: the files, and the settings that decide which rows come in which order. A
/// position restored into a pipeline with another plan would point at other rows (rows lost
/// or repeated), so [`crate::Pipeline::prepare`] refuses it and says what changed.
///
/// Settings that do not move rows are left out, so they can change between runs: threads,
/// queues, prefetch, storage options and where the files live, the number of epochs, batch
/// size, and stages after the last `shuffle` that keep every row (augmentation, `select`, …).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanStamp {
    /// The files: all of them once every footer has been read, or (reading in listing order)
    /// those up to the position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<DataStamp>,
    /// The order-deciding settings by what they belong to (`rank`, `source`,
    /// `stages[0] (shuffle)`): short text, or (form 2) canonical JSON of a config's effective
    /// values, or (form 1) a hash of its `Debug` text.
    #[serde(default)]
    pub order: BTreeMap<String, String>,
    /// The form of `order`'s values: 1 (absent: Sluice 0.1.0) hashed stage configs' `Debug`
    /// text, 2 keeps canonical JSON ([`ORDER_FORM`]).
    #[serde(default = "first_form")]
    pub form: u32,
}

/// The form of [`PlanStamp::order`] this Sluice writes: 2, canonical JSON of the effective
/// settings, compared field by field (`exec/stamp.rs`).
pub const ORDER_FORM: u32 = 2;

fn first_form() -> u32 {
    1
}

impl Default for PlanStamp {
    fn default() -> Self {
        PlanStamp {
            data: None,
            order: BTreeMap::new(),
            form: ORDER_FORM,
        }
    }
}

/// The files a Parquet pipeline reads: how many, their rows, and a hash of their paths
/// (relative to the first file's directory, so a copy elsewhere matches) and row-group sizes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataStamp {
    /// Files.
    pub files: u64,
    /// Rows in one epoch (all ranks).
    pub rows: u64,
    /// Hash of the relative paths and row-group sizes, in reading order.
    pub hash: String,
    /// Only the files up to the position were stamped (a pipeline reading in listing order,
    /// where files after the position do not move it).
    #[serde(default, skip_serializing_if = "is_false")]
    pub prefix: bool,
    /// With a `mix`: the rows of each `path` entry (the datasets an epoch's shares are taken
    /// from), so the epoch can be counted from the state and the config alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entries: Vec<u64>,
}

fn is_false(v: &bool) -> bool {
    !*v
}

impl PlanStamp {
    /// What differs between the plan a state was taken under (`self`) and the plan of the
    /// pipeline resuming it (`now`), in words; empty when the positions still mean the same
    /// rows. Files are compared only when both sides stamped them the same way.
    pub fn differences(&self, now: &PlanStamp) -> Vec<String> {
        let mut out = self.data_differences(now);
        self.order_differences(now, &mut out);
        out
    }

    /// [`PlanStamp::differences`] in the files alone: what matters to a position at the start
    /// of an epoch, which no setting moves.
    pub fn data_differences(&self, now: &PlanStamp) -> Vec<String> {
        let mut out = Vec::new();
        if let (Some(a), Some(b)) = (&self.data, &now.data)
            && a.prefix == b.prefix
            && a != b
        {
            let what = if a.prefix {
                "the files up to the position"
            } else {
                "the files"
            };
            out.push(if (a.files, a.rows) == (b.files, b.rows) {
                format!(
                    "{what}: as many ({}, {} rows) but with other paths or row groups",
                    a.files, a.rows
                )
            } else {
                format!(
                    "{what}: {} file(s) with {} rows then, {} file(s) with {} rows now",
                    a.files, a.rows, b.files, b.rows
                )
            });
        }
        out
    }

    fn order_differences(&self, now: &PlanStamp, out: &mut Vec<String>) {
        let keys: BTreeSet<&String> = self.order.keys().chain(now.order.keys()).collect();
        // Stages in pipeline order (`stages[2]` before `stages[10]`), after the rest.
        let mut keys: Vec<&String> = keys.into_iter().collect();
        keys.sort_by_key(|k| {
            let index = k
                .strip_prefix("stages[")
                .and_then(|r| r.split(']').next())
                .and_then(|i| i.parse::<usize>().ok());
            (index.is_some(), index, k.as_str())
        });
        for k in keys {
            match (self.order.get(k), now.order.get(k)) {
                (Some(a), Some(b)) if a == b => {}
                (Some(a), Some(b)) => match changed_fields(a, b) {
                    // Equal objects written in another key order are the same settings.
                    Some((x, y)) if x.is_empty() && y.is_empty() => {}
                    Some((x, y)) => out.push(format!("{k}: {x} then, {y} now")),
                    None if !is_hash(a) && !is_hash(b) => {
                        let (x, y) = changed_parts(a, b);
                        out.push(format!("{k}: {x} then, {y} now"));
                    }
                    None => out.push(format!("{k}: its settings changed")),
                },
                (Some(_), None) => out.push(format!("{k}: there then, not now")),
                (None, Some(_)) => out.push(format!("{k}: not there then")),
                (None, None) => {}
            }
        }
    }
}

/// The `, `-separated parts of two settings texts that differ (the whole texts when their
/// parts do not line up).
fn changed_parts(a: &str, b: &str) -> (String, String) {
    let (pa, pb): (Vec<&str>, Vec<&str>) = (a.split(", ").collect(), b.split(", ").collect());
    if pa.len() != pb.len() {
        return (a.to_string(), b.to_string());
    }
    let (da, db): (Vec<&str>, Vec<&str>) = pa.iter().zip(&pb).filter(|(x, y)| x != y).unzip();
    (da.join(", "), db.join(", "))
}

/// The fields that differ between two stamped configs (form 2: JSON objects), as `name value`
/// lists; `None` when they are not both objects. Equal objects (keys in another order) give
/// two empty lists.
fn changed_fields(a: &str, b: &str) -> Option<(String, String)> {
    let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) = (
        serde_json::from_str::<serde_json::Value>(a),
        serde_json::from_str::<serde_json::Value>(b),
    ) else {
        return None;
    };
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let show = |m: &serde_json::Map<String, serde_json::Value>, k: &str| match m.get(k) {
        Some(v) => format!("{k} {v}"),
        None => format!("{k} not set"),
    };
    let (then, now): (Vec<String>, Vec<String>) = keys
        .into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| (show(&a, k), show(&b, k)))
        .unzip();
    Some((then.join(", "), now.join(", ")))
}

const HASH_PREFIX: &str = "fnv:";

fn is_hash(v: &str) -> bool {
    v.starts_with(HASH_PREFIX)
}

/// FNV-1a, 64 bits: stable across platforms and Rust releases (unlike `std`'s hasher), for
/// augmentation identities and plan stamps.
pub(crate) fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The FNV-1a offset basis.
pub(crate) const FNV_BASIS: u64 = 0xcbf2_9ce4_8422_2325;

/// A short, stable hash of a setting's text, as stored in [`PlanStamp::order`].
pub(crate) fn setting_hash(text: &str) -> String {
    format!("{HASH_PREFIX}{:016x}", fnv1a(text.as_bytes(), FNV_BASIS))
}

/// Where an [`Acknowledger`] gets the plan its states are relative to: the settings, known
/// when the pipeline is prepared, and the files, known once every footer is read (looked up
/// until then, then kept).
pub(crate) struct PlanSource {
    order: BTreeMap<String, String>,
    data: OnceLock<DataStamp>,
    probe: Box<DataProbe>,
}

/// Stamps the files a position is relative to, if they are known yet.
type DataProbe = dyn Fn(Option<&Mark>) -> Option<DataStamp> + Send + Sync;

impl std::fmt::Debug for PlanSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanSource")
            .field("order", &self.order)
            .field("data", &self.data.get())
            .finish_non_exhaustive()
    }
}

impl PlanSource {
    pub(crate) fn new(
        order: BTreeMap<String, String>,
        probe: impl Fn(Option<&Mark>) -> Option<DataStamp> + Send + Sync + 'static,
    ) -> Self {
        PlanSource {
            order,
            data: OnceLock::new(),
            probe: Box::new(probe),
        }
    }

    /// The plan of position `mark`, as far as it is known now (a stamp of every file is
    /// kept once known; a prefix depends on the position).
    pub(crate) fn stamp(&self, mark: Option<&Mark>) -> PlanStamp {
        let data = match self.data.get() {
            Some(d) => Some(d.clone()),
            None => (self.probe)(mark).map(|d| match d.prefix {
                true => d,
                false => self.data.get_or_init(|| d).clone(),
            }),
        };
        PlanStamp {
            data,
            order: self.order.clone(),
            form: ORDER_FORM,
        }
    }
}

/// The value behind one of the [`Acknowledger`]'s locks. One rule for all of them: a lock
/// poisoned by a thread that panicked while holding it ends this thread too, loudly. Its
/// value may be half-updated, and a position taken from it (or the empty one a default would
/// give) would make the next checkpoint resume at other rows; stopping leaves the last
/// checkpoint as the position to resume from.
fn held<T>(lock: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match lock.lock() {
        Ok(guard) => guard,
        // The panic that poisoned it was reported where it happened; this one says why the
        // run cannot go on.
        #[allow(clippy::panic)]
        Err(_) => panic!(
            "internal error: a thread panicked while it updated the source position; stopping without recording a position (the last checkpoint is the one to resume from). Please report it"
        ),
    }
}

/// Stores offsets with a Kafka consumer group (set by a `group` source once it is open).
pub(crate) trait OffsetStore: Send + Sync + std::fmt::Debug {
    /// Stores (and, at the end of a run, commits synchronously) these positions.
    fn store(&self, positions: &KafkaPositions, final_commit: bool);
}

/// Tracks what the consumer of a stream has handed off and made durable. Cheap to share.
#[derive(Debug)]
pub struct Acknowledger {
    written: Mutex<KafkaPositions>,
    mark: Mutex<Option<Mark>>,
    /// Past a Kafka-fed shuffle: the window position just past the last observed batch.
    window: Mutex<Option<KafkaShuffleState>>,
    store: OnceLock<Arc<dyn OffsetStore>>,
    plan: OnceLock<Arc<PlanSource>>,
    /// The plan of the state this one was restored from, until the pipeline sets its own.
    resumed_plan: Option<PlanStamp>,
    /// The Kafka error budget's counts, shared with the acknowledgers that follow this one
    /// ([`Acknowledger::follower`]), and this one's place among them.
    errors: Arc<Mutex<ErrorLedger>>,
    errors_slot: usize,
}

impl Default for Acknowledger {
    fn default() -> Self {
        Acknowledger::new(None)
    }
}

impl Acknowledger {
    /// Starts from a restored state (or nothing).
    pub fn new(resume: Option<&SourceState>) -> Self {
        Acknowledger {
            written: Mutex::new(resume.and_then(|s| s.kafka.clone()).unwrap_or_default()),
            mark: Mutex::new(resume.and_then(|s| s.parquet)),
            window: Mutex::new(resume.and_then(|s| s.kafka_shuffle.clone())),
            store: OnceLock::new(),
            plan: OnceLock::new(),
            resumed_plan: resume.and_then(|s| s.plan.clone()),
            errors: Arc::new(Mutex::new(ErrorLedger {
                base: resume.and_then(|s| s.kafka_errors).unwrap_or_default(),
                used: resume.is_some_and(|s| s.kafka_errors.is_some()),
                pending: BTreeMap::new(),
                seen: vec![None],
            })),
            errors_slot: 0,
        }
    }

    /// Another acknowledger of the same stream, starting from `resume` (another consumer's
    /// view: what the stream yielded, say, where this one tracks what a sink made durable).
    /// It shares the error budget's counts the source reports here.
    pub(crate) fn follower(&self, resume: Option<&SourceState>) -> Acknowledger {
        let mut a = Acknowledger::new(resume);
        a.errors = self.errors.clone();
        a.errors_slot = {
            let mut l = held(&self.errors);
            l.seen.push(None);
            l.seen.len() - 1
        };
        a
    }

    /// The error budget's counts a resumed run starts from (zero without a state).
    pub(crate) fn restored_errors(&self) -> ErrorCounts {
        held(&self.errors).base
    }

    /// Records that a Kafka source counted these records (`(topic, partition, offset,
    /// bad)`, each partition's in offset order) against its error budget; returns how many.
    pub(crate) fn consumed<'a>(
        &self,
        records: impl Iterator<Item = (&'a Arc<str>, i32, i64, bool)>,
    ) -> u64 {
        let mut l = held(&self.errors);
        let mut n = 0;
        // Consecutive records of a partition go in as one run (one lookup per run).
        let mut open: Option<(&Arc<str>, i32, Run)> = None;
        for (topic, partition, offset, bad) in records {
            n += 1;
            if let Some((t, p, r)) = &mut open
                && Arc::ptr_eq(t, topic)
                && *p == partition
                && r.bad == bad
                && r.first + r.len as i64 == offset
            {
                r.len += 1;
                continue;
            }
            if let Some((t, p, r)) = open.take() {
                l.consumed(t, p, r);
            }
            let run = Run {
                first: offset,
                len: 1,
                bad,
            };
            open = Some((topic, partition, run));
        }
        if let Some((t, p, r)) = open {
            l.consumed(t, p, r);
        }
        n
    }

    /// Sets what the states this acknowledger returns are relative to (once).
    pub(crate) fn set_plan(&self, plan: Arc<PlanSource>) {
        let _ = self.plan.set(plan);
    }

    pub(crate) fn plan(&self) -> Option<Arc<PlanSource>> {
        self.plan.get().cloned()
    }

    pub(crate) fn set_store(&self, store: Arc<dyn OffsetStore>) {
        let _ = self.store.set(store);
    }

    /// Records that the rows of `lineage` have been handed off (written to the sink).
    pub fn observe(&self, lineage: &Lineage) {
        held(&self.written).observe(lineage);
    }

    /// Records that `batch` has been handed off: its Kafka rows (by lineage) and, for a
    /// Parquet pipeline, the position just past it. Batches must be observed in stream order.
    pub fn observe_batch(&self, batch: &Batch) {
        if let Some(k) = &batch.kafka_mark {
            // Past a shuffle the rows come permuted: the positions are the window's.
            let end = KafkaMark {
                window: k.window.clone(),
                emitted: k.emitted + batch.stream_rows(),
            };
            *held(&self.written) = k.window.ends.clone();
            *held(&self.window) = Some(end.state());
            return;
        }
        self.observe(&batch.lineage);
        if let Some(end) = batch.end_mark() {
            *held(&self.mark) = Some(end);
        }
    }

    /// The positions just past everything observed so far: what a checkpoint records once
    /// those rows are durable.
    pub fn state(&self) -> SourceState {
        self.state_as(self.errors_slot)
    }

    /// [`Acknowledger::state`] without taking part in when the error counts are folded: the
    /// state a follower starts from.
    pub(crate) fn peek_state(&self) -> SourceState {
        self.state_as(usize::MAX)
    }

    fn state_as(&self, slot: usize) -> SourceState {
        let positions = held(&self.written).clone();
        let parquet = *held(&self.mark);
        let kafka_errors = {
            let mut l = held(&self.errors);
            l.used.then(|| l.count(slot, &positions))
        };
        SourceState {
            kafka_errors,
            kafka: (!positions.0.is_empty()).then_some(positions),
            kafka_shuffle: held(&self.window).clone(),
            parquet,
            plan: match self.plan.get() {
                Some(p) => Some(p.stamp(parquet.as_ref())),
                None => self.resumed_plan.clone(),
            },
            rescaled: None,
        }
    }

    /// Declares `state` durable (its rows written, its checkpoint stored): stores the offsets
    /// with the consumer group, if any. `final_commit` commits synchronously (end of run).
    pub fn store(&self, state: &SourceState, final_commit: bool) {
        if let (Some(store), Some(k)) = (self.store.get(), &state.kafka) {
            // Rows of a shuffle window still being emitted are not consumed yet.
            let mut k = k.clone();
            for (t, p, start) in state.kafka_shuffle.iter().flat_map(|s| s.starts.iter()) {
                k.set(t, p, start);
            }
            store.store(&k, final_commit);
        }
    }

    /// [`Acknowledger::state`] then [`Acknowledger::store`]: everything observed is durable.
    pub fn commit(&self, final_commit: bool) -> SourceState {
        let state = self.state();
        self.store(&state, final_commit);
        state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lock poisoned by a panicking thread never turns into "no position": taking the
    /// state then fails loudly instead of recording an empty one.
    #[test]
    #[should_panic(expected = "stopping without recording a position")]
    fn a_poisoned_position_fails_loudly() {
        let acker = Arc::new(Acknowledger::new(None));
        let poisoner = acker.clone();
        let _ = std::thread::spawn(move || {
            let _guard = poisoner.mark.lock().unwrap();
            panic!("poison the lock");
        })
        .join();
        let _ = acker.state();
    }
    use crate::batch::{LineageSpan, Name};

    /// The epoch after the latest one any rank was in, at its start; the files' stamp kept
    /// and the settings' dropped; nothing passed over when no rank had delivered a batch; a
    /// Kafka state refused.
    #[test]
    fn next_epoch_starts_after_the_latest_interrupted_epoch() {
        let at = |epoch: u64, unit: u64| SourceState {
            parquet: Some(Mark {
                unit,
                skip: 5,
                ..Mark::start_of(epoch)
            }),
            plan: Some(PlanStamp {
                data: Some(DataStamp {
                    entries: Vec::new(),
                    files: 2,
                    rows: 100,
                    hash: "h".into(),
                    prefix: false,
                }),
                order: BTreeMap::from([("rank".to_string(), "0 of 2".to_string())]),
                form: ORDER_FORM,
            }),
            ..SourceState::default()
        };
        let next = SourceState::next_epoch(&[at(3, 1), at(4, 0), SourceState::default()]).unwrap();
        assert_eq!(next.interrupted, Some(4));
        let mark = next.state.parquet.unwrap();
        assert_eq!(mark, Mark::start_of(5));
        assert!(mark.is_epoch_start() && !at(4, 0).parquet.unwrap().is_epoch_start());
        let plan = next.state.plan.unwrap();
        assert!(plan.order.is_empty());
        assert_eq!(plan.data.unwrap().rows, 100);

        let fresh = SourceState::next_epoch(&vec![SourceState::default(); 2]).unwrap();
        assert_eq!(fresh.interrupted, None);
        assert_eq!(fresh.state.parquet, Some(Mark::start_of(0)));

        let kafka = SourceState {
            kafka: Some(KafkaPositions::default()),
            ..SourceState::default()
        };
        assert!(
            SourceState::next_epoch(&[kafka])
                .unwrap_err()
                .contains("Kafka")
        );
    }

    #[test]
    fn plan_differences_name_what_changed() {
        let stamp = |data: Option<(u64, u64, &str)>, order: &[(&str, &str)]| PlanStamp {
            data: data.map(|(files, rows, hash)| DataStamp {
                entries: Vec::new(),
                files,
                rows,
                hash: hash.into(),
                prefix: false,
            }),
            order: order
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            form: ORDER_FORM,
        };
        let hashed = setting_hash("Filter(..)");
        let then = stamp(
            Some((3, 100, "a")),
            &[
                ("rank", "0 of 2"),
                ("stages[0] (filter)", &hashed),
                (
                    "stages[1] (shuffle)",
                    "buffer_rows 10, max_memory 1 MiB, seed 1",
                ),
            ],
        );
        assert!(then.differences(&then.clone()).is_empty());
        // Files unknown on one side are not compared.
        let mut unknown = then.clone();
        unknown.data = None;
        assert!(then.differences(&unknown).is_empty());
        let now = stamp(
            Some((3, 100, "b")),
            &[
                ("rank", "1 of 2"),
                ("stages[0] (filter)", &setting_hash("Filter(...)")),
                (
                    "stages[1] (shuffle)",
                    "buffer_rows 10, max_memory 1 MiB, seed 2",
                ),
                ("stages[2] (filter)", &hashed),
            ],
        );
        assert_eq!(
            then.differences(&now),
            [
                "the files: as many (3, 100 rows) but with other paths or row groups",
                "rank: 0 of 2 then, 1 of 2 now",
                "stages[0] (filter): its settings changed",
                "stages[1] (shuffle): seed 1 then, seed 2 now",
                "stages[2] (filter): not there then",
            ]
        );
        let wide = stamp(
            None,
            &[("stages[10] (filter)", "a"), ("stages[2] (filter)", "a")],
        );
        let wider = stamp(
            None,
            &[("stages[10] (filter)", "b"), ("stages[2] (filter)", "b")],
        );
        assert_eq!(
            wide.differences(&wider),
            [
                "stages[2] (filter): a then, b now",
                "stages[10] (filter): a then, b now"
            ]
        );
        assert_eq!(
            now.differences(&stamp(Some((4, 120, "b")), &[])),
            [
                "the files: 3 file(s) with 100 rows then, 4 file(s) with 120 rows now",
                "rank: there then, not now",
                "stages[0] (filter): there then, not now",
                "stages[1] (shuffle): there then, not now",
                "stages[2] (filter): there then, not now",
            ]
        );
    }

    #[test]
    fn a_restored_plan_is_kept_until_the_pipeline_sets_its_own() {
        let plan = PlanStamp {
            data: None,
            order: [("rank".to_string(), "0 of 1".to_string())].into(),
            form: ORDER_FORM,
        };
        let acker = Acknowledger::new(Some(&SourceState {
            plan: Some(plan.clone()),
            ..SourceState::default()
        }));
        assert_eq!(acker.state().plan, Some(plan));
        acker.set_plan(Arc::new(PlanSource::new(BTreeMap::new(), |_| {
            Some(DataStamp {
                entries: Vec::new(),
                files: 1,
                rows: 2,
                hash: "h".into(),
                prefix: false,
            })
        })));
        let now = acker.state().plan.unwrap();
        assert!(now.order.is_empty());
        assert_eq!(now.data.unwrap().rows, 2);
    }

    #[test]
    fn positions_follow_lineage_and_partial_messages() {
        let t = Name::from("t");
        let mut l = Lineage::new(
            Origin::Kafka {
                topic: t,
                partition: 0,
            },
            10,
            5,
            0,
        );
        l.push(LineageSpan {
            origin: Origin::KafkaMessage {
                topic: t,
                partition: 1,
                offset: 7,
                rows: 100,
            },
            first: 0,
            len: 40,
            epoch: 0,
        });
        let mut p = KafkaPositions::default();
        p.observe(&l);
        assert_eq!(
            p.get("t", 0),
            Some(Position {
                offset: 15,
                skip_rows: 0
            })
        );
        assert_eq!(
            p.get("t", 1),
            Some(Position {
                offset: 7,
                skip_rows: 40
            })
        );
        let rest = Lineage::new(
            Origin::KafkaMessage {
                topic: t,
                partition: 1,
                offset: 7,
                rows: 100,
            },
            40,
            60,
            0,
        );
        p.observe(&rest);
        assert_eq!(
            p.get("t", 1),
            Some(Position {
                offset: 8,
                skip_rows: 0
            })
        );
        let json = serde_json::to_string(&SourceState {
            kafka: Some(p.clone()),
            kafka_shuffle: None,
            parquet: None,
            plan: None,
            kafka_errors: None,
            rescaled: None,
        })
        .unwrap();
        let back: SourceState = serde_json::from_str(&json).unwrap();
        assert_eq!(back.kafka, Some(p));
    }

    /// 3 old ranks owing 5 batches each, dealt to 2 then 4 ranks: contiguous runs in order,
    /// shares as equal as can be, everything once; what is left after some are delivered is
    /// dealt out again the same way.
    #[test]
    fn owed_batches_are_dealt_in_contiguous_equal_shares() {
        let runs: Vec<BatchRun> = (0..3)
            .map(|rank| BatchRun {
                rank,
                first: 0,
                end: 5,
            })
            .collect();
        let run = |rank, first, end| BatchRun { rank, first, end };
        let two = Rescaled::deal(Vec::new(), &runs, 2, Mark::start_of(1));
        assert_eq!(two[0].runs, [run(0, 0, 5), run(1, 0, 3)]);
        assert_eq!(two[1].runs, [run(1, 3, 5), run(2, 0, 5)]);
        assert!(two.iter().all(|r| r.batches == 8));
        let four = Rescaled::deal(Vec::new(), &runs, 4, Mark::start_of(1));
        let lens: Vec<u64> = four
            .iter()
            .map(|r| r.runs.iter().map(|x| x.end - x.first).sum())
            .collect();
        assert_eq!(lens, [4, 4, 4, 3]);
        assert_eq!(four[3].runs, [run(2, 2, 5)]);
        // Both delivered 6 (of 8 and of 7 batches): 2 + 1 left, dealt to 3.
        let mut left = two.clone();
        for r in &mut left {
            r.delivered = 6;
        }
        let rest: Vec<BatchRun> = left.iter().flat_map(Rescaled::remaining).collect();
        assert_eq!(rest, [run(1, 1, 3), run(2, 4, 5)]);
        let three = Rescaled::deal(Vec::new(), &rest, 3, Mark::start_of(1));
        assert_eq!(three[0].runs, [run(1, 1, 2)]);
        assert_eq!(three[1].runs, [run(1, 2, 3)]);
        assert_eq!(three[2].runs, [run(2, 4, 5)]);
        assert!(three.iter().all(|r| r.batches == 1));
    }

    #[test]
    fn error_counts_split_exactly_at_each_sharers_positions() {
        let topic: Arc<str> = Arc::from("t");
        let at = |offset: i64| {
            let mut k = KafkaPositions::default();
            k.set(
                "t",
                0,
                Position {
                    offset,
                    skip_rows: 0,
                },
            );
            k
        };
        let leader = Acknowledger::new(None);
        let follower = leader.follower(None);
        // Offsets 0..7 and 8..11 of partition 0 (7 is missing: compacted); 3 and 4 are bad.
        leader.consumed(
            (0..7)
                .chain(8..11)
                .map(|o| (&topic, 0, o, o == 3 || o == 4)),
        );
        let count =
            |a: &Acknowledger, slot: usize, o: i64| a.errors.lock().unwrap().count(slot, &at(o));
        assert_eq!(count(&leader, 0, 5), ErrorCounts { records: 5, bad: 2 });
        assert_eq!(count(&follower, 1, 9), ErrorCounts { records: 8, bad: 2 });
        // Folded below 5 (the smaller of the two): the counts stay exact for both.
        assert_eq!(
            leader.errors.lock().unwrap().base,
            ErrorCounts { records: 5, bad: 2 }
        );
        assert_eq!(
            count(&follower, 1, 11),
            ErrorCounts {
                records: 10,
                bad: 2
            }
        );
        assert_eq!(count(&leader, 0, 9), ErrorCounts { records: 8, bad: 2 });
        assert_eq!(
            count(&leader, 0, 11),
            ErrorCounts {
                records: 10,
                bad: 2
            }
        );
        assert!(
            leader
                .errors
                .lock()
                .unwrap()
                .pending
                .values()
                .all(|r| r.is_empty())
        );

        // Through states: the counts below the positions, carried into a resumed acknowledger.
        let a = Acknowledger::new(None);
        a.consumed((0..6).map(|o| (&topic, 0, o, o == 1)));
        *a.written.lock().unwrap() = at(4);
        let state = a.state();
        assert_eq!(state.kafka_errors, Some(ErrorCounts { records: 4, bad: 1 }));
        let json = serde_json::to_string(&state).unwrap();
        let back: SourceState = serde_json::from_str(&json).unwrap();
        assert_eq!(
            Acknowledger::new(Some(&back)).restored_errors(),
            ErrorCounts { records: 4, bad: 1 }
        );
        // A Parquet pipeline's state has none.
        assert_eq!(Acknowledger::new(None).state().kafka_errors, None);
    }
}
