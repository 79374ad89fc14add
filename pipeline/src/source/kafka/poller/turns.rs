//! `static`: the partitions read in turn — each partition's next message held as its head,
//! one turn over the partition queues, and the wait for a partition still delivering its
//! backlog.

use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::message::BorrowedMessage;
use tokio::sync::mpsc;

use super::{BACKLOG_WAIT, POLL_INTERVAL, Poller, Reading};
use crate::error::Result;
use crate::source::kafka::OutageBudget;
use crate::source::kafka::client::SourceContext;
use crate::source::kafka::decode::RawChunk;

impl Poller {
    /// `static`: polls the next message of each partition queue whose head is empty into
    /// that head. `Err` when the run must stop.
    pub(super) fn fill_heads<'q>(
        &mut self,
        st: &mut Reading,
        heads: &mut [Option<BorrowedMessage<'q>>],
        queues: &'q [((u16, i32), PartitionQueue<SourceContext>)],
        tx: &mpsc::Sender<Result<RawChunk>>,
    ) -> std::result::Result<(), ()> {
        for (head, queue) in heads.iter_mut().zip(queues) {
            if head.is_none() {
                let Ok(next) = self.next_in(st, queue, tx) else {
                    return Err(());
                };
                *head = next;
            }
        }
        Ok(())
    }

    /// `static`: one turn over the partition queues, starting at the `turn`-th, taking up to
    /// `per_turn` messages of each (a partition's head first). Returns how many it took;
    /// `Err` when the run must stop.
    pub(super) fn take_turn<'q>(
        &mut self,
        st: &mut Reading,
        queues: &'q [((u16, i32), PartitionQueue<SourceContext>)],
        heads: &mut [Option<BorrowedMessage<'q>>],
        turn: usize,
        per_turn: usize,
        tx: &mpsc::Sender<Result<RawChunk>>,
    ) -> std::result::Result<usize, ()> {
        let mut taken = 0usize;
        for k in 0..queues.len() {
            let i = (turn + k) % queues.len();
            for _ in 0..per_turn {
                if st.left == Some(0) {
                    break;
                }
                let m = match heads[i].take() {
                    Some(m) => m,
                    None => match self.next_in(st, &queues[i], tx) {
                        Err(()) => return Err(()),
                        // A partition still delivering its backlog: its next record is waited
                        // for, so that a turn takes the same records whatever the fetch timing.
                        Ok(None) => match self.backlog_next(st, &queues[i], tx) {
                            Err(()) => return Err(()),
                            Ok(None) => break,
                            Ok(Some(m)) => m,
                        },
                        Ok(Some(m)) => m,
                    },
                };
                taken += 1;
                self.message(st, &m);
                drop(m);
                if !self.flush_if_due(st, tx) {
                    return Err(());
                }
            }
        }
        Ok(taken)
    }

    /// The next message of a partition's queue, handling the events before it (its end,
    /// errors); `None` when there is none now, `Err` when the run must stop.
    fn next_in<'q>(
        &mut self,
        st: &mut Reading,
        (key, queue): &'q ((u16, i32), PartitionQueue<SourceContext>),
        tx: &mpsc::Sender<Result<RawChunk>>,
    ) -> std::result::Result<Option<BorrowedMessage<'q>>, ()> {
        loop {
            match queue.poll(Duration::ZERO) {
                None => return Ok(None),
                Some(Ok(m)) => return Ok(Some(m)),
                Some(Err(e)) => {
                    if !self.queue_event(st, *key, e, tx) {
                        return Err(());
                    }
                }
            }
        }
    }

    /// `static`: the next message of partition `key`, waited for while the partition has not
    /// caught up with its backlog (up to [`BACKLOG_WAIT`]); `None` at once for one that has,
    /// or that reached its end. `Err` when the run must stop.
    fn backlog_next<'q>(
        &mut self,
        st: &mut Reading,
        entry: &'q ((u16, i32), PartitionQueue<SourceContext>),
        tx: &mpsc::Sender<Result<RawChunk>>,
    ) -> std::result::Result<Option<BorrowedMessage<'q>>, ()> {
        let (key, queue) = entry;
        let since = Instant::now();
        let consumer = self.consumer.clone();
        loop {
            // The consumer's own queue carries the callbacks (statistics, broker errors)
            // that say whether this partition caught up and whether the brokers are there.
            self.poll_consumer(st, &consumer, std::slice::from_ref(entry), tx)?;
            self.sync_caught_up(st);
            if st.caught_up.contains(key) || st.done.get(key) == Some(&true) {
                return Ok(None);
            }
            if tx.is_closed() || !self.within_outage_budget(st, tx) {
                return Err(());
            }
            if st.deadline.is_some_and(|d| Instant::now() >= d) || st.left == Some(0) {
                return Ok(None);
            }
            if since.elapsed() >= BACKLOG_WAIT.max(self.batch_timeout) {
                self.pass_over(st, &[*key], since.elapsed());
                return Ok(None);
            }
            let going_on = match queue.poll(POLL_INTERVAL) {
                Some(Ok(m)) => return Ok(Some(m)),
                Some(Err(e)) => self.queue_event(st, *key, e, tx),
                None => true,
            };
            if !going_on {
                return Err(());
            }
            // Chunks cut so far still go out on time while this partition is waited for.
            if !self.flush_if_due(st, tx) {
                return Err(());
            }
        }
    }

    /// Whether the next turn may be taken: at once when every partition not at its end has a
    /// head; else once the wait since `waiting` is over — as long as it takes (up to
    /// [`BACKLOG_WAIT`], then a warning) while a lagging partition has not caught up with its
    /// backlog, at most `batch_timeout` once it has.
    pub(super) fn turn_due(
        &self,
        st: &mut Reading,
        queues: &[((u16, i32), PartitionQueue<SourceContext>)],
        heads: &[Option<BorrowedMessage<'_>>],
        waiting: &mut Option<Instant>,
    ) -> bool {
        self.sync_caught_up(st);
        // The partitions with nothing to take that are not at their end: those still owing
        // their backlog (`true`) and those caught up.
        let lagging: Vec<((u16, i32), bool)> = queues
            .iter()
            .zip(heads)
            .filter(|((key, _), head)| head.is_none() && st.done.get(key) != Some(&true))
            .map(|((key, _), _)| (*key, !st.caught_up.contains(key)))
            .collect();
        let cap = if lagging.iter().any(|(_, backlog)| *backlog) {
            BACKLOG_WAIT.max(self.batch_timeout)
        } else if !lagging.is_empty() {
            self.batch_timeout
        } else {
            *waiting = None;
            return true;
        };
        let over = waiting.get_or_insert_with(Instant::now).elapsed() >= cap;
        if over && cap > self.batch_timeout {
            let stuck: Vec<(u16, i32)> = lagging
                .iter()
                .filter(|(_, backlog)| *backlog)
                .map(|(key, _)| *key)
                .collect();
            self.pass_over(st, &stuck, cap);
        }
        over
    }

    /// Partitions `keys` delivered nothing of their backlog for `waited`: from now on they
    /// are treated as caught up (waited for at most `batch_timeout`), and the first time this
    /// happens a warning says the order now depends on timing.
    fn pass_over(&self, st: &mut Reading, keys: &[(u16, i32)], waited: Duration) {
        st.caught_up.extend(keys.iter().copied());
        if !st.warned_backlog && !keys.is_empty() {
            st.warned_backlog = true;
            let names: Vec<String> = keys
                .iter()
                .map(|(t, p)| format!("{}/{p}", self.topics[*t as usize]))
                .collect();
            tracing::warn!(
                "kafka {}: records still to deliver, but nothing arrived for {}: going on without waiting for them, so the order of this run's rows now depends on timing",
                names.join(", "),
                humantime::format_duration(Duration::from_secs(waited.as_secs()))
            );
        }
    }

    /// An event from partition `key`'s own queue: its end is that partition's (the event
    /// itself names no topic). Returns false when the run must stop.
    fn queue_event(
        &mut self,
        st: &mut Reading,
        key: (u16, i32),
        e: rdkafka::error::KafkaError,
        tx: &mpsc::Sender<Result<RawChunk>>,
    ) -> bool {
        if let rdkafka::error::KafkaError::PartitionEOF(p) = e {
            st.caught_up.insert(key);
            self.reached_end(st, p);
            return true;
        }
        self.event(st, Err(e), tx)
    }

    /// Adds the partitions librdkafka's statistics show caught up to `st.caught_up`.
    fn sync_caught_up(&self, st: &mut Reading) {
        let ctx = self.consumer.context();
        let seen: Vec<(u16, i32)> = st
            .partitions
            .iter()
            .filter(|k| !st.caught_up.contains(k))
            .filter(|(t, p)| ctx.caught_up(&self.topics[*t as usize], *p))
            .copied()
            .collect();
        st.caught_up.extend(seen);
    }

    /// While no broker is reachable: says so once, with the budget, and stops the run once
    /// the outage outlasts `outage_budget` (false: the error was sent).
    pub(super) fn within_outage_budget(
        &mut self,
        st: &mut Reading,
        tx: &mpsc::Sender<Result<RawChunk>>,
    ) -> bool {
        let Some((down, why)) = self.consumer.context().outage() else {
            self.outage_said = false;
            return true;
        };
        let budget = match self.outage_budget {
            OutageBudget::Within(b) => b,
            OutageBudget::Forever => Duration::MAX,
        };
        if !self.outage_said {
            self.outage_said = true;
            let until = match self.outage_budget {
                OutageBudget::Within(b) => format!("for up to {}", humantime::format_duration(b)),
                OutageBudget::Forever => "as long as it takes".to_string(),
            };
            tracing::warn!(
                "kafka {}: no broker reachable ({why}); waiting {until} (`outage_budget`), then reading goes on where it stopped",
                self.brokers
            );
        }
        if down < budget {
            return true;
        }
        let _ = self.flush(st, tx);
        let _ = tx.blocking_send(Err(crate::source::kafka::kafka_err(
            &self.brokers,
            format!(
                "no broker reachable for {} (`outage_budget`): {why}. Check that the brokers are up and reachable, or raise `outage_budget` (`forever` waits as long as it takes); a checkpoint resumes where this run stopped",
                humantime::format_duration(Duration::from_secs(down.as_secs()))
            ),
        )));
        false
    }
}
