//! librdkafka's error callbacks, logged without the flood: librdkafka repeats the same error
//! many times (hundreds of "all brokers down" within a millisecond while a broker is
//! unreachable, two more every 50 ms after), and rdkafka's default context logs every one.
//! Each distinct error is logged once per [`REPEAT_LOG_INTERVAL`]; repeats go to `debug`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::error::KafkaError;

/// How often the same librdkafka error is logged again.
pub const REPEAT_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// A librdkafka client context that logs errors as above: for producers (the Kafka sink, a
/// Kafka dead-letter sink); the Kafka source's context logs through it too.
#[derive(Debug, Default)]
pub struct KafkaLog {
    repeats: Repeats,
    /// The last error that says why (`reason (error)`), for messages: "all brokers down"
    /// follows the error that says why (a refused certificate, a failed login), so it does
    /// not replace one.
    last: LastError,
}

/// The last error a [`KafkaLog`] kept, readable where the client's context is not (rdkafka's
/// `FutureProducer` wraps its context out of reach).
#[derive(Debug, Default, Clone)]
pub struct LastError(std::sync::Arc<Mutex<Option<String>>>);

impl LastError {
    /// The last error that says why, if any.
    pub fn get(&self) -> Option<String> {
        self.0.lock().ok().and_then(|e| e.clone())
    }
}

impl KafkaLog {
    /// The last error librdkafka reported (see `last`), if any.
    pub fn last_error(&self) -> Option<String> {
        self.last.get()
    }

    /// A handle on the last error, to read after the log is moved into a client.
    pub fn last_error_handle(&self) -> LastError {
        self.last.clone()
    }

    /// Logs `error` (with librdkafka's `reason`) unless the same was logged lately, and
    /// keeps it as the last error.
    pub fn error(&self, error: &KafkaError, reason: &str) {
        let generic = matches!(
            error.rdkafka_error_code(),
            Some(rdkafka::types::RDKafkaErrorCode::AllBrokersDown)
        );
        if let Ok(mut e) = self.last.0.lock()
            && (!generic || e.is_none())
        {
            *e = Some(format!("{reason} ({error}){}", hint(reason)));
        }
        let text = format!("{error}: {reason}");
        if self
            .repeats
            .fresh(&text, Instant::now(), REPEAT_LOG_INTERVAL)
        {
            tracing::warn!(target: "sluice::kafka", "{text}");
        } else {
            tracing::debug!(target: "sluice::kafka", "{text} (again)");
        }
    }
}

/// What to do about a librdkafka error, when its text says, for the kept last error.
/// librdkafka adds its own `ssl.ca.location` hint to some refused certificates but not to all
/// (it depends on how far the handshake got), so a message could name the setting or not
/// from one run to the next.
fn hint(reason: &str) -> &'static str {
    if reason.contains("certificate verify failed") && !reason.contains("ssl.ca.location") {
        "; the brokers' certificate is not trusted here: set `ssl.ca.location` in `properties` to the CA certificate (PEM) that signed it"
    } else {
        ""
    }
}

impl ClientContext for KafkaLog {
    fn error(&self, error: KafkaError, reason: &str) {
        KafkaLog::error(self, &error, reason);
    }
}

/// When each distinct message was last let through (at most 256 remembered).
#[derive(Debug, Default)]
struct Repeats(Mutex<HashMap<String, Instant>>);

impl Repeats {
    /// Whether `text` was not let through within `interval` before `now` (and, if so,
    /// remembers it now).
    fn fresh(&self, text: &str, now: Instant, interval: Duration) -> bool {
        self.0.lock().map_or(true, |mut seen| {
            let fresh = seen
                .get(text)
                .is_none_or(|at| now.duration_since(*at) >= interval);
            if fresh {
                if seen.len() >= 256 {
                    seen.clear(); // bounded: many distinct errors are logged again later
                }
                seen.insert(text.to_string(), now);
            }
            fresh
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused certificate always names the setting to fix, whether or not librdkafka's
    /// text does.
    #[test]
    fn a_refused_certificate_names_ssl_ca_location() {
        let bare = "ssl://127.0.0.1:1/bootstrap: error:0A000086:SSL routines::certificate verify failed (after 3ms in state SSL_HANDSHAKE)";
        assert!(hint(bare).contains("`ssl.ca.location`"));
        assert_eq!(
            hint(&format!(
                "{bare}: verify that ssl.ca.location is correctly configured"
            )),
            ""
        );
        assert_eq!(hint("Connection refused"), "");
    }

    /// The same librdkafka error is let through once per interval, each distinct one on its
    /// own, and the memory of them stays bounded.
    #[test]
    fn a_repeated_error_is_logged_once_per_interval() {
        let r = Repeats::default();
        let t0 = Instant::now();
        let every = Duration::from_secs(30);
        let down = "AllBrokersDown: 1/1 brokers are down";
        let through: Vec<bool> = (0..300u64)
            .map(|i| r.fresh(down, t0 + Duration::from_millis(i), every))
            .collect();
        assert_eq!(through.iter().filter(|f| **f).count(), 1);
        assert!(r.fresh("BrokerTransportFailure: refused", t0, every));
        assert!(!r.fresh(down, t0 + Duration::from_secs(29), every));
        assert!(r.fresh(down, t0 + Duration::from_secs(30), every));
        for i in 0..1000 {
            assert!(r.fresh(&format!("error {i}"), t0, every));
        }
        assert!(r.0.lock().unwrap().len() <= 256);
    }
}
