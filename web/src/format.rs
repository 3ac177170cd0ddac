//! Result encodings for `/v1/sql?format=...`.

use crate::ApiError;
use axum::http::StatusCode;
use datafusion::arrow::csv::WriterBuilder as CsvWriterBuilder;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::arrow::json::WriterBuilder as JsonWriterBuilder;
use datafusion::arrow::json::writer::{JsonArray, LineDelimited};
use datafusion::parquet::arrow::ArrowWriter;
use sluice_engine::QueryOutput;

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

    pub(crate) fn encode(self, out: &QueryOutput) -> Result<(&'static str, Vec<u8>), ApiError> {
        let fail =
            |e: &dyn std::fmt::Display| ApiError::internal(format!("encoding the result: {e}"));
        let batches: Vec<_> = out.batches.iter().collect();
        let mut buf = Vec::new();
        let ct = match self {
            Self::Json => {
                let mut w = JsonWriterBuilder::new()
                    .with_explicit_nulls(true)
                    .build::<_, JsonArray>(&mut buf);
                w.write_batches(&batches).map_err(|e| fail(&e))?;
                w.finish().map_err(|e| fail(&e))?;
                drop(w);
                if buf.is_empty() {
                    buf.extend_from_slice(b"[]");
                }
                "application/json"
            }
            Self::JsonLines => {
                let mut w = JsonWriterBuilder::new()
                    .with_explicit_nulls(true)
                    .build::<_, LineDelimited>(&mut buf);
                w.write_batches(&batches).map_err(|e| fail(&e))?;
                w.finish().map_err(|e| fail(&e))?;
                "application/x-ndjson"
            }
            Self::Csv => {
                let mut w = CsvWriterBuilder::new().with_header(true).build(&mut buf);
                for b in &batches {
                    w.write(b).map_err(|e| fail(&e))?;
                }
                drop(w);
                "text/csv"
            }
            Self::Arrow => {
                let mut w = StreamWriter::try_new(&mut buf, &out.schema).map_err(|e| fail(&e))?;
                for b in &batches {
                    w.write(b).map_err(|e| fail(&e))?;
                }
                w.finish().map_err(|e| fail(&e))?;
                drop(w);
                "application/vnd.apache.arrow.stream"
            }
            Self::Parquet => {
                let mut w = ArrowWriter::try_new(&mut buf, out.schema.clone(), None)
                    .map_err(|e| fail(&e))?;
                for b in &batches {
                    w.write(b).map_err(|e| fail(&e))?;
                }
                w.close().map_err(|e| fail(&e))?;
                "application/vnd.apache.parquet"
            }
        };
        Ok((ct, buf))
    }
}
