//! The `local` backend: ranks are threads of one process and exchange through shared memory.
//!
//! Every operation is one rendezvous: each rank deposits its contribution; the last to arrive
//! publishes all contributions at once (an `Arc`, no copy); each rank takes what it needs and
//! the rendezvous resets when every rank has taken its part. A rank cannot deposit for the next
//! operation before the previous one has been taken by all, so operations never mix. Dropping
//! a handle (or a panic on its thread, which drops it) abandons the group: every waiting and
//! later call on the other ranks returns [`CollectiveError::Abandoned`].

use std::any::Any;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use half::f16;

use super::{Collective, CollectiveError, CollectiveResult};

type Payload = Box<dyn Any + Send + Sync>;

struct Contribution {
    op: &'static str,
    payload: Payload,
}

#[derive(Default)]
struct State {
    slots: Vec<Option<Contribution>>,
    arrived: usize,
    published: Option<Arc<Vec<Contribution>>>,
    taken: usize,
    abandoned_by: Option<usize>,
}

struct Shared {
    world: usize,
    state: Mutex<State>,
    cv: Condvar,
}

/// One rank's handle on a local group. Create a group with [`LocalCollective::group`] and move
/// one handle to each rank's thread.
pub struct LocalCollective {
    rank: usize,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for LocalCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "LocalCollective(rank {} of {})",
            self.rank, self.shared.world
        )
    }
}

impl LocalCollective {
    /// `world_size` handles, one per rank, in rank order.
    pub fn group(world_size: usize) -> Vec<LocalCollective> {
        let world = world_size.max(1);
        let shared = Arc::new(Shared {
            world,
            state: Mutex::new(State {
                slots: (0..world).map(|_| None).collect(),
                ..State::default()
            }),
            cv: Condvar::new(),
        });
        (0..world)
            .map(|rank| LocalCollective {
                rank,
                shared: shared.clone(),
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state half-updated in a way that
        // matters: the panicking rank's handle is dropped and abandons the group.
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn wait<'a>(&self, guard: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.shared
            .cv
            .wait(guard)
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Deposits this rank's contribution and returns everyone's, in rank order.
    fn exchange(
        &self,
        op: &'static str,
        payload: Payload,
    ) -> CollectiveResult<Arc<Vec<Contribution>>> {
        let world = self.shared.world;
        let mut st = self.lock();
        // The previous operation must be fully taken before this one starts.
        while st.published.is_some() && st.abandoned_by.is_none() {
            st = self.wait(st);
        }
        if let Some(rank) = st.abandoned_by {
            return Err(CollectiveError::Abandoned { rank, op });
        }
        st.slots[self.rank] = Some(Contribution { op, payload });
        st.arrived += 1;
        if st.arrived == world {
            let all: Vec<Contribution> = st.slots.iter_mut().filter_map(Option::take).collect();
            st.arrived = 0;
            st.taken = 0;
            st.published = Some(Arc::new(all));
            self.shared.cv.notify_all();
        } else {
            while st.published.is_none() && st.abandoned_by.is_none() {
                st = self.wait(st);
            }
            if st.published.is_none()
                && let Some(rank) = st.abandoned_by
            {
                return Err(CollectiveError::Abandoned { rank, op });
            }
        }
        let all = st
            .published
            .clone()
            .ok_or_else(|| CollectiveError::Backend("rendezvous lost its result".into()))?;
        st.taken += 1;
        if st.taken == world {
            st.published = None;
            self.shared.cv.notify_all();
        }
        drop(st);
        if let Some(other) = all.iter().find(|c| c.op != op) {
            return Err(CollectiveError::Mismatch {
                op,
                detail: format!("another rank called `{}` at the same point", other.op),
            });
        }
        Ok(all)
    }
}

impl Drop for LocalCollective {
    fn drop(&mut self) {
        let mut st = self.lock();
        if st.abandoned_by.is_none() {
            st.abandoned_by = Some(self.rank);
        }
        self.shared.cv.notify_all();
    }
}

fn payload<'a, T: 'static>(c: &'a Contribution, op: &'static str) -> CollectiveResult<&'a T> {
    c.payload
        .downcast_ref::<T>()
        .ok_or_else(|| CollectiveError::Mismatch {
            op,
            detail: "ranks passed different kinds of data".into(),
        })
}

fn check_len(op: &'static str, mine: usize, theirs: usize) -> CollectiveResult<()> {
    if mine != theirs {
        return Err(CollectiveError::Mismatch {
            op,
            detail: format!("buffer of {mine} elements here, {theirs} on another rank"),
        });
    }
    Ok(())
}

impl Collective for LocalCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.world
    }

    fn all_reduce_f32(&self, buf: &mut [f32]) -> CollectiveResult<()> {
        const OP: &str = "all_reduce_f32";
        let all = self.exchange(OP, Box::new(buf.to_vec()))?;
        buf.fill(0.0);
        for c in all.iter() {
            let v: &Vec<f32> = payload(c, OP)?;
            check_len(OP, buf.len(), v.len())?;
            for (b, x) in buf.iter_mut().zip(v) {
                *b += *x;
            }
        }
        Ok(())
    }

    fn all_reduce_f16(&self, buf: &mut [f16]) -> CollectiveResult<()> {
        const OP: &str = "all_reduce_f16";
        let all = self.exchange(OP, Box::new(buf.to_vec()))?;
        let mut acc = vec![0f32; buf.len()];
        for c in all.iter() {
            let v: &Vec<f16> = payload(c, OP)?;
            check_len(OP, buf.len(), v.len())?;
            for (a, x) in acc.iter_mut().zip(v) {
                *a += x.to_f32();
            }
        }
        for (b, a) in buf.iter_mut().zip(acc) {
            *b = f16::from_f32(a);
        }
        Ok(())
    }

    fn all_to_all_v(&self, send: Vec<Vec<u8>>) -> CollectiveResult<Vec<Vec<u8>>> {
        const OP: &str = "all_to_all_v";
        if send.len() != self.shared.world {
            return Err(CollectiveError::Mismatch {
                op: OP,
                detail: format!(
                    "{} destinations for a world of {}",
                    send.len(),
                    self.shared.world
                ),
            });
        }
        let all = self.exchange(OP, Box::new(send))?;
        all.iter()
            .map(|c| payload::<Vec<Vec<u8>>>(c, OP).map(|v| v[self.rank].clone()))
            .collect()
    }

    fn all_gather(&self, data: Vec<u8>) -> CollectiveResult<Vec<Vec<u8>>> {
        const OP: &str = "all_gather";
        let all = self.exchange(OP, Box::new(data))?;
        all.iter()
            .map(|c| payload::<Vec<u8>>(c, OP).cloned())
            .collect()
    }

    fn broadcast(&self, buf: &mut Vec<u8>, root: usize) -> CollectiveResult<()> {
        const OP: &str = "broadcast";
        if root >= self.shared.world {
            return Err(CollectiveError::Mismatch {
                op: OP,
                detail: format!("root {root} in a world of {}", self.shared.world),
            });
        }
        let mine: Option<Vec<u8>> = (self.rank == root).then(|| std::mem::take(buf));
        let all = self.exchange(OP, Box::new(mine))?;
        let from_root: &Option<Vec<u8>> = payload(&all[root], OP)?;
        match from_root {
            Some(v) => {
                *buf = v.clone();
                Ok(())
            }
            None => Err(CollectiveError::Mismatch {
                op: OP,
                detail: format!("rank {root} did not call broadcast as the root"),
            }),
        }
    }

    fn barrier(&self) -> CollectiveResult<()> {
        self.exchange("barrier", Box::new(())).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T: Send + 'static>(
        world: usize,
        f: impl Fn(LocalCollective) -> T + Send + Sync + Clone + 'static,
    ) -> Vec<T> {
        let handles: Vec<_> = LocalCollective::group(world)
            .into_iter()
            .map(|c| {
                let f = f.clone();
                std::thread::spawn(move || f(c))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn all_reduce_sums_in_rank_order_identically_everywhere() {
        for world in [1, 2, 4] {
            let out = run(world, move |c| {
                let mut v: Vec<f32> = (0..1000)
                    .map(|i| (i as f32 + 0.1) * (c.rank() as f32 + 1.0) / 3.0)
                    .collect();
                for _ in 0..5 {
                    c.all_reduce_f32(&mut v).unwrap();
                }
                v
            });
            for v in &out[1..] {
                assert_eq!(
                    v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    out[0].iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                );
            }
            let expect = (0..world).map(|r| r as f32 + 1.0).sum::<f32>();
            let w = (world as f32).powi(4);
            assert!((out[0][3] - 3.1 / 3.0 * expect * w).abs() < 1e-2 * out[0][3].abs());
        }
    }

    #[test]
    fn f16_all_reduce_accumulates_in_f32() {
        let out = run(4, |c| {
            let mut v = vec![f16::from_f32(0.1); 8];
            c.all_reduce_f16(&mut v).unwrap();
            v[0].to_f32()
        });
        for x in out {
            assert!((x - 0.4).abs() < 1e-3, "{x}");
        }
    }

    #[test]
    fn all_to_all_delivers_each_piece_to_its_rank() {
        let out = run(3, |c| {
            let send: Vec<Vec<u8>> = (0..3).map(|to| vec![c.rank() as u8, to as u8, 7]).collect();
            c.all_to_all_v(send).unwrap()
        });
        for (me, got) in out.iter().enumerate() {
            for (from, piece) in got.iter().enumerate() {
                assert_eq!(piece, &vec![from as u8, me as u8, 7]);
            }
        }
    }

    #[test]
    fn broadcast_gather_min_and_barrier() {
        let out = run(4, |c| {
            let mut buf = if c.rank() == 2 {
                b"from two".to_vec()
            } else {
                Vec::new()
            };
            c.broadcast(&mut buf, 2).unwrap();
            c.barrier().unwrap();
            let gathered = c.all_gather(vec![c.rank() as u8]).unwrap();
            let min = c.all_min_u64(10 + c.rank() as u64 * 3).unwrap();
            (buf, gathered, min)
        });
        for (buf, gathered, min) in out {
            assert_eq!(buf, b"from two");
            assert_eq!(gathered, vec![vec![0], vec![1], vec![2], vec![3]]);
            assert_eq!(min, 10);
        }
    }

    #[test]
    fn a_rank_that_leaves_fails_the_others_instead_of_hanging() {
        let out = run(3, |c| {
            if c.rank() == 1 {
                drop(c);
                return None;
            }
            let mut v = vec![1.0f32; 4];
            Some(c.all_reduce_f32(&mut v))
        });
        for r in out.into_iter().flatten() {
            assert_eq!(
                r,
                Err(CollectiveError::Abandoned {
                    rank: 1,
                    op: "all_reduce_f32"
                })
            );
        }
    }

    #[test]
    fn mismatched_operations_are_reported() {
        let out = run(2, |c| {
            if c.rank() == 0 {
                c.barrier().map(|_| ())
            } else {
                c.all_gather(vec![1]).map(|_| ())
            }
        });
        assert!(
            out.iter()
                .all(|r| matches!(r, Err(CollectiveError::Mismatch { .. })))
        );
    }
}
