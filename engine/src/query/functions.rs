//! SQL functions JoinBase users write that DataFusion lacks: `date(ts)` (also `ymd`), the
//! calendar day of a time, as a DATE.

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

/// Every function Sluice adds to DataFusion's.
pub(crate) fn all() -> Vec<ScalarUDF> {
    vec![ScalarUDF::new_from_impl(DateFn {
        signature: Signature::new(TypeSignature::Any(1), Volatility::Immutable),
        aliases: vec!["ymd".into()],
    })]
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::TimestampMicrosecondArray;

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
