//! The exchange of windows across ranks: rounds of `all_to_all_v` over the collective,
//! within the memory cap.

use arrow::array::{RecordBatch, UInt32Array};
use arrow::compute::{interleave_record_batch, take_record_batch};

use crate::batch::data_bytes;
use crate::error::Result;

use super::part::{decode_part, encode_part};
use super::spill::Run;
use super::{
    Emitter, RECEIVED_RUNS, RowOrigin, SENT_MERGE, Shuffler, WindowMark, arrow_err, err, shuffled,
};

impl Shuffler {
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
    pub(super) fn exchange_round(&mut self, have: bool) -> Result<bool> {
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
