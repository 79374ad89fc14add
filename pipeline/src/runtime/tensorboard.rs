//! TensorBoard event files (`trainer.tensorboard`): scalars per step, in the format
//! TensorBoard's own reader takes — TFRecord framing (length, masked CRC-32C of it, the
//! record, masked CRC-32C of it) around `tensorflow.Event` protobufs.
//!
//! The protobuf is written by hand: an `Event` holding `wall_time`, `step` and a `Summary` of
//! `(tag, simple_value)` pairs is five fields, and a protobuf toolchain (prost + a build
//! script + vendored `.proto` files) would cost more build time than the whole format.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// One run's event file, appended to step by step and flushed after each.
#[derive(Debug)]
pub struct EventWriter {
    file: BufWriter<File>,
    path: PathBuf,
}

impl EventWriter {
    /// A new event file in `dir` (created), named as TensorBoard expects
    /// (`events.out.tfevents.<seconds>.<host>.<pid>.sluice`), starting with the version record.
    pub fn create(dir: &Path) -> std::io::Result<EventWriter> {
        std::fs::create_dir_all(dir)?;
        let now = wall_time();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".into());
        let name = format!(
            "events.out.tfevents.{}.{host}.{}.sluice",
            now as u64,
            std::process::id()
        );
        let path = dir.join(name);
        let mut w = EventWriter {
            file: BufWriter::new(File::create(&path)?),
            path,
        };
        let mut event = Vec::new();
        field_f64(&mut event, 1, now);
        field_bytes(&mut event, 3, b"brain.Event:2");
        w.record(&event)?;
        w.file.flush()?;
        Ok(w)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes one event at `step` holding every `(tag, value)` (NaN values are left out).
    pub fn scalars(&mut self, step: u64, values: &[(&str, f64)]) -> std::io::Result<()> {
        let mut summary = Vec::new();
        for (tag, v) in values.iter().filter(|(_, v)| !v.is_nan()) {
            let mut value = Vec::new();
            field_bytes(&mut value, 1, tag.as_bytes());
            value.push((2 << 3) | 5); // simple_value: float, fixed 32-bit
            value.extend_from_slice(&(*v as f32).to_le_bytes());
            field_bytes(&mut summary, 1, &value);
        }
        let mut event = Vec::new();
        field_f64(&mut event, 1, wall_time());
        event.push(2 << 3); // step: int64, varint
        varint(&mut event, step);
        field_bytes(&mut event, 5, &summary);
        self.record(&event)?;
        self.file.flush()
    }

    fn record(&mut self, data: &[u8]) -> std::io::Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        self.file.write_all(&len)?;
        self.file.write_all(&masked_crc(&len).to_le_bytes())?;
        self.file.write_all(data)?;
        self.file.write_all(&masked_crc(data).to_le_bytes())
    }
}

fn wall_time() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// TFRecord's masked CRC-32C.
fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32;
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited field (string, bytes, embedded message).
fn field_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, (field << 3) | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A double field (fixed 64-bit).
fn field_f64(out: &mut Vec<u8>, field: u64, v: f64) {
    varint(out, (field << 3) | 1);
    out.extend_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The CRC-32C check value, and TFRecord's masking of it.
    #[test]
    fn crc32c_and_its_mask() {
        let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, b"123456789") as u32;
        assert_eq!(crc, 0xe306_9283);
        assert_eq!(masked_crc(b""), 0xa282_ead8);
    }

    /// Records are framed as length, masked CRC of it, data, masked CRC of it.
    #[test]
    fn records_are_framed_with_their_lengths_and_checksums() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        w.scalars(3, &[("train/loss", 0.5), ("skip", f64::NAN)])
            .unwrap();
        let bytes = std::fs::read(w.path()).unwrap();
        let mut at = 0;
        let mut records = Vec::new();
        while at < bytes.len() {
            let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
            let lcrc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
            assert_eq!(lcrc, masked_crc(&bytes[at..at + 8]));
            let data = &bytes[at + 12..at + 12 + len];
            let dcrc = u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap());
            assert_eq!(dcrc, masked_crc(data));
            records.push(data.to_vec());
            at += 16 + len;
        }
        assert_eq!(records.len(), 2);
        assert!(records[0].windows(13).any(|w| w == b"brain.Event:2"));
        assert!(records[1].windows(10).any(|w| w == b"train/loss"));
        assert!(!records[1].windows(4).any(|w| w == b"skip"), "NaN left out");
    }
}
