//! Result encodings for `/v1/sql?format=...`, produced batch by batch so a large result
//! streams to the client instead of being held whole in memory.

use crate::ApiError;
use axum::http::StatusCode;
use bytes::Bytes;
use datafusion::arrow::csv::WriterBuilder as CsvWriterBuilder;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::arrow::json::WriterBuilder as JsonWriterBuilder;
use datafusion::arrow::json::writer::{JsonArray, LineDelimited};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::ArrowWriter;

/// A result encoding.
#[derive(Debug, Clone, Copy)]
pub(crate) enum OutputFormat {
    Json,
    JsonLines,
    Csv,
    Arrow,
    Parquet,
}

impl OutputFormat {
    pub(crate) fn parse(s: Option<&str>) -> Result<Self, ApiError> {
        Ok(match s.unwrap_or("json") {
            "json" => Self::Json,
            "jsonl" | "ndjson" => Self::JsonLines,
            "csv" => Self::Csv,
            "arrow" => Self::Arrow,
            "parquet" => Self::Parquet,
            other => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "bad_format",
                    format!("unknown format '{other}'; use json, jsonl, csv, arrow or parquet"),
                ));
            }
        })
    }

    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Self::Json => "application/json",
            Self::JsonLines => "application/x-ndjson",
            Self::Csv => "text/csv",
            Self::Arrow => "application/vnd.apache.arrow.stream",
            Self::Parquet => "application/vnd.apache.parquet",
        }
    }

    /// An encoder for a result of `schema`.
    pub(crate) fn encoder(self, schema: SchemaRef) -> Result<Encoder, ApiError> {
        Ok(match self {
            Self::Json => Encoder::Json { first: true },
            Self::JsonLines => Encoder::JsonLines,
            Self::Csv => Encoder::Csv { header: true },
            Self::Arrow => {
                let w = StreamWriter::try_new(Vec::new(), &schema).map_err(fail)?;
                Encoder::Arrow(Box::new(w))
            }
            Self::Parquet => {
                let w = ArrowWriter::try_new(Vec::new(), schema, None).map_err(fail)?;
                Encoder::Parquet(Box::new(w))
            }
        })
    }
}

fn fail(e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(format!("encoding the result: {e}"))
}

/// Encodes batches into chunks of the response body.
pub(crate) enum Encoder {
    Json { first: bool },
    JsonLines,
    Csv { header: bool },
    Arrow(Box<StreamWriter<Vec<u8>>>),
    Parquet(Box<ArrowWriter<Vec<u8>>>),
}

impl Encoder {
    /// The bytes for one batch (possibly none, e.g. Parquet buffers a row group).
    pub(crate) fn batch(&mut self, batch: &RecordBatch) -> Result<Bytes, ApiError> {
        let mut buf = Vec::new();
        match self {
            Self::Json { first } => {
                if batch.num_rows() == 0 {
                    return Ok(Bytes::new());
                }
                let mut w = JsonWriterBuilder::new()
                    .with_explicit_nulls(true)
                    .build::<_, JsonArray>(&mut buf);
                w.write(batch).map_err(fail)?;
                w.finish().map_err(fail)?;
                drop(w);
                // Each batch is encoded as `[...]`: join them into one array.
                buf[0] = if *first { b'[' } else { b',' };
                buf.pop();
                *first = false;
            }
            Self::JsonLines => {
                let mut w = JsonWriterBuilder::new()
                    .with_explicit_nulls(true)
                    .build::<_, LineDelimited>(&mut buf);
                w.write(batch).map_err(fail)?;
                w.finish().map_err(fail)?;
            }
            Self::Csv { header } => {
                let mut w = CsvWriterBuilder::new().with_header(*header).build(&mut buf);
                w.write(batch).map_err(fail)?;
                *header = false;
            }
            Self::Arrow(w) => {
                w.write(batch).map_err(fail)?;
                buf = std::mem::take(w.get_mut());
            }
            Self::Parquet(w) => {
                w.write(batch).map_err(fail)?;
                buf = std::mem::take(w.inner_mut());
            }
        }
        Ok(Bytes::from(buf))
    }

    /// The closing bytes.
    pub(crate) fn finish(self) -> Result<Bytes, ApiError> {
        Ok(match self {
            Self::Json { first: true } => Bytes::from_static(b"[]"),
            Self::Json { first: false } => Bytes::from_static(b"]"),
            Self::JsonLines | Self::Csv { .. } => Bytes::new(),
            Self::Arrow(mut w) => {
                w.finish().map_err(fail)?;
                Bytes::from(w.into_inner().map_err(fail)?)
            }
            Self::Parquet(w) => Bytes::from(w.into_inner().map_err(fail)?),
        })
    }
}
