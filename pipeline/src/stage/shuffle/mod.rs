//! The `shuffle` stage's window buffer.
//!
//! Rows are collected into windows of `buffer_rows` consecutive rows (a window never spans
//! epochs). A full window is permuted and emitted in batches of `batch_rows`:
//!
//! - **in memory** when the window's Arrow memory stays under `max_memory`: one Fisher–Yates
//!   permutation of `(piece, row)` indices, rows gathered with `interleave` (one copy; the
//!   view columns' views by [`gather`], which asks for them ahead);
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
use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::RecordBatch;
use chacha20::ChaCha8Rng;
use rand::seq::SliceRandom;

use crate::batch::{Batch, Lineage, LineageSpan, Mark, Origin, ShuffleMark};
use crate::collective::Collective;
use crate::error::{Error, Result, StageRef};
use crate::state::{KafkaMark, KafkaWindow};

mod emit;
mod exchange;
mod gather;
mod group;
mod kafka;
mod part;
pub(crate) mod settings;
mod spill;
#[cfg(test)]
mod tests;
mod view;
mod window;

use group::Grouped;
pub(crate) use group::{GroupSpec, group_spec};
use kafka::KafkaFeed;
use spill::Run;
pub(crate) use view::{view_schema, views};

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
        // One span per row at most (a shuffled batch has about that many).
        let mut l = Lineage::with_capacity(rows.size_hint().0);
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

/// Where the output of a window restarts.
#[derive(Debug, Clone)]
enum WindowMark {
    /// A Parquet pipeline: the window's first input row.
    Parquet(Mark),
    /// A Kafka stream: the window's rows, as positions.
    Kafka(Arc<KafkaWindow>),
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
}
