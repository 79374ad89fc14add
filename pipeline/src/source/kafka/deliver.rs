//! A run's async side: starts the consumer thread, decodes its chunks on the CPU pool, sends
//! bad records to the dead letter (or stops), spends the error budget and sends the rows on.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use tokio::sync::mpsc;

use super::KafkaSource;
use super::dead_letter::{DeadLetter, describe, spend};
use super::decode::{BadRecord, ChunkDecoder, Decoded, RawChunk};
use super::queues::Wake;
use crate::batch::{Batch, Name};
use crate::error::{Error, Result};
use crate::runtime::CpuPool;
use crate::runtime::channel::Sender;
use crate::state::ErrorCounts;

impl KafkaSource {
    /// [`KafkaSource::run`], its error returned rather than sent.
    pub(super) async fn run_inner(
        self,
        tx: &Sender,
        pool: CpuPool,
        parallelism: usize,
    ) -> Result<()> {
        let brokers = self.config.brokers.0.join(",");
        let mut dead_letter = match &self.config.dead_letter {
            Some(d) => Some(DeadLetter::open(
                d,
                &self.config,
                &self.base_dir,
                self.rank,
            )?),
            None => None,
        };
        let wake = Arc::new(Wake::default());
        let queues = self.take_partitions(&brokers, &wake)?;

        let decoder = ChunkDecoder {
            format: self.config.format,
            schema: self.schema.clone(),
            topics: self.topics.iter().map(|t| Name::from(&**t)).collect(),
        };
        let (chunk_tx, mut chunk_rx) = mpsc::channel::<Result<RawChunk>>(2);
        let poller = self.poller(queues, wake, brokers.clone())?;
        let thread = std::thread::Builder::new()
            .name("sluice-kafka".into())
            .spawn(move || poller.run(chunk_tx))
            .map_err(|e| Error::Internal(format!("cannot start the Kafka thread: {e}")))?;

        let input = futures::stream::poll_fn(move |cx| chunk_rx.poll_recv(cx));
        let mut decoded = input
            .map(|item| {
                let decoder = decoder.clone();
                let pool = pool.clone();
                async move {
                    let chunk = item?;
                    // Where its records are, for the error budget's ledger (the records
                    // themselves go to the decoder).
                    let at: Vec<(u16, i32, i64)> = chunk
                        .records
                        .iter()
                        .map(|r| (r.topic, r.partition, r.offset))
                        .collect();
                    let d = pool.run(move || decoder.decode(chunk)).await?;
                    Ok::<_, Error>((at, d))
                }
            })
            .buffered(parallelism);
        // A resumed run goes on spending the budget of the run it continues: the counts of
        // the records below its positions come with the state, and those records, when read
        // again (a shuffle window rebuilt), are not counted twice.
        let restored = self.acker.restored_errors();
        let resume_at: HashMap<(u16, i32), i64> = self
            .resume_positions
            .iter()
            .flat_map(|done| done.iter())
            .filter_map(|(topic, p, pos)| {
                let t = self.topics.iter().position(|x| &**x == topic)?;
                Some(((t as u16, p), pos.offset))
            })
            .collect();
        let mut spent = restored;
        // Per partition, the offset past the last record this run has handled (its bad
        // records dead-lettered and counted). A consumer group that gives a partition back
        // after a rebalance replays it from the committed offset: the replayed good rows go on
        // again (at-least-once), but the bad records are in the dead-letter sink already and
        // counted; they are not written or counted a second time.
        let mut handled: HashMap<(u16, i32), i64> = HashMap::new();
        let mut result = Ok(());
        while let Some(d) = decoded.next().await {
            let (at, mut d) = match d {
                Ok(d) => d,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            self.drop_handled_bad(&mut d, &handled);
            if !d.bad.is_empty()
                && let Err(e) = self.divert_bad(&d.bad, dead_letter.as_mut()).await
            {
                result = Err(e);
                break;
            }
            if let Err(e) =
                self.spend_budget(&at, &d.bad, &handled, &resume_at, &mut spent, restored)
            {
                result = Err(e);
                break;
            }
            for &(t, p, o) in &at {
                let h = handled.entry((t, p)).or_insert(o + 1);
                *h = (*h).max(o + 1);
            }
            if !self.forward(d.batches, tx).await {
                break;
            }
        }
        drop(decoded);
        // The poller notices the closed channel within one poll interval.
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        result
    }

    /// Drops the bad records of `d` this run or the one it resumes has handled already.
    fn drop_handled_bad(&self, d: &mut Decoded, handled: &HashMap<(u16, i32), i64>) {
        // A bad record below a restored position is in the dead-letter sink already: a
        // chunk's bad records are durable before its good rows go on, and a position is
        // past a good row that came after them. Read again (to rebuild a shuffle window,
        // or replayed by a consumer group), it is not written or counted a second time.
        if let Some(done) = &self.resume_positions {
            d.bad.retain(|b| {
                done.get(&b.topic, b.partition)
                    .is_none_or(|p| b.offset >= p.offset)
            });
        }
        let topic_index = |topic: &str| self.topics.iter().position(|t| &**t == topic);
        let replayed = |t: u16, p: i32, o: i64| handled.get(&(t, p)).is_some_and(|h| o < *h);
        d.bad.retain(|b| {
            topic_index(&b.topic).is_none_or(|t| !replayed(t as u16, b.partition, b.offset))
        });
    }

    /// Counts a chunk's bad records and writes them to the dead-letter sink (durable when
    /// this returns); without one, the error that stops the run.
    async fn divert_bad(
        &self,
        bad: &[BadRecord],
        dead_letter: Option<&mut DeadLetter>,
    ) -> Result<()> {
        let m = &self.metrics.source;
        m.records_bad.fetch_add(bad.len() as u64, Ordering::Relaxed);
        for b in bad {
            m.with_partition(&b.topic, b.partition, |p| p.bad += 1);
        }
        match dead_letter {
            None => {
                return Err(Error::BadRecords {
                    message: format!(
                        "{} (source at {}). Nothing after it was delivered. To divert such records and keep going, add `dead_letter: {{type: file, path: …}}` (or `{{type: kafka, topic: …}}`) to the source",
                        describe(&bad[0]),
                        self.at
                    ),
                });
            }
            Some(dl) => {
                dl.write(bad).await?;
                m.records_dead_lettered
                    .fetch_add(bad.len() as u64, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Spends the error budget on a chunk's records at `at` (its remaining bad ones `bad`);
    /// the error that stops the run when it is exceeded.
    fn spend_budget(
        &self,
        at: &[(u16, i32, i64)],
        bad: &[BadRecord],
        handled: &HashMap<(u16, i32), i64>,
        resume_at: &HashMap<(u16, i32), i64>,
        spent: &mut ErrorCounts,
        restored: ErrorCounts,
    ) -> Result<()> {
        let replayed = |t: u16, p: i32, o: i64| handled.get(&(t, p)).is_some_and(|h| o < *h);
        // The records past the restored positions: counted, and handed to the ledger
        // that splits the counts at the positions a checkpoint records.
        let bad_at: HashSet<(&str, i32, i64)> = bad
            .iter()
            .map(|b| (&*b.topic, b.partition, b.offset))
            .collect();
        let records = self.acker.consumed(
            at.iter()
                .filter(|(t, p, o)| resume_at.get(&(*t, *p)).is_none_or(|done| o >= done))
                .filter(|(t, p, o)| !replayed(*t, *p, *o))
                .map(|&(t, p, o)| {
                    let topic = &self.topics[t as usize];
                    let bad = !bad_at.is_empty() && bad_at.contains(&(&**topic, p, o));
                    (topic, p, o, bad)
                }),
        );
        if let Err(why) = spend(spent, records, bad.len() as u64, &self.config.error_budget) {
            let before = if restored == ErrorCounts::default() {
                String::new()
            } else {
                format!(
                    "; counted from the first run: {} of the {} records before this resumed run were bad",
                    restored.bad, restored.records
                )
            };
            return Err(Error::BadRecords {
                message: format!(
                    "error budget exceeded: {why}{before} (source at {}; last: {}). The bad records are in the dead-letter sink; the rows before them were delivered",
                    self.at,
                    bad.last().map(describe).unwrap_or_default()
                ),
            });
        }
        Ok(())
    }

    /// Sends a chunk's good rows on, counted. Returns false when the stream was dropped.
    async fn forward(&self, batches: Vec<Batch>, tx: &Sender) -> bool {
        let m = &self.metrics.source;
        for b in batches {
            let rows = b.num_rows() as u64;
            m.rows.fetch_add(rows, Ordering::Relaxed);
            m.bytes_decoded
                .fetch_add(b.memory_size() as u64, Ordering::Relaxed);
            if !tx.send(Ok(b)).await {
                return false;
            }
        }
        true
    }
}
