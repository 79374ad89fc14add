//! A sink's claim on output in an object store: a lease object written with conditional puts.
//!
//! Object stores have neither advisory locks nor a way to learn that a writer died, so the
//! claim is a lease — hand-written because no maintained crate offers one over
//! `object_store`:
//!
//! - **take:** the lock object (`<dir>/.sluice.lock`, or `.<name>.sluice.lock` beside one file)
//!   is created only if absent (`PutMode::Create`, S3's `If-None-Match: *`);
//! - **keep:** it is rewritten every third of [`LEASE`] by a conditional update on the version
//!   this run wrote last (`PutMode::Update`, S3's `If-Match`), and a part is made visible only
//!   while the lease is known to be held (renewed within half a lease, else renewed first);
//! - **take over:** a lease the store last wrote more than its `lease_ms` ago belongs to a run
//!   that was killed or cut off; the next run replaces it with a conditional update on the
//!   version it read, so of two runs that find the same stale lease exactly one wins;
//! - **lose:** a renewal refused because the object changed (another run took a lapsed lease
//!   over) stops this run before it makes anything else visible;
//! - **release:** deleted when the sink finishes or aborts (if it is still ours).
//!
//! The staleness test compares the store's `last_modified` with this machine's clock: clocks
//! must agree to well within the lease (NTP does). Stores without conditional writes (plain
//! HTTP) get no claim, and a warning says so.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use object_store::path::Path;
use object_store::{
    ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, PutResult, UpdateVersion,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::{Error, Result};

/// How long a claim lasts without renewal: what a killed run's output stays blocked for.
pub(crate) const LEASE: Duration = Duration::from_secs(30);

/// What the lock object says: who holds it and for how long a renewal counts (the local
/// lock file says `describe()` of it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Holder {
    /// Unique per run: pid, host and start time.
    owner: String,
    pid: u32,
    host: String,
    /// When the run took the claim (RFC 3339).
    since: String,
    /// The holder's lease: its claim lapses this long after the store last wrote the object.
    lease_ms: u64,
}

impl Holder {
    /// This run, holding a claim for `lease`.
    pub(crate) fn ours(lease: Duration) -> Holder {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .unwrap_or_default()
            .trim()
            .to_string();
        let now = SystemTime::now();
        let nanos = now
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let pid = std::process::id();
        Holder {
            owner: format!("{pid}@{host}@{nanos}"),
            pid,
            host,
            since: humantime::format_rfc3339_seconds(now).to_string(),
            lease_ms: lease.as_millis() as u64,
        }
    }

    /// `pid … on … since …`: for the message of a refused run.
    pub(crate) fn describe(&self) -> String {
        format!("pid {} on {} since {}", self.pid, self.host, self.since)
    }
}

/// Where the lease stands, shared with the renewing task.
#[derive(Debug)]
struct State {
    /// The version this run wrote last: the only one it may replace.
    version: UpdateVersion,
    renewed: Instant,
    /// Why the claim is gone, once it is.
    lost: Option<String>,
}

#[derive(Debug)]
struct Shared {
    store: Arc<dyn ObjectStore>,
    path: Path,
    url: String,
    /// This run's `Holder::owner`.
    owner: String,
    body: PutPayload,
    lease: Duration,
    state: Mutex<State>,
}

/// A held claim; renewed in the background until [`Lease::release`] or drop.
#[derive(Debug)]
pub(crate) struct Lease {
    shared: Arc<Shared>,
    renewer: tokio::task::JoinHandle<()>,
}

fn version_of(r: PutResult) -> UpdateVersion {
    UpdateVersion {
        e_tag: r.e_tag,
        version: r.version,
    }
}

fn millis_since_epoch(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as i64
}

impl Lease {
    /// Claims the output whose lock object is `path` in `store` (`url` names the output in
    /// messages). `None` when the store has no conditional writes.
    pub(crate) async fn acquire(
        store: Arc<dyn ObjectStore>,
        path: Path,
        url: &str,
        lease: Duration,
    ) -> Result<Option<Lease>> {
        let holder = Holder::ours(lease);
        let body = PutPayload::from(serde_json::to_vec(&holder).unwrap_or_default());
        let err = |message: String| Error::Lock {
            url: url.to_string(),
            message,
        };
        // Two rounds: a lock deleted between a refused create and the read is created again.
        for _ in 0..2 {
            let create = PutOptions::from(PutMode::Create);
            let version = match store.put_opts(&path, body.clone(), create).await {
                Ok(r) => version_of(r),
                Err(object_store::Error::NotImplemented { .. }) => {
                    tracing::warn!(
                        "{url}: this store has no conditional writes, so Sluice cannot claim the output: make sure no other run writes here at the same time"
                    );
                    return Ok(None);
                }
                Err(object_store::Error::AlreadyExists { .. }) => {
                    match take_over(&store, &path, url, &body).await? {
                        Some(v) => v,
                        None => continue,
                    }
                }
                Err(e) => return Err(err(format!("cannot take the lock {path}: {e}"))),
            };
            let shared = Arc::new(Shared {
                store,
                path,
                url: url.to_string(),
                owner: holder.owner.clone(),
                body,
                lease,
                state: Mutex::new(State {
                    version,
                    renewed: Instant::now(),
                    lost: None,
                }),
            });
            let renewer = tokio::spawn(renew_forever(shared.clone()));
            return Ok(Some(Lease { shared, renewer }));
        }
        Err(err(format!(
            "the lock {path} kept appearing and vanishing: another run is starting or ending here; try again"
        )))
    }

    /// Succeeds while the claim is held, renewing it first when the last renewal is older than
    /// half a lease; call before making output visible.
    pub(crate) async fn ensure(&self) -> Result<()> {
        let mut state = self.shared.state.lock().await;
        if state.lost.is_none() && state.renewed.elapsed() > self.shared.lease / 2 {
            // Past half a lease without a renewal, a commit could outlive the claim.
            if !renew(&self.shared, &mut state).await && state.lost.is_none() {
                state.lost = Some(format!(
                    "its lease could not be renewed for {}",
                    humantime::format_duration(whole_ms(state.renewed.elapsed()))
                ));
            }
        }
        match &state.lost {
            None => Ok(()),
            Some(why) => Err(Error::Lock {
                url: self.shared.url.clone(),
                message: format!(
                    "this run lost its claim on the output ({why}), so it stops before making more of it visible; check that no other run writes here, then run again"
                ),
            }),
        }
    }

    /// Gives the claim up: stops renewing and deletes the lock object if it is still ours.
    pub(crate) async fn release(self) {
        // Taken before the renewer stops, so no renewal is in flight from here on.
        let state = self.shared.state.lock().await;
        self.renewer.abort();
        let s = &self.shared;
        // object_store has no conditional delete: read the holder, then delete. Another run
        // can take over in between only once this run's lease has lapsed; past half a lease
        // without a renewal the lock is left to lapse rather than risk deleting its new one.
        if state.renewed.elapsed() >= s.lease / 2 {
            return;
        }
        let still_ours = matches!(current(s).await, Some((h, _)) if h.owner == s.owner);
        if still_ours && let Err(e) = s.store.delete(&s.path).await {
            tracing::warn!(
                "{}: could not remove the lock {} ({e}); it lapses by itself in {}",
                s.url,
                s.path,
                humantime::format_duration(s.lease)
            );
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Without a release (a panic, a dropped future) the lock lapses after one lease.
        self.renewer.abort();
    }
}

/// The lock's holder and version as the store has them now (`None`: gone or unreadable).
async fn current(s: &Shared) -> Option<(Holder, UpdateVersion)> {
    let got = s.store.get(&s.path).await.ok()?;
    let version = UpdateVersion {
        e_tag: got.meta.e_tag.clone(),
        version: got.meta.version.clone(),
    };
    let holder = serde_json::from_slice(&got.bytes().await.ok()?).ok()?;
    Some((holder, version))
}

fn whole_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

/// Handles a lock that already exists: refuses while its holder's lease runs, takes it over
/// once lapsed. `Ok(None)`: it vanished before it could be read (try creating again).
async fn take_over(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    url: &str,
    body: &PutPayload,
) -> Result<Option<UpdateVersion>> {
    let refuse = |message: String| Error::Lock {
        url: url.to_string(),
        message,
    };
    let got = match store.get(path).await {
        Ok(g) => g,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(refuse(format!("cannot read the lock {path}: {e}"))),
    };
    let meta = got.meta.clone();
    let bytes = got
        .bytes()
        .await
        .map_err(|e| refuse(format!("cannot read the lock {path}: {e}")))?;
    let holder: Option<Holder> = serde_json::from_slice(&bytes).ok();
    let lease_ms = holder
        .as_ref()
        .map_or(LEASE.as_millis() as u64, |h| h.lease_ms);
    // A lease past i64 (a hand-edited lock) counts as never lapsing.
    let lease_ms = i64::try_from(lease_ms).unwrap_or(i64::MAX);
    let age_ms =
        millis_since_epoch(SystemTime::now()).saturating_sub(meta.last_modified.timestamp_millis());
    let who = holder.as_ref().map_or_else(
        || "a holder Sluice cannot read".to_string(),
        Holder::describe,
    );
    if age_ms < lease_ms {
        let left = Duration::from_millis(lease_ms.saturating_sub(age_ms).max(0) as u64);
        return Err(refuse(format!(
            "another run is writing this output ({who}; lock {path}, renewed {} ago): wait for it to finish, or write elsewhere; if that run is gone, its claim lapses in {}",
            humantime::format_duration(Duration::from_millis(age_ms.max(0) as u64)),
            humantime::format_duration(left)
        )));
    }
    let update = PutOptions::from(PutMode::Update(UpdateVersion {
        e_tag: meta.e_tag,
        version: meta.version,
    }));
    match store.put_opts(path, body.clone(), update).await {
        Ok(r) => {
            tracing::warn!(
                "{url}: took over the claim from an earlier run ({who}) whose lease lapsed {} ago: it was killed or lost the store",
                humantime::format_duration(Duration::from_millis(
                    age_ms.saturating_sub(lease_ms).max(0) as u64
                ))
            );
            Ok(Some(version_of(r)))
        }
        Err(object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. }) => {
            Err(refuse(format!(
                "another run is writing this output: it took over the lapsed lock {path} just now; wait for it to finish, or write elsewhere"
            )))
        }
        Err(e) => Err(refuse(format!(
            "cannot take over the lapsed lock {path}: {e}"
        ))),
    }
}

/// One renewal, `true` when it took; a refused one marks the claim lost, a failed one is
/// retried until the lease would have lapsed.
async fn renew(s: &Shared, state: &mut State) -> bool {
    let update = PutOptions::from(PutMode::Update(state.version.clone()));
    match s.store.put_opts(&s.path, s.body.clone(), update).await {
        Ok(r) => {
            state.version = version_of(r);
            state.renewed = Instant::now();
            return true;
        }
        Err(object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. }) => {
            // A renewal that timed out may have landed all the same: the lock then holds this
            // run's owner under a version this run never saw.
            if let Some((holder, version)) = current(s).await
                && holder.owner == s.owner
            {
                state.version = version;
                state.renewed = Instant::now();
                return true;
            }
            state.lost = Some(format!(
                "another run replaced or removed its lock {} after this run's lease lapsed (last renewed {} ago)",
                s.path,
                humantime::format_duration(whole_ms(state.renewed.elapsed()))
            ));
        }
        Err(e) if state.renewed.elapsed() >= s.lease => {
            state.lost = Some(format!(
                "its lock {} could not be renewed for a whole lease: {e}",
                s.path
            ));
        }
        Err(e) => tracing::warn!(
            "{}: renewing the lock {} failed (retried): {e}",
            s.url,
            s.path
        ),
    }
    false
}

async fn renew_forever(s: Arc<Shared>) {
    loop {
        tokio::time::sleep((s.lease / 3).max(Duration::from_millis(10))).await;
        let mut state = s.state.lock().await;
        renew(&s, &mut state).await;
        if let Some(why) = &state.lost {
            tracing::error!("{}: this run lost its claim on the output: {why}", s.url);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use object_store::memory::InMemory;

    use super::*;

    fn store() -> Arc<dyn ObjectStore> {
        Arc::new(InMemory::new())
    }

    fn lock() -> Path {
        Path::from("out/.sluice.lock")
    }

    async fn holder_of(store: &Arc<dyn ObjectStore>) -> Holder {
        let bytes = store.get(&lock()).await.unwrap().bytes().await.unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    fn message(e: Error) -> String {
        e.to_string()
    }

    #[tokio::test]
    async fn a_held_lease_refuses_a_second_claim_until_released() {
        let s = store();
        let a = Lease::acquire(s.clone(), lock(), "mem://out", LEASE)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(holder_of(&s).await.pid, std::process::id());
        let err = message(
            Lease::acquire(s.clone(), lock(), "mem://out", LEASE)
                .await
                .unwrap_err(),
        );
        assert!(
            err.contains("another run is writing this output (pid ")
                && err.contains("its claim lapses in"),
            "{err}"
        );
        a.ensure().await.unwrap();
        a.release().await;
        assert!(s.head(&lock()).await.is_err(), "the lock was not removed");
        let b = Lease::acquire(s.clone(), lock(), "mem://out", LEASE).await;
        assert!(b.unwrap().is_some());
    }

    #[tokio::test]
    async fn a_lapsed_lease_is_taken_over_by_exactly_one_run() {
        let s = store();
        // What a killed run leaves: a lease nobody renews (here one that lapsed at once).
        let dead = Lease::acquire(s.clone(), lock(), "mem://out", Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        dead.renewer.abort();
        std::mem::forget(dead);
        let (a, b) = tokio::join!(
            Lease::acquire(s.clone(), lock(), "mem://out", LEASE),
            Lease::acquire(s.clone(), lock(), "mem://out", LEASE)
        );
        let won = [&a, &b].iter().filter(|r| matches!(r, Ok(Some(_)))).count();
        assert_eq!(won, 1, "{a:?} {b:?}");
        let lost = if a.is_err() { a } else { b };
        let err = message(lost.unwrap_err());
        assert!(err.contains("another run is writing this output"), "{err}");
    }

    #[tokio::test]
    async fn a_run_whose_lock_was_taken_over_stops_before_committing() {
        let s = store();
        // A lease of zero: every check renews first, like a run that paused past its lease.
        let a = Lease::acquire(s.clone(), lock(), "mem://out", Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        a.ensure().await.unwrap();
        // Another run finds it lapsed and takes it over.
        let b = Lease::acquire(s.clone(), lock(), "mem://out", LEASE)
            .await
            .unwrap()
            .unwrap();
        let err = message(a.ensure().await.unwrap_err());
        assert!(
            err.contains("this run lost its claim on the output (another run replaced"),
            "{err}"
        );
        // The loser's release leaves the winner's lock alone.
        a.release().await;
        assert_eq!(holder_of(&s).await.lease_ms, LEASE.as_millis() as u64);
        b.ensure().await.unwrap();
    }

    /// A renewal that timed out but landed leaves the lock under a version the run never saw:
    /// still its own (the owner says so), not lost; and release still removes it.
    #[tokio::test]
    async fn a_renewal_that_landed_unseen_is_not_a_lost_claim() {
        let s = store();
        let a = Lease::acquire(s.clone(), lock(), "mem://out", Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        a.renewer.abort();
        let body = s.get(&lock()).await.unwrap().bytes().await.unwrap();
        s.put(&lock(), PutPayload::from(body)).await.unwrap();
        a.ensure().await.unwrap();
        let b = Lease::acquire(s.clone(), lock(), "mem://out", LEASE)
            .await
            .unwrap()
            .unwrap();
        b.release().await;
        assert!(s.head(&lock()).await.is_err(), "the lock was not removed");
    }

    #[tokio::test]
    async fn a_lock_sluice_cannot_read_is_refused_not_replaced() {
        let s = store();
        s.put(&lock(), PutPayload::from_static(b"not json"))
            .await
            .unwrap();
        let err = message(
            Lease::acquire(s.clone(), lock(), "mem://out", LEASE)
                .await
                .unwrap_err(),
        );
        assert!(err.contains("a holder Sluice cannot read"), "{err}");
    }
}
