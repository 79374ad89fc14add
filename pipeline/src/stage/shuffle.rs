//! The `shuffle` stage's window buffer.
//!
//! Rows are collected into windows of `buffer_rows` consecutive rows (a window never spans
//! epochs). A full window is permuted and emitted in batches of `batch_rows`:
//!
//! - **in memory** when the window's Arrow memory stays under `max_memory`: one Fisher–Yates
//!   permutation of `(piece, row)` indices, rows gathered with `interleave` (one copy);
//! - **spilled** otherwise: each time the held rows exceed the cap they are permuted and
//!   written as a *run* (zstd Arrow IPC, in small chunks) to an unnamed temporary file; at the
//!   end of the window the runs are merged by repeatedly drawing a run with probability
//!   proportional to its remaining rows. A uniform interleaving of uniformly permuted runs is
//!   a uniform permutation of the window, and reading needs one chunk per run in memory.
//! - **across ranks** (`across_ranks`): the permuted window is cut into `world_size` nearly
//!   equal parts; rank `r` sends part `(j + r) mod world_size` to rank `j` (so every rank
//!   receives exactly as many rows as it sent when windows are equal), the parts travel as
//!   zstd Arrow IPC through [`Collective::all_to_all_v`], and the received rows are permuted
//!   again. Each exchange starts with an `all_gather` of "still have data" flags, so a
//!   rank whose epoch ended keeps answering (with nothing) until every rank's has: unequal
//!   inputs cannot deadlock. A spilled window is sent in rounds within the memory cap, and
//!   received rows past the cap are spilled in turn (see [`Shuffler::exchange_round`]).
//!
//! Columns listed in [`ShuffleSpec::views`] (byte columns the next stage only reads, see
//! `fuse_gathers` in the executor) leave as `BinaryView` arrays pointing into the window's
//! buffers instead of being copied row by row: a window of images is gathered by moving
//! 16-byte views, and the pixels are read once, by the stage that converts them.
//!
//! Every permutation is drawn from ChaCha8 keyed by (seed, epoch, window, rank), so output
//! depends on nothing but the input rows and the configuration, and a run resumed from a
//! [`Mark`] (window start + rows already emitted) continues exactly.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, RecordBatch, StringArray, StringDictionaryBuilder, UInt32Array,
    UInt64Array,
};
use arrow::compute::{interleave_record_batch, take_record_batch};
use arrow::datatypes::{DataType, Field, Int32Type, Schema};
use arrow::ipc::CompressionType;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};
use chacha20::ChaCha8Rng;
use rand::RngExt;
use rand::seq::SliceRandom;

use crate::batch::{Batch, Lineage, LineageSpan, Mark, Name, Origin, ShuffleMark, data_bytes};
use crate::collective::Collective;
use crate::config::GroupByLength;
use crate::error::{Error, Result, StageRef};
use crate::state::{KafkaMark, KafkaPositions, KafkaWindow, Position, SourceState, kafka_span};

/// Streams of a window's generator (see [`Shuffler::rng`]; below 4096, the rank's bits):
/// 0 permutes a window held in memory, 1 the rows received in an exchange (or merges a
/// spilled window's runs), `OWN_RUNS + k` permutes the window's `k`-th spilled run,
/// `RECEIVED_RUNS + k` the `k`-th run of received rows, `SENT_MERGE` merges the runs of a
/// spilled window sent to other ranks.
const OWN_RUNS: u64 = 2;
const RECEIVED_RUNS: u64 = 2048;
const SENT_MERGE: u64 = 4095;

/// Settings of a built shuffle stage.
#[derive(Debug, Clone)]
pub(crate) struct ShuffleSpec {
    pub(crate) buffer_rows: usize,
    pub(crate) max_memory: usize,
    pub(crate) spill_dir: Option<PathBuf>,
    pub(crate) seed: u64,
    pub(crate) batch_rows: usize,
    pub(crate) across_ranks: bool,
    /// Byte columns emitted as `BinaryView` over the window's buffers (no copy).
    pub(crate) views: Vec<usize>,
    /// `group_by_length`: batches of rows of similar length.
    pub(crate) group: Option<GroupSpec>,
    /// The pipeline's rank, however it was given (a collective, `runtime.rank`, the
    /// environment): a rank's windows are permuted the same way in every case.
    pub(crate) rank: usize,
}

/// A built `group_by_length` (see [`GroupByLength`]).
#[derive(Debug, Clone)]
pub(crate) struct GroupSpec {
    /// The column whose lengths are compared, and its name (for errors).
    pub(crate) column: usize,
    pub(crate) name: String,
    pub(crate) batches: usize,
    /// The size of the `batch` stage after the shuffle (set when the plan is linked: 0
    /// until then).
    pub(crate) batch_size: usize,
}

/// Checks a `group_by_length` against the shuffle's input.
pub(crate) fn group_spec(stage: &StageRef, g: &GroupByLength, input: &Schema) -> Result<GroupSpec> {
    if g.batches == 0 {
        return Err(err(stage, "`group_by_length.batches` must be at least 1"));
    }
    let column = super::column_index(stage, input, &g.column)?;
    let dt = input.field(column).data_type();
    if !has_length(dt) {
        return Err(err(
            stage,
            format!(
                "`group_by_length` compares the lengths of `{}`, a {dt} column: give a list, string or binary column (one whose rows differ in length)",
                g.column
            ),
        ));
    }
    Ok(GroupSpec {
        column,
        name: g.column.clone(),
        batches: g.batches,
        batch_size: 0,
    })
}

/// Whether rows of `dt` have a length `group_by_length` can compare.
fn has_length(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::List(_)
            | DataType::LargeList(_)
            | DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Binary
            | DataType::LargeBinary
            | DataType::Utf8View
            | DataType::BinaryView
    )
}

/// Every row's length in `a` (list items or bytes; a null row has length 0).
fn lengths(a: &dyn Array) -> Option<Vec<u64>> {
    fn diffs<O: arrow::array::OffsetSizeTrait>(o: &[O]) -> Vec<u64> {
        o.windows(2)
            .map(|w| (w[1] - w[0]).as_usize() as u64)
            .collect()
    }
    let mut out = match a.data_type() {
        DataType::List(_) => diffs(a.as_list::<i32>().offsets()),
        DataType::LargeList(_) => diffs(a.as_list::<i64>().offsets()),
        DataType::Utf8 => diffs(a.as_string::<i32>().offsets()),
        DataType::LargeUtf8 => diffs(a.as_string::<i64>().offsets()),
        DataType::Binary => diffs(a.as_binary::<i32>().offsets()),
        DataType::LargeBinary => diffs(a.as_binary::<i64>().offsets()),
        DataType::Utf8View => a
            .as_string_view()
            .views()
            .iter()
            .map(|v| u64::from(*v as u32))
            .collect(),
        DataType::BinaryView => a
            .as_binary_view()
            .views()
            .iter()
            .map(|v| u64::from(*v as u32))
            .collect(),
        _ => return None,
    };
    if let Some(nulls) = a.logical_nulls() {
        for (len, valid) in out.iter_mut().zip(nulls.iter()) {
            if !valid {
                *len = 0;
            }
        }
    }
    Some(out)
}

/// Counters a shuffle reports.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SpillStats {
    pub(crate) runs: u64,
    pub(crate) bytes_written: u64,
    pub(crate) windows: u64,
    /// Rows a resumed run took in again and passed over: the part of the window being
    /// emitted at the checkpoint that was delivered before it.
    pub(crate) replayed: u64,
}

/// One row's origin, compactly (for spilled and exchanged rows).
#[derive(Debug, Clone, Copy)]
struct RowOrigin {
    origin: u32,
    first: u64,
    epoch: u64,
}

/// Interns origins so per-row lineage is three integers.
#[derive(Debug, Default)]
struct Origins {
    list: Vec<Origin>,
    index: HashMap<Origin, u32>,
}

impl Origins {
    fn id(&mut self, o: &Origin) -> u32 {
        if let Some(i) = self.index.get(o) {
            return *i;
        }
        let i = self.list.len() as u32;
        self.list.push(*o);
        self.index.insert(*o, i);
        i
    }

    fn rows_of(&mut self, lineage: &Lineage, out: &mut Vec<RowOrigin>) {
        for s in lineage.spans() {
            let origin = self.id(&s.origin);
            out.extend((0..s.len).map(|k| RowOrigin {
                origin,
                first: s.first + k,
                epoch: s.epoch,
            }));
        }
    }

    fn lineage(&self, rows: impl Iterator<Item = RowOrigin>) -> Lineage {
        let mut l = Lineage::default();
        for r in rows {
            l.push(LineageSpan {
                origin: self.list[r.origin as usize],
                first: r.first,
                len: 1,
                epoch: r.epoch,
            });
        }
        l
    }
}

/// A spilled, permuted run: a zstd IPC stream in an unnamed temporary file.
struct Run {
    rows: u64,
    /// Arrow bytes per row of the rows written (what sizes the rounds that send them on).
    bytes_per_row: usize,
    lineage: Vec<RowOrigin>,
    reader: Option<StreamReader<BufReader<File>>>,
    file: Option<File>,
    chunk: Option<RecordBatch>,
    chunk_pos: usize,
    next_row: usize,
}

/// Output of one window, produced a batch at a time.
enum Emitter {
    Memory {
        pieces: Vec<RecordBatch>,
        lineage: Vec<Vec<RowOrigin>>,
        order: Vec<(usize, usize)>,
        pos: usize,
    },
    Spilled {
        runs: Vec<Run>,
        left: u64,
        rng: Box<ChaCha8Rng>,
    },
    /// `group_by_length` over another emitter's output.
    Grouped(Box<Grouped>),
}

/// A window's output regrouped by length: groups of `batches × batch_size` rows of the
/// shuffled order, each sorted by length (longest first; a stable sort, so ties keep the
/// shuffled order), cut into batches whose order is then permuted — the short batch of the
/// window's last group (if any) last, so batch boundaries stay where the `batch` stage cuts.
/// Everything is a function of (seed, epoch, window, rank, group index): a resumed run
/// regroups the same way and passes over whole groups without reading them twice.
struct Grouped {
    inner: Emitter,
    spec: GroupSpec,
    seed: u64,
    epoch: u64,
    /// The window and the rank, as the generator's key takes them.
    key: u64,
    /// The current group, its rows' origins, their order and how many have been emitted.
    chunk: Option<(RecordBatch, Vec<RowOrigin>)>,
    order: Vec<u32>,
    pos: usize,
    /// Groups taken so far in this window.
    groups: u64,
}

/// The generators that order the batches of `group_by_length`'s groups: this plus the
/// group's index, keyed by (seed, epoch, window, rank).
const GROUP_DOMAIN: u64 = 0x6772_6f75_7073_0000;

/// Where the output of a window restarts.
#[derive(Debug, Clone)]
enum WindowMark {
    /// A Parquet pipeline: the window's first input row.
    Parquet(Mark),
    /// A Kafka stream: the window's rows, as positions.
    Kafka(Arc<KafkaWindow>),
}

/// What a shuffle of a Kafka stream tracks instead of [`Mark`]s (see [`KafkaWindow`]).
#[derive(Debug, Default)]
struct KafkaFeed {
    /// Position of the current window's first row in each partition it has rows of.
    starts: KafkaPositions,
    /// Just past every row taken in.
    taken: KafkaPositions,
    /// Resuming: the window that was being emitted, until its rows have been read again.
    rebuild: Option<Arc<KafkaWindow>>,
}

/// The window buffer. Give it input with `push` only when `next_output` has returned
/// `None`; call `finish` at the end of input, then drain `next_output` again.
pub(crate) struct Shuffler {
    stage: StageRef,
    spec: ShuffleSpec,
    collective: Option<Arc<dyn Collective>>,
    origins: Origins,
    epoch: Option<u64>,
    window: u64,
    /// Mark of the current window's first row (pre-shuffle stream).
    start: Option<Mark>,
    /// Mark just past the last row taken in.
    last_end: Option<Mark>,
    pieces: Vec<Batch>,
    /// Rows of the current window (held and spilled).
    rows: usize,
    /// Rows and Arrow bytes held in memory.
    held_rows: usize,
    bytes: usize,
    runs: Vec<Run>,
    /// Input not yet taken in (the rest of a batch that completed a window).
    carry: Option<Batch>,
    /// Output of the window being emitted, its mark, rows already emitted.
    out: Option<(Emitter, WindowMark, u64)>,
    /// Set when the input is a Kafka stream.
    kafka: Option<KafkaFeed>,
    /// Exchange rounds still owed at the end of an epoch (across ranks).
    draining: bool,
    /// The epoch that starts once the previous one's output is out.
    next_epoch: Option<u64>,
    /// Rows of the first output window to pass over (resuming).
    resume_skip: u64,
    pub(crate) stats: SpillStats,
}

impl std::fmt::Debug for Shuffler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Shuffler({})", self.stage)
    }
}

fn err(stage: &StageRef, message: impl Into<String>) -> Error {
    Error::Stage {
        stage: stage.clone(),
        message: message.into(),
    }
}

fn arrow_err(stage: &StageRef, e: arrow::error::ArrowError) -> Error {
    Error::Arrow {
        context: stage.to_string(),
        source: e,
    }
}

fn io_err(stage: &StageRef, what: &str, e: std::io::Error) -> Error {
    err(stage, format!("{what}: {e}"))
}

impl Shuffler {
    /// A shuffler; `resume` is the mark a restored run continues from.
    pub(crate) fn new(
        stage: StageRef,
        spec: ShuffleSpec,
        collective: Option<Arc<dyn Collective>>,
        resume: Option<Mark>,
    ) -> Self {
        let sm = resume.and_then(|m| m.shuffle);
        Shuffler {
            stage,
            spec,
            collective,
            origins: Origins::default(),
            epoch: resume.map(|m| m.epoch),
            window: sm.map(|s| s.window).unwrap_or(0),
            start: None,
            last_end: resume.map(|m| Mark { shuffle: None, ..m }),
            pieces: Vec::new(),
            rows: 0,
            held_rows: 0,
            bytes: 0,
            runs: Vec::new(),
            carry: None,
            out: None,
            kafka: None,
            draining: false,
            next_epoch: None,
            resume_skip: sm.map(|s| s.emitted).unwrap_or(0),
            stats: SpillStats::default(),
        }
    }

    /// Makes this a shuffle of a Kafka stream, resuming from `resume` (its window is rebuilt
    /// from the rows the source reads again first).
    pub(crate) fn over_kafka(mut self, resume: Option<&SourceState>) -> Self {
        let mut feed = KafkaFeed::default();
        self.epoch = Some(0);
        if let Some(state) = resume {
            let ends = state.kafka.clone().unwrap_or_default();
            if let Some(k) = &state.kafka_shuffle {
                self.window = k.window;
                self.resume_skip = k.emitted;
                if k.rows > 0 {
                    feed.rebuild = Some(Arc::new(KafkaWindow {
                        window: k.window,
                        rows: k.rows,
                        starts: k.starts.clone(),
                        ends: ends.clone(),
                    }));
                }
            }
            feed.taken = ends;
        }
        self.kafka = Some(feed);
        self
    }

    /// This rank (the collective's, or the configured one): part of every generator's key.
    fn rank(&self) -> u64 {
        self.spec.rank as u64
    }

    fn exchanging(&self) -> bool {
        self.spec.across_ranks && self.collective.as_ref().is_some_and(|c| c.world_size() > 1)
    }

    fn rng(&self, epoch: u64, window: u64, part: u64) -> ChaCha8Rng {
        super::seeded_rng(
            self.spec.seed,
            0x7368_7566,
            epoch,
            (window << 24) ^ (self.rank() << 12) ^ part,
        )
    }

    /// Takes a batch of input. Call only when `next_output` has returned `None`.
    pub(crate) fn push(&mut self, batch: Batch) -> Result<()> {
        if self.carry.is_some() || self.out.is_some() {
            return Err(Error::Internal(format!(
                "{}: input pushed while output is pending",
                self.stage
            )));
        }
        if batch.num_rows() > 0 {
            self.carry = Some(batch);
        }
        Ok(())
    }

    /// End of input: the last window, and the end of the last epoch.
    pub(crate) fn finish(&mut self) -> Result<()> {
        self.end_epoch()
    }

    /// The next output batch, or `None` when more input is needed (or, after `finish`, at
    /// the end).
    pub(crate) fn next_output(&mut self) -> Result<Option<Batch>> {
        loop {
            if let Some((emitter, at, emitted)) = &mut self.out {
                let want = self.spec.batch_rows;
                if let Some((data, rows)) = emitter.next(&self.stage, want, &self.origins)? {
                    // Spilled rows were read back (copied) already: wrap them the same way.
                    let data = if emitter.read_back() {
                        views(&data, &self.spec.views).map_err(|e| arrow_err(&self.stage, e))?
                    } else {
                        data
                    };
                    let n = data.num_rows() as u64;
                    let mut b = Batch::new(data, self.origins.lineage(rows.into_iter()));
                    match at {
                        WindowMark::Parquet(mark) => {
                            b.mark = Some(Mark {
                                shuffle: Some(ShuffleMark {
                                    window: self.window,
                                    emitted: *emitted,
                                }),
                                ..*mark
                            })
                        }
                        WindowMark::Kafka(w) => {
                            b.kafka_mark = Some(KafkaMark {
                                window: w.clone(),
                                emitted: *emitted,
                            })
                        }
                    }
                    *emitted += n;
                    return Ok(Some(b));
                }
                self.out = None;
                self.window += 1;
                self.stats.windows += 1;
                continue;
            }
            if self.draining {
                if !self.exchange_round(false)? {
                    self.draining = false;
                }
                continue;
            }
            if let Some(e) = self.next_epoch.take() {
                self.epoch = Some(e);
                self.window = 0;
            }
            let Some(batch) = self.carry.take() else {
                return Ok(None);
            };
            self.absorb(batch)?;
        }
    }

    /// Takes rows of `batch` until the window is full or the epoch changes; the rest waits
    /// in `carry`.
    fn absorb(&mut self, mut batch: Batch) -> Result<()> {
        if self.kafka.is_some() {
            return self.absorb_kafka(batch);
        }
        let Some(mark) = batch.mark else {
            return Err(Error::Internal(format!(
                "{}: a batch without a position reached the shuffle",
                self.stage
            )));
        };
        if self.epoch.is_some_and(|e| e != mark.epoch) {
            // Finish the epoch (its last window and exchanges) before the new one starts.
            self.carry = Some(batch);
            self.end_epoch()?;
            self.next_epoch = Some(mark.epoch);
            return Ok(());
        }
        self.epoch = Some(mark.epoch);
        let room = self.spec.buffer_rows - self.rows;
        let take = room.min(batch.num_rows());
        if take < batch.num_rows() {
            self.carry = Some(batch.slice(take, batch.num_rows() - take));
            batch = batch.slice(0, take);
        }
        if self.rows == 0 {
            self.start = batch.mark;
        }
        self.last_end = batch.end_mark();
        self.rows += take;
        self.held_rows += take;
        self.bytes += batch.memory_size();
        self.pieces.push(batch);
        if self.bytes > self.spec.max_memory && self.rows < self.spec.buffer_rows {
            self.spill()?;
        }
        if self.rows == self.spec.buffer_rows {
            self.flush()?;
        }
        Ok(())
    }

    /// [`Shuffler::absorb`] for a Kafka stream: windows of `buffer_rows` rows in arrival
    /// order, held in memory; resuming, first the window being emitted at the checkpoint,
    /// exactly the rows it held.
    fn absorb_kafka(&mut self, mut batch: Batch) -> Result<()> {
        let Some(feed) = self.kafka.as_mut() else {
            return Err(Error::Internal("not a Kafka shuffle".into()));
        };
        let n = batch.num_rows();
        if let Some(w) = &feed.rebuild {
            let want = w.rows as usize - self.rows;
            let outside = batch.lineage.spans().iter().find(|s| {
                let Some((t, p, first, past)) = kafka_span(s) else {
                    return true;
                };
                match (w.starts.get(t, p), w.ends.get(t, p)) {
                    (Some(a), Some(b)) => first < a || past > b,
                    _ => true,
                }
            });
            if n > want || outside.is_some() {
                let next = outside
                    .map(|s| format!("{}, {} {}", s.origin, s.origin.unit(), s.first))
                    .unwrap_or_else(|| format!("{} rows more", n - want));
                return Err(err(
                    &self.stage,
                    rebuild_failed(w, self.rows, &format!("were read again before {next}")),
                ));
            }
        } else {
            let room = self.spec.buffer_rows - self.rows;
            if room < n {
                self.carry = Some(batch.slice(room, n - room));
                batch = batch.slice(0, room);
            }
        }
        for s in batch.lineage.spans() {
            if let Some((t, p, first, _)) = kafka_span(s)
                && feed.starts.get(t, p).is_none()
            {
                feed.starts.set(t, p, first);
            }
        }
        feed.taken.observe(&batch.lineage);
        let take = batch.num_rows();
        self.rows += take;
        self.held_rows += take;
        self.bytes += batch.memory_size();
        self.pieces.push(batch);
        if self.bytes > self.spec.max_memory {
            return Err(err(
                &self.stage,
                format!(
                    "a window of {} rows needs more than `max_memory` ({} bytes); a shuffle of a Kafka stream keeps its window in memory (the rows' arrival order, which would decide its spills, cannot be replayed): raise `max_memory` or lower `buffer_rows`",
                    self.spec.buffer_rows, self.spec.max_memory
                ),
            ));
        }
        let full = match &feed.rebuild {
            Some(w) => self.rows as u64 == w.rows,
            None => self.rows == self.spec.buffer_rows,
        };
        if full {
            self.flush()?;
        }
        Ok(())
    }

    /// The epoch (or input) ended: emit the partial window, then settle exchanges.
    fn end_epoch(&mut self) -> Result<()> {
        if let Some(w) = self.kafka.as_ref().and_then(|k| k.rebuild.as_ref()) {
            return Err(err(
                &self.stage,
                rebuild_failed(w, self.rows, "arrived before the input ended"),
            ));
        }
        if self.rows > 0 {
            self.flush()?;
        }
        if self.exchanging() {
            self.draining = true;
        }
        Ok(())
    }

    fn window_rows(&mut self) -> (Vec<RecordBatch>, Vec<Vec<RowOrigin>>) {
        let pieces = std::mem::take(&mut self.pieces);
        self.held_rows = 0;
        self.bytes = 0;
        let mut lineage = Vec::with_capacity(pieces.len());
        let mut data = Vec::with_capacity(pieces.len());
        for p in pieces {
            let mut rows = Vec::with_capacity(p.num_rows());
            self.origins.rows_of(&p.lineage, &mut rows);
            lineage.push(rows);
            data.push(p.data);
        }
        (data, lineage)
    }

    /// `pieces` with the [`ShuffleSpec::views`] columns as views over the same buffers.
    fn viewed(&self, pieces: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
        if self.spec.views.is_empty() {
            return Ok(pieces);
        }
        pieces
            .iter()
            .map(|p| views(p, &self.spec.views).map_err(|e| arrow_err(&self.stage, e)))
            .collect()
    }

    /// Where the output of the current window restarts: its first input row, or (a rank
    /// with no rows of its own in an exchange round) just past the last row taken in.
    fn window_mark(&self, own_rows: bool) -> Mark {
        if own_rows { self.start } else { None }
            .or(self.last_end)
            .unwrap_or(Mark::start_of(self.epoch.unwrap_or(0)))
    }

    /// Permutes the current window and starts emitting it.
    fn flush(&mut self) -> Result<()> {
        self.rows = 0;
        if self.exchanging() {
            self.exchange_round(true)?;
            return Ok(());
        }
        let epoch = self.epoch.unwrap_or(0);
        let start = match self.kafka.as_mut() {
            None => WindowMark::Parquet(self.window_mark(true)),
            Some(feed) => {
                let starts = std::mem::take(&mut feed.starts);
                WindowMark::Kafka(match feed.rebuild.take() {
                    Some(w) => w,
                    None => Arc::new(KafkaWindow {
                        window: self.window,
                        rows: self.held_rows as u64,
                        starts,
                        ends: feed.taken.clone(),
                    }),
                })
            }
        };
        let emitter = if self.runs.is_empty() {
            let (pieces, lineage) = self.window_rows();
            let pieces = self.viewed(pieces)?;
            let mut rng = self.rng(epoch, self.window, 0);
            let order = match self.kafka {
                // Arrival order across partitions is timing: permute the rows sorted by
                // partition and position, which a rebuilt window has too.
                Some(_) => {
                    let mut order = canonical(&lineage, &self.origins);
                    order.shuffle(&mut rng);
                    order
                }
                None => shuffled(&pieces, &mut rng),
            };
            Emitter::Memory {
                pieces,
                lineage,
                order,
                pos: 0,
            }
        } else {
            if self.held_rows > 0 {
                self.spill()?;
            }
            let runs = std::mem::take(&mut self.runs);
            let left = runs.iter().map(|r| r.rows).sum();
            Emitter::Spilled {
                runs,
                left,
                rng: Box::new(self.rng(epoch, self.window, 1)),
            }
        };
        let mut emitter = self.grouped(emitter, epoch);
        let skipped = self.begin_output(&mut emitter)?;
        self.out = Some((emitter, start, skipped));
        Ok(())
    }

    /// `emitter`'s output regrouped by length, with `group_by_length`.
    fn grouped(&self, inner: Emitter, epoch: u64) -> Emitter {
        match &self.spec.group {
            None => inner,
            Some(spec) => Emitter::Grouped(Box::new(Grouped {
                inner,
                spec: spec.clone(),
                seed: self.spec.seed,
                epoch,
                key: (self.window << 24) ^ (self.rank() << 12),
                chunk: None,
                order: Vec::new(),
                pos: 0,
                groups: 0,
            })),
        }
    }

    /// Passes over the rows a resumed run already delivered (a mark may count past the end
    /// of its window: the rest is passed over in the next ones). Returns the rows skipped.
    fn begin_output(&mut self, emitter: &mut Emitter) -> Result<u64> {
        let mut skipped = 0u64;
        while self.resume_skip > 0 {
            let n = self.resume_skip.min(65536) as usize;
            let k = emitter.skip(&self.stage, n, &self.origins)?;
            skipped += k as u64;
            self.resume_skip -= k as u64;
            if k < n {
                break;
            }
        }
        self.stats.replayed += skipped;
        Ok(skipped)
    }

    /// Permutes the held rows and writes them to a temporary file as one run.
    fn spill(&mut self) -> Result<()> {
        let bytes_per_row = (self.bytes / self.held_rows.max(1)).max(1);
        let (pieces, lineage) = self.window_rows();
        let part = OWN_RUNS + self.runs.len() as u64;
        let run = self.write_run(&pieces, &lineage, part, bytes_per_row)?;
        self.runs.push(run);
        Ok(())
    }

    /// Writes `pieces` (rows with their origins), permuted by the stream `part` of this
    /// window, to a temporary file as one run.
    fn write_run(
        &mut self,
        pieces: &[RecordBatch],
        lineage: &[Vec<RowOrigin>],
        part: u64,
        bytes_per_row: usize,
    ) -> Result<Run> {
        let epoch = self.epoch.unwrap_or(0);
        let order = shuffled(pieces, &mut self.rng(epoch, self.window, part));
        // Chunks small enough that one per run fits in half the cap.
        let runs_expected =
            (self.spec.buffer_rows * bytes_per_row).div_ceil(self.spec.max_memory.max(1)) + 1;
        let chunk_rows =
            (self.spec.max_memory / 2 / runs_expected / bytes_per_row).clamp(16, 65536);
        let file = match &self.spec.spill_dir {
            Some(d) => tempfile::tempfile_in(d),
            None => tempfile::tempfile(),
        }
        .map_err(|e| io_err(&self.stage, "creating a shuffle spill file", e))?;
        let schema = pieces[0].schema();
        let options = IpcWriteOptions::default()
            .try_with_compression(Some(CompressionType::ZSTD))
            .map_err(|e| arrow_err(&self.stage, e))?;
        let mut writer = StreamWriter::try_new_with_options(BufWriter::new(file), &schema, options)
            .map_err(|e| arrow_err(&self.stage, e))?;
        let refs: Vec<&RecordBatch> = pieces.iter().collect();
        let mut run_lineage = Vec::with_capacity(order.len());
        for chunk in order.chunks(chunk_rows) {
            let rb =
                interleave_record_batch(&refs, chunk).map_err(|e| arrow_err(&self.stage, e))?;
            writer.write(&rb).map_err(|e| arrow_err(&self.stage, e))?;
            run_lineage.extend(chunk.iter().map(|(p, r)| lineage[*p][*r]));
        }
        writer.finish().map_err(|e| arrow_err(&self.stage, e))?;
        let mut file = writer
            .into_inner()
            .map_err(|e| arrow_err(&self.stage, e))?
            .into_inner()
            .map_err(|e| io_err(&self.stage, "writing a shuffle spill file", e.into_error()))?;
        let written = file
            .stream_position()
            .map_err(|e| io_err(&self.stage, "writing a shuffle spill file", e))?;
        file.seek(SeekFrom::Start(0))
            .map_err(|e| io_err(&self.stage, "rewinding a shuffle spill file", e))?;
        self.stats.runs += 1;
        self.stats.bytes_written += written;
        Ok(Run {
            rows: run_lineage.len() as u64,
            bytes_per_row,
            lineage: run_lineage,
            reader: None,
            file: Some(file),
            chunk: None,
            chunk_pos: 0,
            next_row: 0,
        })
    }

    /// One exchange across ranks: everyone says whether it has a window; if anyone has, all
    /// exchange (ranks without data send nothing) and the received rows become the next
    /// output window. Returns false when no rank had data.
    ///
    /// A window held in memory goes out in one `all_to_all_v`: the permuted window cut into
    /// `world_size` consecutive parts. A spilled window goes out in rounds, each at most a
    /// quarter of `max_memory`: its runs are merged into one uniform permutation, read a
    /// round at a time, and its `i`-th row belongs to part `i mod world_size`. Received
    /// rows are held until they pass `max_memory`, then spilled as a run, so a window larger
    /// than memory is exchanged within the cap too.
    fn exchange_round(&mut self, have: bool) -> Result<bool> {
        let Some(c) = self.collective.clone() else {
            return Ok(false);
        };
        let stage = self.stage.clone();
        let collective_err = |e: crate::collective::CollectiveError| {
            err(&stage, format!("exchanging rows across ranks: {e}"))
        };
        let world = c.world_size();
        let rank = c.rank();
        let epoch = self.epoch.unwrap_or(0);
        // What this rank sends: its whole window at once, or a spilled one in rounds.
        let mut sender = if !have {
            Sender::Nothing
        } else if self.runs.is_empty() {
            Sender::Memory
        } else {
            if self.held_rows > 0 {
                self.spill()?;
            }
            let runs = std::mem::take(&mut self.runs);
            let bytes_per_row = runs
                .iter()
                .map(|r| r.bytes_per_row)
                .max()
                .unwrap_or(1)
                .max(1);
            let left: u64 = runs.iter().map(|r| r.rows).sum();
            // Rows per destination and round: a round's rows (world × this) fit in a quarter
            // of the cap.
            let per_rank = (self.spec.max_memory / 4 / world / bytes_per_row).clamp(16, 1 << 20);
            Sender::Spilled {
                emitter: Emitter::Spilled {
                    runs,
                    left,
                    rng: Box::new(self.rng(epoch, self.window, SENT_MERGE)),
                },
                per_rank,
                rounds: left.div_ceil((world * per_rank) as u64).max(1),
            }
        };
        // Everyone says whether it has rows, where it is and how many rounds it needs; ranks
        // must be at the same window (a resumed group restored from one consistent step).
        let mut hello = vec![have as u8];
        hello.extend_from_slice(&epoch.to_le_bytes());
        hello.extend_from_slice(&self.window.to_le_bytes());
        hello.extend_from_slice(&sender.rounds().to_le_bytes());
        let flags = c.all_gather(hello.clone()).map_err(collective_err)?;
        if let Some((r, _)) = flags
            .iter()
            .enumerate()
            .find(|(_, f)| f.get(1..17) != hello.get(1..17))
        {
            return Err(err(
                &self.stage,
                format!(
                    "rank {} is at a different shuffle window than rank {} (epoch/window differ); the ranks were restored from checkpoints of different steps",
                    r,
                    c.rank()
                ),
            ));
        }
        if flags.iter().all(|f| f.first() != Some(&1)) {
            return Ok(false);
        }
        let rounds = flags
            .iter()
            .filter_map(|f| Some(u64::from_le_bytes(f.get(17..25)?.try_into().ok()?)))
            .max()
            .unwrap_or(1);
        let start = WindowMark::Parquet(self.window_mark(have));
        let mut received = Received::default();
        for _ in 0..rounds {
            let send = self.parts_to_send(&mut sender, world, rank)?;
            let parts = c.all_to_all_v(send).map_err(collective_err)?;
            for bytes in parts.iter().filter(|b| !b.is_empty()) {
                let (rb, rows) = decode_part(&self.stage, bytes, &mut self.origins)?;
                received.bytes += data_bytes(&rb);
                received.rows += rb.num_rows();
                received.pieces.push(rb);
                received.lineage.push(rows);
            }
            if received.bytes > self.spec.max_memory {
                self.spill_received(&mut received)?;
            }
        }
        let emitter = if received.runs.is_empty() {
            let pieces = self.viewed(received.pieces)?;
            let order = shuffled(&pieces, &mut self.rng(epoch, self.window, 1));
            Emitter::Memory {
                pieces,
                lineage: received.lineage,
                order,
                pos: 0,
            }
        } else {
            if !received.pieces.is_empty() {
                self.spill_received(&mut received)?;
            }
            let left = received.runs.iter().map(|r| r.rows).sum();
            Emitter::Spilled {
                runs: received.runs,
                left,
                rng: Box::new(self.rng(epoch, self.window, 1)),
            }
        };
        let mut emitter = self.grouped(emitter, epoch);
        let skipped = self.begin_output(&mut emitter)?;
        self.out = Some((emitter, start, skipped));
        Ok(true)
    }

    /// This round's part for every rank (`send[j]` goes to rank `j`: part `(j + rank) mod
    /// world`), encoded; empty when there is nothing for it.
    fn parts_to_send(
        &mut self,
        sender: &mut Sender,
        world: usize,
        rank: usize,
    ) -> Result<Vec<Vec<u8>>> {
        let mut send = vec![Vec::new(); world];
        match sender {
            Sender::Nothing => {}
            Sender::Memory => {
                *sender = Sender::Nothing;
                let epoch = self.epoch.unwrap_or(0);
                let (pieces, lineage) = self.window_rows();
                let order = shuffled(&pieces, &mut self.rng(epoch, self.window, 0));
                let n = order.len();
                let refs: Vec<&RecordBatch> = pieces.iter().collect();
                let mut at = 0;
                let mut parts = Vec::with_capacity(world);
                for p in 0..world {
                    let len = n / world + usize::from(p < n % world);
                    parts.push(&order[at..at + len]);
                    at += len;
                }
                for (j, slot) in send.iter_mut().enumerate() {
                    let part = parts[(j + rank) % world];
                    if part.is_empty() {
                        continue;
                    }
                    let rb = interleave_record_batch(&refs, part)
                        .map_err(|e| arrow_err(&self.stage, e))?;
                    let rows: Vec<RowOrigin> = part.iter().map(|(p, r)| lineage[*p][*r]).collect();
                    *slot = encode_part(&self.stage, &rb, &rows, &self.origins)?;
                }
            }
            Sender::Spilled {
                emitter, per_rank, ..
            } => {
                // Rounds before this one sent `world × per_rank` rows each: row `i` here is
                // row `i mod world` of the round's part cycle.
                let Some((rb, rows)) =
                    emitter.next(&self.stage, world * *per_rank, &self.origins)?
                else {
                    return Ok(send);
                };
                for (j, slot) in send.iter_mut().enumerate() {
                    let part = (j + rank) % world;
                    let idx: Vec<u32> = (part..rb.num_rows())
                        .step_by(world)
                        .map(|i| i as u32)
                        .collect();
                    if idx.is_empty() {
                        continue;
                    }
                    let origins: Vec<RowOrigin> = idx.iter().map(|&i| rows[i as usize]).collect();
                    let taken = take_record_batch(&rb, &UInt32Array::from(idx))
                        .map_err(|e| arrow_err(&self.stage, e))?;
                    *slot = encode_part(&self.stage, &taken, &origins, &self.origins)?;
                }
            }
        }
        Ok(send)
    }

    /// Writes the received rows held so far as one run.
    fn spill_received(&mut self, received: &mut Received) -> Result<()> {
        let bytes_per_row = (received.bytes / received.rows.max(1)).max(1);
        let pieces = std::mem::take(&mut received.pieces);
        let lineage = std::mem::take(&mut received.lineage);
        let part = RECEIVED_RUNS + received.runs.len() as u64;
        let run = self.write_run(&pieces, &lineage, part, bytes_per_row)?;
        received.runs.push(run);
        received.bytes = 0;
        received.rows = 0;
        Ok(())
    }
}

/// What a rank sends in the rounds of an exchange.
enum Sender {
    /// No window (its epoch ended; it answers the others' rounds).
    Nothing,
    /// A window held in memory, sent in the first round.
    Memory,
    /// A spilled window: `per_rank` rows to every rank in each of `rounds` rounds.
    Spilled {
        emitter: Emitter,
        per_rank: usize,
        rounds: u64,
    },
}

impl Sender {
    fn rounds(&self) -> u64 {
        match self {
            Sender::Nothing => 0,
            Sender::Memory => 1,
            Sender::Spilled { rounds, .. } => *rounds,
        }
    }
}

/// Rows received in an exchange: held in memory, and runs spilled once they passed the cap.
#[derive(Default)]
struct Received {
    pieces: Vec<RecordBatch>,
    lineage: Vec<Vec<RowOrigin>>,
    bytes: usize,
    rows: usize,
    runs: Vec<Run>,
}

/// `schema` with each of `columns` typed `BinaryView`: the schema of what [`views`] returns,
/// and what the plan gives the stages after a shuffle that emits views.
pub(crate) fn view_schema(schema: &Schema, columns: &[usize]) -> Schema {
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    for &i in columns {
        fields[i] = fields[i].clone().with_data_type(DataType::BinaryView);
    }
    Schema::new_with_metadata(fields, schema.metadata().clone())
}

/// `rb` with each of `columns` (binary, large binary or fixed-size binary) as a `BinaryView`
/// array over the same value buffer: one 16-byte view per row, no bytes copied (a buffer of
/// 4 GiB or more is copied: views address at most 4 GiB).
pub(crate) fn views(rb: &RecordBatch, columns: &[usize]) -> arrow::error::Result<RecordBatch> {
    use arrow::array::{Array, BinaryViewArray, BinaryViewBuilder};
    if columns.is_empty() {
        return Ok(rb.clone());
    }
    let mut arrays = rb.columns().to_vec();
    for &i in columns {
        let a = &arrays[i];
        let viewed: ArrayRef = match a.data_type() {
            DataType::BinaryView => continue,
            DataType::Binary => Arc::new(BinaryViewArray::from(a.as_binary::<i32>())),
            DataType::LargeBinary => Arc::new(BinaryViewArray::from(a.as_binary::<i64>())),
            DataType::FixedSizeBinary(_) => {
                let a = a.as_fixed_size_binary();
                let size = a.value_size();
                if a.values().len() >= u32::MAX as usize {
                    arrow::compute::cast(a, &DataType::BinaryView)?
                } else {
                    let mut b = BinaryViewBuilder::with_capacity(a.len());
                    let block = b.append_block(a.values().clone());
                    for r in 0..a.len() {
                        if a.is_null(r) {
                            b.append_null();
                        } else {
                            b.try_append_view(block, (r * size) as u32, size as u32)?;
                        }
                    }
                    Arc::new(b.finish())
                }
            }
            other => {
                return Err(arrow::error::ArrowError::InvalidArgumentError(format!(
                    "column {i} is {other}, not bytes"
                )));
            }
        };
        arrays[i] = viewed;
    }
    RecordBatch::try_new(Arc::new(view_schema(&rb.schema(), columns)), arrays)
}

/// Every `(piece, row)` of a window of Kafka rows (`lineage` per piece), sorted by topic,
/// partition and position: an order that does not depend on how the partitions' rows
/// interleaved on arrival.
fn canonical(lineage: &[Vec<RowOrigin>], origins: &Origins) -> Vec<(usize, usize)> {
    let key = |r: &RowOrigin| match &origins.list[r.origin as usize] {
        Origin::Kafka { topic, partition } => (*topic, *partition, r.first as i64, 0),
        Origin::KafkaMessage {
            topic,
            partition,
            offset,
            ..
        } => (*topic, *partition, *offset, r.first),
        Origin::Object { url, row_group } => (*url, *row_group as i32, r.first as i64, 0),
    };
    let mut keyed: Vec<_> = lineage
        .iter()
        .enumerate()
        .flat_map(|(p, rows)| rows.iter().enumerate().map(move |(r, o)| ((p, r), o)))
        .map(|(at, o)| (key(o), at))
        .collect();
    keyed.sort_unstable_by_key(|a| a.0);
    keyed.into_iter().map(|(_, at)| at).collect()
}

/// Why a resumed Kafka window could not be rebuilt: only `got` of its rows `how`.
fn rebuild_failed(w: &KafkaWindow, got: usize, how: &str) -> String {
    format!(
        "cannot rebuild the shuffle window the state was taken in: it held {} rows ({}), but only {got} of them {how}. Were messages deleted (retention) or the topic recreated since? Resume from an earlier checkpoint, or start over without this one",
        w.rows,
        describe_window(w)
    )
}

/// The partitions and positions a Kafka window holds, e.g. `events/0 from offset 10 to offset 20`.
fn describe_window(w: &KafkaWindow) -> String {
    let parts: Vec<String> = w
        .starts
        .iter()
        .map(|(t, p, a)| {
            let b = w.ends.get(t, p).unwrap_or(a);
            format!("{t}/{p} from {} to {}", show(a), show(b))
        })
        .collect();
    parts.join(", ")
}

fn show(p: Position) -> String {
    match p.skip_rows {
        0 => format!("offset {}", p.offset),
        r => format!("offset {} row {r}", p.offset),
    }
}

/// Every `(piece, row)` of `pieces`, in a uniformly random order drawn from `rng`.
fn shuffled(pieces: &[RecordBatch], rng: &mut ChaCha8Rng) -> Vec<(usize, usize)> {
    let mut order: Vec<(usize, usize)> = pieces
        .iter()
        .enumerate()
        .flat_map(|(i, p)| (0..p.num_rows()).map(move |r| (i, r)))
        .collect();
    order.shuffle(rng);
    order
}

const LINEAGE_COLUMNS: [&str; 4] = [
    "__sluice_url",
    "__sluice_row_group",
    "__sluice_row",
    "__sluice_epoch",
];

/// A part of a window for another rank: the rows plus their lineage as four extra columns,
/// as one zstd Arrow IPC stream.
fn encode_part(
    stage: &StageRef,
    rb: &RecordBatch,
    rows: &[RowOrigin],
    origins: &Origins,
) -> Result<Vec<u8>> {
    let mut urls = StringDictionaryBuilder::<Int32Type>::new();
    let mut rgs = Vec::with_capacity(rows.len());
    for r in rows {
        match &origins.list[r.origin as usize] {
            Origin::Object { url, row_group } => {
                urls.append_value(&**url);
                rgs.push(*row_group);
            }
            other => {
                return Err(err(
                    stage,
                    format!("rows from {other} cannot be exchanged (Parquet only)"),
                ));
            }
        }
    }
    let mut fields: Vec<Field> = rb
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    let mut columns: Vec<ArrayRef> = rb.columns().to_vec();
    let extra: [(DataType, ArrayRef); 4] = [
        (
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            Arc::new(urls.finish()),
        ),
        (DataType::UInt32, Arc::new(UInt32Array::from(rgs))),
        (
            DataType::UInt64,
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.first))),
        ),
        (
            DataType::UInt64,
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.epoch))),
        ),
    ];
    for (name, (t, a)) in LINEAGE_COLUMNS.iter().zip(extra) {
        fields.push(Field::new(*name, t, false));
        columns.push(a);
    }
    let full = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| arrow_err(stage, e))?;
    let options = IpcWriteOptions::default()
        .try_with_compression(Some(CompressionType::ZSTD))
        .map_err(|e| arrow_err(stage, e))?;
    let mut out = Vec::new();
    let mut w = StreamWriter::try_new_with_options(&mut out, &full.schema(), options)
        .map_err(|e| arrow_err(stage, e))?;
    w.write(&full).map_err(|e| arrow_err(stage, e))?;
    w.finish().map_err(|e| arrow_err(stage, e))?;
    drop(w);
    Ok(out)
}

fn decode_part(
    stage: &StageRef,
    bytes: &[u8],
    origins: &mut Origins,
) -> Result<(RecordBatch, Vec<RowOrigin>)> {
    let reader = StreamReader::try_new(std::io::Cursor::new(bytes), None)
        .map_err(|e| arrow_err(stage, e))?;
    let mut batches = Vec::new();
    for b in reader {
        batches.push(b.map_err(|e| arrow_err(stage, e))?);
    }
    let full = match batches.len() {
        1 => batches.pop().expect("one batch"),
        _ => return Err(err(stage, "a received part is not exactly one batch")),
    };
    let n = full.num_columns() - LINEAGE_COLUMNS.len();
    let urls = full.column(n).as_dictionary::<Int32Type>();
    let url_values: &StringArray = urls.values().as_string::<i32>();
    let rgs = full
        .column(n + 1)
        .as_primitive::<arrow::datatypes::UInt32Type>();
    let firsts = full
        .column(n + 2)
        .as_primitive::<arrow::datatypes::UInt64Type>();
    let epochs = full
        .column(n + 3)
        .as_primitive::<arrow::datatypes::UInt64Type>();
    let mut rows = Vec::with_capacity(full.num_rows());
    for i in 0..full.num_rows() {
        let key = urls.keys().value(i) as usize;
        let origin = origins.id(&Origin::Object {
            url: Name::from(url_values.value(key)),
            row_group: rgs.value(i),
        });
        rows.push(RowOrigin {
            origin,
            first: firsts.value(i),
            epoch: epochs.value(i),
        });
    }
    let data = full
        .project(&(0..n).collect::<Vec<_>>())
        .map_err(|e| arrow_err(stage, e))?;
    Ok((data, rows))
}

impl Run {
    /// The chunk holding the next row, reading the next one from disk when needed.
    fn current(&mut self, stage: &StageRef) -> Result<&RecordBatch> {
        let exhausted = self
            .chunk
            .as_ref()
            .is_none_or(|c| self.chunk_pos >= c.num_rows());
        if exhausted {
            if self.reader.is_none() {
                let file = self
                    .file
                    .take()
                    .ok_or_else(|| Error::Internal("spill run read twice".into()))?;
                self.reader = Some(
                    StreamReader::try_new(BufReader::new(file), None)
                        .map_err(|e| arrow_err(stage, e))?,
                );
            }
            let next = self
                .reader
                .as_mut()
                .and_then(|r| r.next())
                .ok_or_else(|| err(stage, "a shuffle spill file ended early"))?
                .map_err(|e| arrow_err(stage, e))?;
            self.chunk = Some(next);
            self.chunk_pos = 0;
        }
        self.chunk
            .as_ref()
            .ok_or_else(|| Error::Internal("no chunk".into()))
    }
}

impl Emitter {
    /// Whether its rows were read back from spill files (copied: the view columns must be
    /// wrapped again).
    fn read_back(&self) -> bool {
        match self {
            Emitter::Memory { .. } => false,
            Emitter::Spilled { .. } => true,
            Emitter::Grouped(g) => g.inner.read_back(),
        }
    }

    /// Up to `want` rows: data and per-row origins; `None` when the window is exhausted.
    fn next(
        &mut self,
        stage: &StageRef,
        want: usize,
        origins: &Origins,
    ) -> Result<Option<(RecordBatch, Vec<RowOrigin>)>> {
        match self {
            Emitter::Grouped(g) => g.next(stage, want, origins),
            Emitter::Memory {
                pieces,
                lineage,
                order,
                pos,
            } => {
                if *pos >= order.len() {
                    return Ok(None);
                }
                let end = (*pos + want).min(order.len());
                let idx = &order[*pos..end];
                *pos = end;
                let refs: Vec<&RecordBatch> = pieces.iter().collect();
                let rb = interleave_record_batch(&refs, idx).map_err(|e| arrow_err(stage, e))?;
                let rows = idx.iter().map(|(p, r)| lineage[*p][*r]).collect();
                Ok(Some((rb, rows)))
            }
            Emitter::Spilled { runs, left, rng } => {
                if *left == 0 {
                    return Ok(None);
                }
                let n = (want as u64).min(*left) as usize;
                let mut srcs: Vec<RecordBatch> = Vec::new();
                let mut src_of: Vec<Option<usize>> = vec![None; runs.len()];
                let mut idx = Vec::with_capacity(n);
                let mut rows = Vec::with_capacity(n);
                for _ in 0..n {
                    let k = pick_run(runs, *left, rng);
                    let run = &mut runs[k];
                    let reload = run
                        .chunk
                        .as_ref()
                        .is_none_or(|c| run.chunk_pos >= c.num_rows());
                    if reload || src_of[k].is_none() {
                        srcs.push(run.current(stage)?.clone());
                        src_of[k] = Some(srcs.len() - 1);
                    }
                    idx.push((src_of[k].unwrap_or(0), run.chunk_pos));
                    rows.push(run.lineage[run.next_row]);
                    run.chunk_pos += 1;
                    run.next_row += 1;
                    run.rows -= 1;
                    *left -= 1;
                }
                let refs: Vec<&RecordBatch> = srcs.iter().collect();
                let rb = interleave_record_batch(&refs, &idx).map_err(|e| arrow_err(stage, e))?;
                Ok(Some((rb, rows)))
            }
        }
    }

    /// Passes over up to `n` rows; returns how many were passed over.
    fn skip(&mut self, stage: &StageRef, n: usize, origins: &Origins) -> Result<usize> {
        match self {
            Emitter::Grouped(g) => g.skip(stage, n, origins),
            Emitter::Memory { order, pos, .. } => {
                let k = n.min(order.len() - *pos);
                *pos += k;
                Ok(k)
            }
            Emitter::Spilled { runs, left, rng } => {
                let k = (n as u64).min(*left) as usize;
                for _ in 0..k {
                    let i = pick_run(runs, *left, rng);
                    let run = &mut runs[i];
                    run.current(stage)?;
                    run.chunk_pos += 1;
                    run.next_row += 1;
                    run.rows -= 1;
                    *left -= 1;
                }
                Ok(k)
            }
        }
    }
}

impl Grouped {
    fn group_rows(&self) -> usize {
        self.spec.batches * self.spec.batch_size.max(1)
    }

    /// Takes the next group from the inner emitter and orders it; false when the window is
    /// exhausted.
    fn fill(&mut self, stage: &StageRef, origins: &Origins) -> Result<bool> {
        let Some((data, rows)) = self.inner.next(stage, self.group_rows(), origins)? else {
            return Ok(false);
        };
        let len = lengths(data.column(self.spec.column).as_ref()).ok_or_else(|| {
            Error::Internal(format!(
                "{stage}: `{}` has no lengths to group by",
                self.spec.name
            ))
        })?;
        let mut sorted: Vec<u32> = (0..data.num_rows() as u32).collect();
        sorted.sort_by_key(|&i| std::cmp::Reverse(len[i as usize]));
        let size = self.spec.batch_size.max(1);
        let mut batches: Vec<&[u32]> = sorted.chunks(size).collect();
        let full = sorted.len() / size;
        let mut rng = super::seeded_rng(
            self.seed,
            GROUP_DOMAIN.wrapping_add(self.groups),
            self.epoch,
            self.key,
        );
        batches[..full].shuffle(&mut rng);
        self.order = batches.concat();
        self.pos = 0;
        self.chunk = Some((data, rows));
        self.groups += 1;
        Ok(true)
    }

    fn next(
        &mut self,
        stage: &StageRef,
        want: usize,
        origins: &Origins,
    ) -> Result<Option<(RecordBatch, Vec<RowOrigin>)>> {
        if self.pos >= self.order.len() && !self.fill(stage, origins)? {
            return Ok(None);
        }
        let Some((data, lineage)) = &self.chunk else {
            return Err(Error::Internal(format!("{stage}: no group")));
        };
        let end = (self.pos + want).min(self.order.len());
        let idx = &self.order[self.pos..end];
        self.pos = end;
        let rb = take_record_batch(data, &UInt32Array::from(idx.to_vec()))
            .map_err(|e| arrow_err(stage, e))?;
        let rows = idx.iter().map(|&i| lineage[i as usize]).collect();
        Ok(Some((rb, rows)))
    }

    /// Passes over up to `n` rows: whole groups without reading or sorting them.
    fn skip(&mut self, stage: &StageRef, n: usize, origins: &Origins) -> Result<usize> {
        let mut done = 0;
        while done < n {
            if self.pos < self.order.len() {
                let k = (n - done).min(self.order.len() - self.pos);
                self.pos += k;
                done += k;
                continue;
            }
            let g = self.group_rows();
            if n - done >= g {
                let k = self.inner.skip(stage, g, origins)?;
                self.groups += 1;
                done += k;
                if k < g {
                    break;
                }
                continue;
            }
            if !self.fill(stage, origins)? {
                break;
            }
        }
        Ok(done)
    }
}

/// A run, with probability proportional to its remaining rows.
fn pick_run(runs: &[Run], left: u64, rng: &mut ChaCha8Rng) -> usize {
    let mut x = rng.random_range(0..left);
    for (i, r) in runs.iter().enumerate() {
        if x < r.rows {
            return i;
        }
        x -= r.rows;
    }
    runs.len() - 1
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, BinaryArray, FixedSizeBinaryArray, Int64Array, LargeBinaryArray};

    use super::*;

    /// Rows `from..to` of Kafka partition `p` (id = 1000 p + offset) as one batch.
    fn kafka_rows(p: i32, from: u64, to: u64) -> Batch {
        let ids = Int64Array::from_iter_values((from..to).map(|o| 1000 * p as i64 + o as i64));
        let rb = RecordBatch::try_from_iter([("id", Arc::new(ids) as ArrayRef)]).unwrap();
        let origin = Origin::Kafka {
            topic: Name::from("t"),
            partition: p,
        };
        Batch::new(rb, Lineage::new(origin, from, to - from, 0))
    }

    fn kafka_shuffler(resume: Option<&SourceState>) -> Shuffler {
        let spec = ShuffleSpec {
            buffer_rows: 100,
            max_memory: 1 << 20,
            spill_dir: None,
            seed: 5,
            batch_rows: 30,
            across_ranks: false,
            views: Vec::new(),
            group: None,
            rank: 0,
        };
        let stage = StageRef {
            index: 0,
            kind: "shuffle",
            location: None,
        };
        Shuffler::new(stage, spec, None, None).over_kafka(resume)
    }

    /// Feeds `input` and returns every output batch.
    fn run(s: &mut Shuffler, input: Vec<Batch>) -> Vec<Batch> {
        let mut out = Vec::new();
        for b in input {
            s.push(b).unwrap();
            while let Some(o) = s.next_output().unwrap() {
                out.push(o);
            }
        }
        s.finish().unwrap();
        while let Some(o) = s.next_output().unwrap() {
            out.push(o);
        }
        out
    }

    fn ids(batches: &[Batch]) -> Vec<i64> {
        batches
            .iter()
            .flat_map(|b| {
                b.data
                    .column(0)
                    .as_primitive::<arrow::datatypes::Int64Type>()
                    .values()
                    .to_vec()
            })
            .collect()
    }

    /// A Kafka window's output depends on its rows, not on how the partitions interleaved
    /// on arrival; and a shuffler restored from a position inside a window, fed the window's
    /// rows in yet another interleaving, emits exactly the rest of it, then goes on.
    #[test]
    fn kafka_windows_do_not_depend_on_arrival_order_and_resume_exactly() {
        // Window 0: partition 0 offsets 0..60 and partition 1 offsets 0..40; then 50 more.
        let a = vec![
            kafka_rows(0, 0, 60),
            kafka_rows(1, 0, 40),
            kafka_rows(1, 40, 60),
            kafka_rows(0, 60, 90),
        ];
        let b = vec![
            kafka_rows(1, 0, 25),
            kafka_rows(0, 0, 35),
            kafka_rows(1, 25, 40),
            kafka_rows(0, 35, 60),
            kafka_rows(0, 60, 90),
            kafka_rows(1, 40, 60),
        ];
        let out_a = run(&mut kafka_shuffler(None), a);
        let out_b = run(&mut kafka_shuffler(None), b);
        let (ia, ib) = (ids(&out_a), ids(&out_b));
        assert_eq!(
            ia[..100],
            ib[..100],
            "the first window, whatever the arrival"
        );
        assert_ne!(ia[..100], (0..100).collect::<Vec<i64>>()[..], "permuted");
        let mut sorted = ia.clone();
        sorted.sort_unstable();
        let mut want: Vec<i64> = (0..90).chain(1000..1060).collect();
        want.sort_unstable();
        assert_eq!(sorted, want);

        // The state after the second output batch (60 rows of window 0 out).
        let mut acker = crate::state::Acknowledger::new(None);
        for o in &out_a[..2] {
            acker.observe_batch(o);
        }
        let state = acker.state();
        let w = state.kafka_shuffle.clone().unwrap();
        assert_eq!((w.window, w.rows, w.emitted), (0, 100, 60));
        let kafka = state.kafka.clone().unwrap();
        assert_eq!(kafka.get("t", 0).unwrap().offset, 60);
        assert_eq!(kafka.get("t", 1).unwrap().offset, 40);
        // What a resumed source sends: the window's rows (another interleaving), then the rest.
        let replay = vec![
            kafka_rows(1, 0, 10),
            kafka_rows(0, 0, 60),
            kafka_rows(1, 10, 40),
            kafka_rows(1, 40, 60),
            kafka_rows(0, 60, 90),
        ];
        let rest = ids(&run(&mut kafka_shuffler(Some(&state)), replay));
        assert_eq!(rest[..40], ia[60..100], "the rest of the window");
        let mut all: Vec<i64> = ia[..60].iter().chain(&rest).copied().collect();
        all.sort_unstable();
        assert_eq!(all, want, "every row once");
        acker = crate::state::Acknowledger::new(Some(&state));
        assert_eq!(
            acker.state(),
            state,
            "a restored state is kept until a batch moves it"
        );

        // A replay that misses rows of the window is refused, saying which.
        let mut s = kafka_shuffler(Some(&state));
        s.push(kafka_rows(0, 0, 60)).unwrap();
        assert!(s.next_output().unwrap().is_none());
        s.push(kafka_rows(1, 5, 40)).unwrap();
        assert!(s.next_output().unwrap().is_none());
        s.push(kafka_rows(0, 60, 90)).unwrap();
        let e = s.next_output().unwrap_err().to_string();
        assert!(
            e.contains("cannot rebuild the shuffle window")
                && e.contains("t/1 from offset 0 to offset 40")
                && e.contains("only 95 of them were read again before kafka t/0, offset 60"),
            "{e}"
        );
    }

    /// Each column turned into views holds the same values and nulls, over the same buffer.
    #[test]
    fn views_point_at_the_same_bytes() {
        let fixed = FixedSizeBinaryArray::try_from_sparse_iter_with_size(
            (0..20u8).map(|i| (i % 7 != 3).then(|| vec![i; 48])),
            48,
        )
        .unwrap();
        let values: Vec<Option<Vec<u8>>> = (0..20u8)
            .map(|i| (i % 5 != 2).then(|| vec![i; 10 + i as usize]))
            .collect();
        let binary = BinaryArray::from_iter(values.iter().map(|v| v.as_deref()));
        let large = LargeBinaryArray::from_iter(values.iter().map(|v| v.as_deref()));
        let ids = Int64Array::from_iter_values(0..20);
        let rb = RecordBatch::try_from_iter([
            ("fixed", Arc::new(fixed) as ArrayRef),
            ("id", Arc::new(ids) as ArrayRef),
            ("binary", Arc::new(binary) as ArrayRef),
            ("large", Arc::new(large) as ArrayRef),
        ])
        .unwrap();
        // A slice, as the shuffle's window pieces usually are.
        let rb = rb.slice(3, 12);
        let v = views(&rb, &[0, 2, 3]).unwrap();
        assert_eq!(v.column(1), rb.column(1));
        for c in [0, 2, 3] {
            assert_eq!(v.schema().field(c).data_type(), &DataType::BinaryView);
            let got = v.column(c).as_binary_view();
            let data = rb.column(c).to_data();
            assert_eq!(got.nulls(), rb.column(c).nulls(), "column {c}");
            for r in 0..rb.num_rows() {
                let want: Option<&[u8]> = match rb.column(c).data_type() {
                    DataType::FixedSizeBinary(_) => {
                        let a = rb.column(c).as_fixed_size_binary();
                        a.is_valid(r).then(|| a.value(r))
                    }
                    DataType::Binary => {
                        let a = rb.column(c).as_binary::<i32>();
                        a.is_valid(r).then(|| a.value(r))
                    }
                    _ => {
                        let a = rb.column(c).as_binary::<i64>();
                        a.is_valid(r).then(|| a.value(r))
                    }
                };
                assert_eq!(
                    got.is_valid(r).then(|| got.value(r)),
                    want,
                    "column {c} row {r}"
                );
            }
            // No bytes were copied: the views point into the input's value buffer.
            let buffer = &data.buffers()[data.buffers().len() - 1];
            assert_eq!(got.data_buffers().len(), 1);
            assert_eq!(
                got.data_buffers()[0].as_ptr(),
                buffer.as_ptr(),
                "column {c}"
            );
        }
    }
}
