//! SQL functions users of other time-series databases write that DataFusion lacks:
//! JoinBase's `date(ts)` (also `ymd`), the calendar day of a time, as a DATE; TimescaleDB's
//! `time_bucket(width, ts[, origin])`.

use datafusion::arrow::array::{Array, ArrayRef, Date32Array, Int64Array};
use datafusion::arrow::compute::{cast, unary};
use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature,
    Volatility,
};
use std::sync::Arc;

/// `date(x)`: a timestamp, date or text as a DATE (the UTC day for times without a zone).
#[derive(Debug, PartialEq, Eq, Hash)]
struct DateFn {
    signature: Signature,
    aliases: Vec<String>,
}

impl ScalarUDFImpl for DateFn {
    fn name(&self) -> &str {
        "date"
    }

    fn aliases(&self) -> &[String] {
        &self.aliases
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Date32)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [arg] = args.args.as_slice() else {
            return Err(datafusion::error::DataFusionError::Plan(
                "date() takes one argument".into(),
            ));
        };
        Ok(match arg {
            ColumnarValue::Array(a) => ColumnarValue::Array(to_date(a)?),
            ColumnarValue::Scalar(s) => ColumnarValue::Scalar(s.cast_to(&DataType::Date32)?),
        })
    }
}

/// Days since the epoch. Times without a zone are UTC, so the day is a floor division (arrow's
/// general cast goes through a calendar per value, several times slower); anything else is
/// cast.
pub(crate) fn to_date(a: &ArrayRef) -> Result<ArrayRef> {
    let per_day = match a.data_type() {
        DataType::Timestamp(TimeUnit::Second, None) => 86_400,
        DataType::Timestamp(TimeUnit::Millisecond, None) => 86_400_000,
        DataType::Timestamp(TimeUnit::Microsecond, None) => 86_400_000_000,
        DataType::Timestamp(TimeUnit::Nanosecond, None) => 86_400_000_000_000,
        _ => return Ok(cast(a, &DataType::Date32)?),
    };
    // Any timestamp array reinterprets as i64 values with the same nulls.
    let values = a
        .to_data()
        .into_builder()
        .data_type(DataType::Int64)
        .build()?;
    let days: Date32Array = unary(&Int64Array::from(values), |v: i64| {
        v.div_euclid(per_day) as i32
    });
    Ok(Arc::new(days))
}

/// TimescaleDB's `time_bucket(width, ts[, origin])`: `date_bin` with TimescaleDB's default
/// origin, Monday 2000-01-03 (so weekly buckets start on Mondays), or 2000-01-01 for widths
/// in months. Same argument order and types as `date_bin`, which computes it.
#[derive(Debug, PartialEq, Eq, Hash)]
struct TimeBucket {
    inner: datafusion::functions::datetime::date_bin::DateBinFunc,
}

/// 2000-01-03 and 2000-01-01, UTC, in nanoseconds since the epoch.
const MONDAY_2000: i64 = 946_857_600_000_000_000;
const JANUARY_2000: i64 = 946_684_800_000_000_000;

impl ScalarUDFImpl for TimeBucket {
    fn name(&self) -> &str {
        "time_bucket"
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(types)
    }

    fn invoke_with_args(&self, mut args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        use datafusion::common::ScalarValue;
        if args.args.len() == 2 {
            let months = matches!(
                &args.args[0],
                ColumnarValue::Scalar(ScalarValue::IntervalMonthDayNano(Some(i))) if i.months != 0
            );
            let origin = if months { JANUARY_2000 } else { MONDAY_2000 };
            let zone = match args.args[1].data_type() {
                DataType::Timestamp(_, zone) => zone,
                _ => None,
            };
            let origin = ScalarValue::TimestampNanosecond(Some(origin), zone.clone());
            let field = datafusion::arrow::datatypes::Field::new(
                "origin",
                DataType::Timestamp(TimeUnit::Nanosecond, zone),
                false,
            );
            args.args.push(ColumnarValue::Scalar(origin));
            args.arg_fields.push(Arc::new(field));
        }
        self.inner.invoke_with_args(args)
    }
}

/// The most buckets one gap-filling query may fill.
pub(crate) const MAX_GAPFILL_BUCKETS: i64 = 1_000_000;

/// `sluice_gapfill_buckets(span_ns, step_ns)`: how many buckets of `step_ns` nanoseconds a
/// gap-filling query's range of `span_ns` holds; an error when the step is not positive or
/// there would be more than [`MAX_GAPFILL_BUCKETS`] (written by the gap-filling rewrite,
/// `crate::query::gapfill`, so that a wide range is refused before its grid is made).
#[derive(Debug, PartialEq, Eq, Hash)]
struct GapfillBuckets {
    signature: Signature,
}

impl ScalarUDFImpl for GapfillBuckets {
    fn name(&self) -> &str {
        "sluice_gapfill_buckets"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Int64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        use datafusion::common::ScalarValue;
        let rows = args.number_rows;
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let [span, step] = arrays.as_slice() else {
            return Err(datafusion::error::DataFusionError::Plan(
                "sluice_gapfill_buckets takes two arguments".into(),
            ));
        };
        let (span, step) = (cast(span, &DataType::Int64)?, cast(step, &DataType::Int64)?);
        let span = span.as_any().downcast_ref::<Int64Array>().expect("cast");
        let step = step.as_any().downcast_ref::<Int64Array>().expect("cast");
        let mut most = 0;
        for i in 0..rows.min(span.len()) {
            if span.is_null(i) || step.is_null(i) {
                continue;
            }
            let (span, step) = (span.value(i), step.value(i));
            if step <= 0 {
                return Err(datafusion::error::DataFusionError::Execution(
                    "gap filling needs a positive interval".into(),
                ));
            }
            let n = span.max(0) / step + 1;
            if n > MAX_GAPFILL_BUCKETS {
                return Err(datafusion::error::DataFusionError::Execution(format!(
                    "gap filling would make {n} buckets per group (at most \
                     {MAX_GAPFILL_BUCKETS}): narrow the time range or widen the interval"
                )));
            }
            most = most.max(n);
        }
        Ok(ColumnarValue::Scalar(ScalarValue::Int64(Some(most))))
    }
}

/// Every function Sluice adds to DataFusion's.
pub(crate) fn all() -> Vec<ScalarUDF> {
    vec![
        ScalarUDF::new_from_impl(DateFn {
            signature: Signature::new(TypeSignature::Any(1), Volatility::Immutable),
            aliases: vec!["ymd".into()],
        }),
        ScalarUDF::new_from_impl(TimeBucket {
            inner: Default::default(),
        }),
        ScalarUDF::new_from_impl(GapfillBuckets {
            signature: Signature::new(TypeSignature::Any(2), Volatility::Immutable),
        }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::TimestampMicrosecondArray;

    #[tokio::test]
    async fn time_bucket_has_timescaledbs_origins() {
        let ctx = datafusion::prelude::SessionContext::new();
        for f in all() {
            ctx.register_udf(f);
        }
        let sql = "SELECT \
            CAST(time_bucket(INTERVAL '1 week', TIMESTAMP '2024-01-10 12:00:00') AS VARCHAR) AS w, \
            CAST(time_bucket(INTERVAL '15 minutes', TIMESTAMP '2024-01-10 12:44:59') AS VARCHAR) AS m, \
            CAST(time_bucket(INTERVAL '1 month', TIMESTAMP '2024-03-20 00:00:00') AS VARCHAR) AS mo, \
            CAST(time_bucket(INTERVAL '1 hour', TIMESTAMP '2024-01-10 12:44:59', TIMESTAMP '2024-01-01 00:30:00') AS VARCHAR) AS o, \
            CAST(date_bin(INTERVAL '1 week', TIMESTAMP '2024-01-10 12:00:00') AS VARCHAR) AS d";
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string();
        // Weeks start on Monday 2024-01-08 (date_bin's epoch origin gives Thursday 01-04).
        for want in [
            "2024-01-08T00:00:00",
            "2024-01-10T12:30:00",
            "2024-03-01T00:00:00",
            "2024-01-10T12:30:00",
            "2024-01-04T00:00:00",
        ] {
            assert!(text.contains(want), "{want} expected in\n{text}");
        }
    }

    #[test]
    fn date_floors_to_the_utc_day() {
        let ts: ArrayRef = Arc::new(TimestampMicrosecondArray::from(vec![
            Some(0),
            Some(86_400_000_000 - 1),
            Some(-1),
            None,
            Some(1_454_245_200_000_000),
        ]));
        let fast = to_date(&ts).unwrap();
        assert_eq!(
            fast.as_ref(),
            cast(&ts, &DataType::Date32).unwrap().as_ref()
        );
        assert_eq!(fast.null_count(), 1);
    }
}
