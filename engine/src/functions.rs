//! SQL functions JoinBase users write that DataFusion lacks: `date(ts)` (also `ymd`), the
//! calendar day of a time, as a DATE.

use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature,
    Volatility,
};

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
            ColumnarValue::Array(a) => ColumnarValue::Array(cast(a, &DataType::Date32)?),
            ColumnarValue::Scalar(s) => ColumnarValue::Scalar(s.cast_to(&DataType::Date32)?),
        })
    }
}

/// Every function Sluice adds to DataFusion's.
pub fn all() -> Vec<ScalarUDF> {
    vec![ScalarUDF::new_from_impl(DateFn {
        signature: Signature::new(TypeSignature::Any(1), Volatility::Immutable),
        aliases: vec!["ymd".into()],
    })]
}
