//! Which generator seeded augmentations draw from: a version recorded in every state, so a
//! run resumed from an older Sluice's checkpoint keeps drawing the values that run would have
//! drawn.

use serde::{Deserialize, Serialize};

/// How `gaussian_noise` draws its random numbers (every other seeded stage draws from ChaCha8
/// in both versions). A state records the version of the run that wrote it; a run resumed
/// from it keeps that version, so its values continue exactly where the interrupted run's
/// would have gone. A fresh run takes the newest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub enum Draws {
    /// 1 (absent: every state written before version 2): ChaCha8, keyed per column, the row
    /// identity as its stream.
    ChaCha8,
    /// 2: SplitMix64, by position in a stream started at a hash of the column's key and the
    /// row identity — ~10× cheaper per word than ChaCha8 and computed for a whole row at once.
    SplitMix64,
    /// 3: five AES rounds of a counter (ARS, `stage::ars`), by position in the same stream as
    /// version 2 — on CPUs with AES-NI but without AVX-512 ~4× cheaper per word than
    /// SplitMix64.
    #[default]
    Ars,
}

impl Draws {
    /// What a state that does not say was written with.
    pub fn first() -> Self {
        Draws::ChaCha8
    }

    /// The version the ranks' `states` of one run share (today's for none). States of
    /// different versions are refused: whichever version a run continuing them took, some
    /// rows would get other values than their run gave them.
    pub fn of(states: &[super::SourceState]) -> Result<Self, String> {
        let draws = states.first().map_or_else(Draws::default, |s| s.draws);
        if states.iter().any(|s| s.draws != draws) {
            return Err(
                "the ranks' states were drawn with different draws versions: they are not from one run".into(),
            );
        }
        Ok(draws)
    }
}

impl From<Draws> for u32 {
    fn from(d: Draws) -> u32 {
        match d {
            Draws::ChaCha8 => 1,
            Draws::SplitMix64 => 2,
            Draws::Ars => 3,
        }
    }
}

impl TryFrom<u32> for Draws {
    type Error = String;

    fn try_from(v: u32) -> Result<Self, String> {
        match v {
            1 => Ok(Draws::ChaCha8),
            2 => Ok(Draws::SplitMix64),
            3 => Ok(Draws::Ars),
            _ => Err(format!(
                "draws version {v} is not one this Sluice knows: 1 (ChaCha8), 2 (SplitMix64) or 3 (ARS) (in a checkpoint, it means a newer Sluice wrote it: resume it with that one, or start over without it)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::SourceState;

    #[test]
    fn a_state_without_a_version_was_drawn_with_chacha8() {
        let old: SourceState = serde_json::from_str("{}").unwrap();
        assert_eq!(old.draws, Draws::ChaCha8);
        let now = SourceState::default();
        assert_eq!(now.draws, Draws::Ars);
        let text = serde_json::to_string(&now).unwrap();
        assert!(text.contains(r#""draws":3"#), "{text}");
        let back: SourceState = serde_json::from_str(&text).unwrap();
        assert_eq!(back, now);
    }

    /// States of one interrupted run carry one version; states drawn otherwise cannot be
    /// continued together (some rows would get other values than their run gave them).
    #[test]
    fn states_of_different_draws_do_not_continue_together() {
        let old = SourceState {
            draws: Draws::ChaCha8,
            ..SourceState::default()
        };
        let err = SourceState::next_epoch(&[old.clone(), SourceState::default()])
            .err()
            .unwrap();
        assert!(err.contains("different draws versions"), "{err}");
        let next = SourceState::next_epoch(&[old.clone(), old]).unwrap();
        assert_eq!(next.state.draws, Draws::ChaCha8);
    }

    #[test]
    fn a_newer_version_is_refused_by_name() {
        let err = serde_json::from_str::<SourceState>(r#"{"draws": 4}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("draws version 4 is not one"), "{err}");
        assert!(err.contains("a newer Sluice wrote it"), "{err}");
    }
}
