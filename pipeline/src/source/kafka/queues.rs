//! `static`: each assigned partition's own queue, split off the consumer's, and the wake-up
//! that tells the consumer thread one of them received messages.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::base_consumer::PartitionQueue;

use super::client::{SourceConsumer, SourceContext};

/// Wakes the consumer thread when a partition queue receives messages (librdkafka calls
/// back from its own thread when a queue goes from empty to non-empty).
#[derive(Debug, Default)]
pub(super) struct Wake {
    ready: Mutex<bool>,
    cv: std::sync::Condvar,
}

impl Wake {
    /// Forgets earlier wake-ups: called before the queues are polled, so that a message
    /// arriving after a queue was found empty still wakes [`Wake::wait`].
    pub(super) fn arm(&self) {
        *self.ready.lock().unwrap_or_else(|p| p.into_inner()) = false;
    }

    fn notify(&self) {
        *self.ready.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.cv.notify_one();
    }

    /// Waits for a wake-up since the last [`Wake::arm`], at most `timeout`.
    pub(super) fn wait(&self, timeout: Duration) {
        let ready = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self
            .cv
            .wait_timeout_while(ready, timeout, |ready| !*ready)
            .map_err(|p| p.into_inner());
    }
}

/// Splits each assigned partition's messages off the consumer's queue into a queue of its
/// own (before `assign`, so that none is fetched onto the consumer's queue), wired to wake the consumer thread.
pub(super) fn split_queues(
    consumer: &Arc<SourceConsumer>,
    topics: &[Arc<str>],
    partitions: impl IntoIterator<Item = (u16, i32)>,
    wake: &Arc<Wake>,
) -> Vec<((u16, i32), PartitionQueue<SourceContext>)> {
    partitions
        .into_iter()
        .filter_map(|(t, p)| {
            // `None` (unknown to librdkafka): its messages stay on the consumer's queue,
            // which is read too.
            let mut queue = consumer.split_partition_queue(&topics[t as usize], p)?;
            let wake = wake.clone();
            queue.set_nonempty_callback(move || wake.notify());
            Some(((t, p), queue))
        })
        .collect()
}
