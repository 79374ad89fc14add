//! Kafka records → Arrow batches, on the CPU pool. A chunk of records from the consumer
//! becomes one batch (`json`, `raw`) or one batch per message (`arrow_ipc`); records that
//! cannot be decoded are returned, with the reason, for the dead-letter sink.

use std::io::Cursor;
use std::ops::Range;
use std::sync::Arc;

use arrow::array::ListBuilder;
use arrow::array::{
    ArrayRef, BinaryBuilder, RecordBatch, StringBuilder, StructBuilder, TimestampMillisecondArray,
};
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use arrow::ipc::reader::StreamReader;

use super::KafkaFormat;
use crate::batch::{Batch, Lineage, LineageSpan, Name, Origin};

/// One consumed record: where it is in the chunk's buffers and where it came from.
#[derive(Debug, Clone)]
pub(crate) struct RecordMeta {
    /// Index into the source's topic list.
    pub topic: u16,
    pub partition: i32,
    pub offset: i64,
    /// Milliseconds since the epoch, when the record has one.
    pub timestamp: Option<i64>,
    pub key: Option<Range<usize>>,
    pub value: Option<Range<usize>>,
    /// `raw` only: header name/value pairs.
    pub headers: Option<Vec<(String, Option<Vec<u8>>)>>,
    /// `arrow_ipc` only: rows of this message already delivered before a resume.
    pub skip_rows: u64,
    /// `arrow_ipc` only: deliver only the rows before this one (a resumed shuffle window
    /// that ends inside the message).
    pub take_rows: Option<u64>,
}

/// The rows of an Arrow IPC stream message, read from its record-batch headers without
/// decoding a body (for `until: {records: N}`, which counts rows); `None` when the framing is
/// not an IPC stream (the record is bad and counts as one). Hand-written because arrow-rs
/// reads headers only together with bodies; the framing is the IPC format's
/// (`0xFFFFFFFF`, length, flatbuffer `Message`, body), pre-1.0 streams without the marker too.
pub(crate) fn ipc_rows(value: &[u8]) -> Option<u64> {
    let (mut at, mut rows) = (0usize, 0u64);
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(value.get(at..at + 4)?.try_into().ok()?))
    };
    loop {
        let mut len = word(at)?;
        at += 4;
        if len == 0xFFFF_FFFF {
            len = word(at)?;
            at += 4;
        }
        if len == 0 {
            return Some(rows); // end of stream
        }
        let header = value.get(at..at.checked_add(len as usize)?)?;
        let message = arrow::ipc::root_as_message(header).ok()?;
        if let Some(batch) = message.header_as_record_batch() {
            rows += u64::try_from(batch.length()).ok()?;
        }
        let body = usize::try_from(message.bodyLength()).ok()?;
        at = at.checked_add(len as usize)?.checked_add(body)?;
        if at >= value.len() {
            // A stream without its end marker.
            return (at == value.len()).then_some(rows);
        }
    }
}

/// Records as consumed, before decoding. Keys and values live in two flat buffers: no
/// allocation per record.
#[derive(Debug, Default)]
pub(crate) struct RawChunk {
    pub records: Vec<RecordMeta>,
    pub keys: Vec<u8>,
    pub values: Vec<u8>,
}

impl RawChunk {
    pub fn bytes(&self) -> usize {
        self.keys.len() + self.values.len()
    }

    pub fn value(&self, r: &RecordMeta) -> Option<&[u8]> {
        r.value.clone().map(|v| &self.values[v])
    }

    pub fn key(&self, r: &RecordMeta) -> Option<&[u8]> {
        r.key.clone().map(|k| &self.keys[k])
    }
}

/// A record that could not be decoded.
#[derive(Debug, Clone)]
pub struct BadRecord {
    /// Topic.
    pub topic: Arc<str>,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Record timestamp (ms), if any.
    pub timestamp: Option<i64>,
    /// The original key.
    pub key: Option<Vec<u8>>,
    /// The original value.
    pub value: Option<Vec<u8>>,
    /// Why it could not be decoded.
    pub error: String,
}

/// The result of decoding a chunk.
#[derive(Debug, Default)]
pub(crate) struct Decoded {
    pub batches: Vec<Batch>,
    pub bad: Vec<BadRecord>,
    /// Records consumed (good + bad).
    pub records: u64,
}

/// Decodes chunks of one source.
#[derive(Debug, Clone)]
pub(crate) struct ChunkDecoder {
    pub format: KafkaFormat,
    pub schema: SchemaRef,
    /// The topics, interned for the rows' lineage (`RecordMeta::topic` indexes them).
    pub topics: Arc<[Name]>,
}

/// Schema of the `raw` format.
pub(crate) fn raw_schema() -> Schema {
    Schema::new(vec![
        Field::new("key", DataType::Binary, true),
        Field::new("value", DataType::Binary, true),
        Field::new(
            "timestamp",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            true,
        ),
        Field::new(
            "headers",
            DataType::List(Arc::new(Field::new(
                "item",
                DataType::Struct(header_fields()),
                true,
            ))),
            true,
        ),
    ])
}

fn header_fields() -> Fields {
    Fields::from(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("value", DataType::Binary, true),
    ])
}

/// Reads the schema of an Arrow IPC stream message.
pub(crate) fn ipc_schema(value: &[u8]) -> Result<SchemaRef, String> {
    StreamReader::try_new(Cursor::new(value), None)
        .map(|r| r.schema())
        .map_err(|e| format!("not an Arrow IPC stream: {e}"))
}

/// Whether two schemas carry the same columns (names and types; nullability and metadata
/// are not compared).
/// Whether a message's columns fit the declared ones: same names in order and the same types,
/// where a declared nullable field (the only kind `schema:` declares) also takes a non-null
/// one, at any depth — a `kafka` sink after an `image` stage writes
/// `FixedSizeList<Float32, non-null>`, which `"float32[784]"` must read.
pub(crate) fn fits(message: &Schema, declared: &Schema) -> bool {
    message.fields().len() == declared.fields().len()
        && message
            .fields()
            .iter()
            .zip(declared.fields().iter())
            .all(|(m, d)| m.name() == d.name() && field_fits(m, d))
}

fn field_fits(m: &arrow::datatypes::Field, d: &arrow::datatypes::Field) -> bool {
    (d.is_nullable() || !m.is_nullable()) && type_fits(m.data_type(), d.data_type())
}

fn type_fits(m: &DataType, d: &DataType) -> bool {
    match (m, d) {
        (DataType::List(a), DataType::List(b))
        | (DataType::LargeList(a), DataType::LargeList(b)) => field_fits(a, b),
        (DataType::FixedSizeList(a, n), DataType::FixedSizeList(b, k)) => {
            n == k && field_fits(a, b)
        }
        (DataType::Struct(a), DataType::Struct(b)) => {
            a.len() == b.len()
                && a.iter()
                    .zip(b.iter())
                    .all(|(x, y)| x.name() == y.name() && field_fits(x, y))
        }
        _ => m.equals_datatype(d),
    }
}

/// A schema as `schema:` would declare it, with what is non-null said:
/// `{id: int64 (non-null), x: float32[4] (items non-null)}`.
fn describe(schema: &Schema) -> String {
    fn ty(t: &DataType) -> String {
        match t {
            DataType::FixedSizeList(f, n) => format!("{}[{n}]", ty(f.data_type())),
            DataType::List(f) | DataType::LargeList(f) => format!("list<{}>", ty(f.data_type())),
            other => other.to_string().to_ascii_lowercase(),
        }
    }
    let fields: Vec<String> = schema
        .fields()
        .iter()
        .map(|f| {
            let mut notes = Vec::new();
            if !f.is_nullable() {
                notes.push("non-null");
            }
            if let DataType::FixedSizeList(item, _) | DataType::List(item) = f.data_type()
                && !item.is_nullable()
            {
                notes.push("items non-null");
            }
            let notes = if notes.is_empty() {
                String::new()
            } else {
                format!(" ({})", notes.join(", "))
            };
            format!("{}: {}{notes}", f.name(), ty(f.data_type()))
        })
        .collect();
    format!("{{{}}}", fields.join(", "))
}

/// A decoded message batch in the declared schema: as is when the types are equal, else
/// each column whose nested nullability differs cast to the declared type (a relabelling:
/// the values are not converted).
fn to_declared(b: RecordBatch, schema: &SchemaRef) -> Result<RecordBatch, String> {
    // Equal types (nested field names included) need only the schema swapped.
    let equal = b
        .schema()
        .fields()
        .iter()
        .zip(schema.fields())
        .all(|(a, d)| a.data_type() == d.data_type());
    if equal {
        return b.with_schema(schema.clone()).map_err(|e| e.to_string());
    }
    let columns = b
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| arrow::compute::cast(c, f.data_type()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("cannot read the message's columns as the declared types: {e}"))?;
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| e.to_string())
}

impl ChunkDecoder {
    fn bad(&self, chunk: &RawChunk, r: &RecordMeta, error: String) -> BadRecord {
        BadRecord {
            topic: Arc::from(&*self.topics[r.topic as usize]),
            partition: r.partition,
            offset: r.offset,
            timestamp: r.timestamp,
            key: chunk.key(r).map(<[u8]>::to_vec),
            value: chunk.value(r).map(<[u8]>::to_vec),
            error,
        }
    }

    fn row_lineage(&self, records: &[&RecordMeta]) -> Lineage {
        let mut l = Lineage::default();
        for r in records {
            l.push(LineageSpan {
                origin: Origin::Kafka {
                    topic: self.topics[r.topic as usize],
                    partition: r.partition,
                },
                first: r.offset as u64,
                len: 1,
                epoch: 0,
            });
        }
        l
    }

    pub fn decode(&self, chunk: RawChunk) -> Decoded {
        let records = chunk.records.len() as u64;
        let mut out = match self.format {
            KafkaFormat::Json => self.decode_json(&chunk),
            KafkaFormat::ArrowIpc => self.decode_ipc(&chunk),
            KafkaFormat::Raw => self.decode_raw(&chunk),
        };
        out.records = records;
        out
    }

    fn decode_raw(&self, chunk: &RawChunk) -> Decoded {
        let n = chunk.records.len();
        let mut keys = BinaryBuilder::with_capacity(n, chunk.keys.len());
        let mut values = BinaryBuilder::with_capacity(n, chunk.values.len());
        let mut headers = ListBuilder::new(StructBuilder::from_fields(header_fields(), 0));
        for r in &chunk.records {
            keys.append_option(chunk.key(r));
            values.append_option(chunk.value(r));
            match &r.headers {
                Some(hs) if !hs.is_empty() => {
                    let s = headers.values();
                    for (k, v) in hs {
                        if let Some(b) = s.field_builder::<StringBuilder>(0) {
                            b.append_value(k);
                        }
                        if let Some(b) = s.field_builder::<BinaryBuilder>(1) {
                            b.append_option(v.as_deref());
                        }
                        s.append(true);
                    }
                    headers.append(true);
                }
                _ => headers.append(true),
            }
        }
        let ts = TimestampMillisecondArray::from_iter(chunk.records.iter().map(|r| r.timestamp));
        let columns: Vec<ArrayRef> = vec![
            Arc::new(keys.finish()) as ArrayRef,
            Arc::new(values.finish()) as ArrayRef,
            Arc::new(ts),
            Arc::new(headers.finish()),
        ];
        let all: Vec<&RecordMeta> = chunk.records.iter().collect();
        let mut out = Decoded::default();
        match RecordBatch::try_new(self.schema.clone(), columns) {
            Ok(data) => out.batches.push(Batch::new(data, self.row_lineage(&all))),
            Err(e) => {
                // Only a bug could get here; keep every record rather than lose them.
                for r in &chunk.records {
                    out.bad.push(self.bad(
                        chunk,
                        r,
                        format!("internal error building raw rows: {e}"),
                    ));
                }
            }
        }
        out
    }

    fn decode_ipc(&self, chunk: &RawChunk) -> Decoded {
        let mut out = Decoded::default();
        for r in &chunk.records {
            match self.decode_ipc_message(chunk, r) {
                Ok(Some(b)) => out.batches.push(b),
                Ok(None) => {}
                Err(e) => out.bad.push(self.bad(chunk, r, e)),
            }
        }
        out
    }

    fn decode_ipc_message(
        &self,
        chunk: &RawChunk,
        r: &RecordMeta,
    ) -> Result<Option<Batch>, String> {
        let value = chunk
            .value(r)
            .ok_or_else(|| "the message has no value (null payload)".to_string())?;
        let reader = StreamReader::try_new(Cursor::new(value), None)
            .map_err(|e| format!("not an Arrow IPC stream: {e}"))?;
        if !fits(&reader.schema(), &self.schema) {
            return Err(format!(
                "Arrow schema differs from the source's: message has {}, the source declares {}",
                describe(&reader.schema()),
                describe(&self.schema)
            ));
        }
        let mut parts = Vec::new();
        for b in reader {
            let b = b.map_err(|e| format!("cannot decode Arrow IPC record batch: {e}"))?;
            parts.push(to_declared(b, &self.schema)?);
        }
        let data = arrow::compute::concat_batches(&self.schema, &parts)
            .map_err(|e| format!("cannot join the message's record batches: {e}"))?;
        let rows = data.num_rows() as u64;
        let end = r.take_rows.map_or(rows, |t| t.min(rows));
        let skip = r.skip_rows.min(end);
        if skip == end {
            return Ok(None);
        }
        let origin = Origin::KafkaMessage {
            topic: self.topics[r.topic as usize],
            partition: r.partition,
            offset: r.offset,
            rows,
        };
        let data = data.slice(skip as usize, (end - skip) as usize);
        Ok(Some(Batch::new(
            data,
            Lineage::new(origin, skip, end - skip, 0),
        )))
    }

    fn json_decoder(&self, n: usize) -> Result<arrow::json::reader::Decoder, String> {
        arrow::json::ReaderBuilder::new(self.schema.clone())
            .with_batch_size(n.max(1))
            .build_decoder()
            .map_err(|e| format!("cannot build a JSON decoder for the schema: {e}"))
    }

    /// JSON: feed every record to one decoder, checking after each that it was exactly one
    /// complete value. A syntactically bad record is set aside; the good ones before it are
    /// decoded again into their own batch (a tape decoder cannot be rewound). Type errors show
    /// only when the rows are built (`flush`): then the run is bisected to find them.
    fn decode_json(&self, chunk: &RawChunk) -> Decoded {
        let mut out = Decoded::default();
        let mut good: Vec<&RecordMeta> = Vec::with_capacity(chunk.records.len());
        // Start (in `good`) of the records the current decoder holds.
        let mut segment = 0;
        let mut decoder = match self.json_decoder(chunk.records.len()) {
            Ok(d) => d,
            Err(e) => {
                for r in &chunk.records {
                    out.bad.push(self.bad(chunk, r, e.clone()));
                }
                return out;
            }
        };
        for r in &chunk.records {
            let before = decoder.len();
            let value = chunk.value(r).unwrap_or_default();
            let ok = match decoder.decode(value) {
                Ok(used) if used == value.len() => {
                    if decoder.has_partial_record() {
                        Err("truncated JSON: the message ends inside a value".to_string())
                    } else if decoder.len() == before {
                        Err("the message holds no JSON value".to_string())
                    } else if decoder.len() > before + 1 {
                        Err(format!(
                            "the message holds {} JSON values; expected one object per message",
                            decoder.len() - before
                        ))
                    } else {
                        Ok(())
                    }
                }
                Ok(_) => Err("the message holds more than one JSON value".to_string()),
                Err(e) => Err(format!("invalid JSON: {e}")),
            };
            match ok {
                Ok(()) => good.push(r),
                Err(e) => {
                    // The decoder holds a broken value now. The good records since the last
                    // bad one become a batch of their own (decoded again, once), and a fresh
                    // decoder takes the records after this one: each record is fed at most
                    // twice however many bad ones there are.
                    self.bisect_json(chunk, &good[segment..], &mut out);
                    segment = good.len();
                    out.bad.push(self.bad(chunk, r, e));
                    decoder = match self.json_decoder(chunk.records.len()) {
                        Ok(d) => d,
                        Err(_) => return out,
                    };
                }
            }
        }
        let rest = &good[segment..];
        match decoder.flush() {
            Ok(Some(data)) if data.num_rows() == rest.len() => {
                out.batches.push(Batch::new(data, self.row_lineage(rest)));
            }
            Ok(None) if rest.is_empty() => {}
            _ => self.bisect_json(chunk, rest, &mut out),
        }
        out.bad.sort_by_key(|b| (b.partition, b.offset));
        out
    }

    /// Builds rows for `records` (each a single whole JSON value), splitting the run in halves
    /// until the records whose values do not fit the schema are isolated.
    fn bisect_json(&self, chunk: &RawChunk, records: &[&RecordMeta], out: &mut Decoded) {
        if records.is_empty() {
            return;
        }
        let attempt = self.json_decoder(records.len()).and_then(|mut d| {
            for r in records {
                d.decode(chunk.value(r).unwrap_or_default())
                    .map_err(|e| e.to_string())?;
            }
            d.flush().map_err(|e| e.to_string())
        });
        match attempt {
            Ok(Some(data)) if data.num_rows() == records.len() => {
                out.batches
                    .push(Batch::new(data, self.row_lineage(records)));
            }
            Ok(_) if records.len() == 1 => {
                out.bad.push(self.bad(
                    chunk,
                    records[0],
                    "the JSON value does not produce one row".into(),
                ));
            }
            Err(e) if records.len() == 1 => {
                out.bad.push(self.bad(
                    chunk,
                    records[0],
                    format!("JSON does not match the declared schema: {e}"),
                ));
            }
            _ => {
                let mid = records.len() / 2;
                self.bisect_json(chunk, &records[..mid], out);
                self.bisect_json(chunk, &records[mid..], out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{AsArray, Int64Array};
    use arrow::datatypes::Int64Type;

    fn chunk(values: &[&[u8]]) -> RawChunk {
        let mut c = RawChunk::default();
        for (i, v) in values.iter().enumerate() {
            let start = c.values.len();
            c.values.extend_from_slice(v);
            c.records.push(RecordMeta {
                topic: 0,
                partition: (i % 2) as i32,
                offset: i as i64,
                timestamp: Some(1000 + i as i64),
                key: None,
                value: Some(start..c.values.len()),
                headers: None,
                skip_rows: 0,
                take_rows: None,
            });
        }
        c
    }

    /// The `id` column (first) of every decoded batch, in order.
    fn ids(out: &Decoded) -> Vec<i64> {
        out.batches
            .iter()
            .flat_map(|b| {
                b.data
                    .column(0)
                    .as_primitive::<Int64Type>()
                    .values()
                    .to_vec()
            })
            .collect()
    }

    fn json_decoder() -> ChunkDecoder {
        ChunkDecoder {
            format: KafkaFormat::Json,
            schema: Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, true),
                Field::new(
                    "x",
                    DataType::FixedSizeList(
                        Arc::new(Field::new("item", DataType::Float32, true)),
                        2,
                    ),
                    true,
                ),
            ])),
            topics: Arc::from(vec![Name::from("t")]),
        }
    }

    #[test]
    fn json_good_and_bad_records_are_separated_exactly() {
        let d = json_decoder();
        let c = chunk(&[
            br#"{"id": 0, "x": [1, 2]}"#,
            br#"{"id": 1, "x": [1"#,
            br#"{"id": 2, "x": [3, 4]}"#,
            br#"{"id": "two", "x": [3, 4]}"#,
            br#"{"id": 4, "x": [5, 6]}{"id": 5}"#,
            b"",
            br#"not json"#,
            br#"{"id": 7, "x": [7, 8]}"#,
        ]);
        let out = d.decode(c);
        assert_eq!(out.records, 8);
        let ids = ids(&out);
        assert_eq!(ids, vec![0, 2, 7]);
        let bad: Vec<i64> = {
            let mut v: Vec<i64> = out.bad.iter().map(|b| b.offset).collect();
            v.sort();
            v
        };
        assert_eq!(bad, vec![1, 3, 4, 5, 6]);
        for b in &out.batches {
            assert_eq!(b.lineage.num_rows() as usize, b.num_rows());
        }
        let lineage: Vec<u64> = out
            .batches
            .iter()
            .flat_map(|b| {
                b.lineage
                    .spans()
                    .iter()
                    .map(|s| s.first)
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(lineage, vec![0, 2, 7]);
    }

    #[test]
    fn json_with_many_bad_records_keeps_order_and_counts() {
        let d = json_decoder();
        let values: Vec<Vec<u8>> = (0..3000i64)
            .map(|i| match i % 3 {
                0 => format!(r#"{{"id": {i}, "x": [1, 2]}}"#).into_bytes(),
                1 => format!(r#"{{"id": {i}, "x": [1"#).into_bytes(),
                _ => format!(r#"{{"id": "id-{i}", "x": [1, 2]}}"#).into_bytes(),
            })
            .collect();
        let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        let out = d.decode(chunk(&refs));
        let ids = ids(&out);
        assert_eq!(ids, (0..3000).step_by(3).collect::<Vec<i64>>());
        assert_eq!(out.bad.len(), 2000);
    }

    #[test]
    fn ipc_skip_rows_and_truncation() {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
        let data = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int64Array::from_iter_values(0..10))],
        )
        .unwrap();
        let mut buf = Vec::new();
        {
            let mut w = arrow::ipc::writer::StreamWriter::try_new(&mut buf, &schema).unwrap();
            w.write(&data).unwrap();
            w.finish().unwrap();
        }
        let truncated = buf[..buf.len() / 2].to_vec();
        let mut c = chunk(&[&buf, &truncated]);
        c.records[0].skip_rows = 4;
        let d = ChunkDecoder {
            format: KafkaFormat::ArrowIpc,
            schema,
            topics: Arc::from(vec![Name::from("t")]),
        };
        let out = d.decode(c);
        assert_eq!(out.batches.len(), 1);
        assert_eq!(out.batches[0].num_rows(), 6);
        assert_eq!(out.batches[0].lineage.spans()[0].first, 4);
        assert_eq!(out.bad.len(), 1);
        assert_eq!(out.bad[0].offset, 1);
    }

    /// `ipc_rows` reads the rows of every record batch of a message from the headers alone,
    /// and refuses what is not a whole IPC stream.
    #[test]
    fn ipc_rows_counts_every_batch_from_the_headers() {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
        let batch = |n: i64| {
            RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(Int64Array::from_iter_values(0..n))],
            )
            .unwrap()
        };
        let mut buf = Vec::new();
        {
            let mut w = arrow::ipc::writer::StreamWriter::try_new(&mut buf, &schema).unwrap();
            w.write(&batch(3)).unwrap();
            w.write(&batch(0)).unwrap();
            w.write(&batch(250)).unwrap();
            w.finish().unwrap();
        }
        assert_eq!(ipc_rows(&buf), Some(253));
        // Without the end-of-stream marker (8 bytes), still whole.
        assert_eq!(ipc_rows(&buf[..buf.len() - 8]), Some(253));
        assert_eq!(ipc_rows(&buf[..buf.len() / 2]), None);
        assert_eq!(ipc_rows(b"{\"id\": 1}"), None);
        assert_eq!(ipc_rows(&[]), None);
    }
}
