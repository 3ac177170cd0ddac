//! Answers from synopses: an aggregate without GROUP BY whose functions are `count`, `sum`,
//! `min`, `max` and `avg` over plain columns of one Sluice table, scanned whole partitions at a
//! time (`WHERE PARTS` is fine) or filtered only by bounds on its time partition column
//! (`ts >= '...'`, `ts > now() - INTERVAL '30 seconds'`), is replaced by its one-row answer,
//! computed from the synopses of the files and buffer chunks wholly inside the bounds
//! ([`crate::synopsis`]) plus the filtered rows of those that straddle one. Anything else (another
//! filter, DISTINCT, a file written before synopses, a straddling file not in the hot cache,
//! an integer sum past i64) is left to DataFusion, so the answer is always the one a scan
//! would give.

use crate::catalog::TableDef;
use crate::provider::{SluiceTable, row_filter};
use crate::synopsis::{ColumnSynopsis, Num};
use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use datafusion::common::ScalarValue;
use datafusion::common::tree_node::Transformed;
use datafusion::datasource::source_as_provider;
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{Aggregate, Expr, LogicalPlan, Values};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

/// The optimizer rule.
#[derive(Debug, Default)]
pub struct SynopsisRule;

impl OptimizerRule for SynopsisRule {
    fn name(&self) -> &str {
        "sluice_synopsis"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::TopDown)
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> DfResult<Transformed<LogicalPlan>> {
        let LogicalPlan::Aggregate(agg) = &plan else {
            return Ok(Transformed::no(plan));
        };
        match answer(agg) {
            Some(values) => Ok(Transformed::yes(values)),
            None => Ok(Transformed::no(plan)),
        }
    }
}

/// What one aggregate asks of the synopsis.
enum Want {
    /// `count(*)` / `count(1)`.
    Rows,
    Count(usize),
    Sum(usize),
    Avg(usize),
    Min(usize),
    Max(usize),
}

/// The column an aggregate argument reads, looking through the widening casts the planner
/// adds (Int8 -> Int64, Float32 -> Float64): a cast that could change a value (to a narrower
/// or other type) is not looked through, so such an aggregate is computed by a scan.
fn column<'a>(e: &'a Expr, schema: &SchemaRef) -> Option<&'a str> {
    let (inner, to) = match e {
        Expr::Column(c) => return Some(&c.name),
        Expr::Cast(c) => (c.expr.as_ref(), c.field.data_type()),
        _ => return None,
    };
    let name = column(inner, schema)?;
    let from = schema.field_with_name(name).ok()?.data_type();
    let widening = match to {
        DataType::Int64 => from.is_signed_integer(),
        DataType::UInt64 => from.is_unsigned_integer(),
        DataType::Float64 => from.is_integer() || from.is_floating(),
        _ => false,
    };
    widening.then_some(name)
}

fn answer(agg: &Aggregate) -> Option<LogicalPlan> {
    if !agg.group_expr.is_empty() || agg.aggr_expr.is_empty() {
        return None;
    }
    let mut input = agg.input.as_ref();
    let mut filter = None;
    loop {
        input = match input {
            LogicalPlan::SubqueryAlias(a) => a.input.as_ref(),
            LogicalPlan::Projection(p) if p.expr.iter().all(|e| matches!(e, Expr::Column(_))) => {
                p.input.as_ref()
            }
            LogicalPlan::Filter(f) if filter.is_none() => {
                filter = Some(&f.predicate);
                f.input.as_ref()
            }
            _ => break,
        };
    }
    let LogicalPlan::TableScan(scan) = input else {
        return None;
    };
    if scan.fetch.is_some() {
        return None;
    }
    let provider = source_as_provider(&scan.source).ok()?;
    let table = provider.downcast_ref::<SluiceTable>()?;
    let def = table.def();
    let filters = filter.into_iter().chain(&scan.filters);
    let bounds = match filter.is_none() && scan.filters.is_empty() {
        true => None,
        false => Some(time_bounds(&def, filters)?),
    };
    let schema = datafusion::datasource::TableProvider::schema(table);
    let mut wants = Vec::new();
    let mut columns: Vec<usize> = Vec::new();
    for e in &agg.aggr_expr {
        let e = match e {
            Expr::Alias(a) => a.expr.as_ref(),
            e => e,
        };
        let Expr::AggregateFunction(AggregateFunction { func, params }) = e else {
            return None;
        };
        if params.distinct || params.filter.is_some() || params.args.len() != 1 {
            return None;
        }
        let name = func.name();
        let arg = &params.args[0];
        if name == "count" && matches!(arg, Expr::Literal(v, _) if !v.is_null()) {
            wants.push(Want::Rows);
            continue;
        }
        let c = def.column_index(column(arg, &schema)?)?;
        let slot = match columns.iter().position(|x| *x == c) {
            Some(i) => i,
            None => {
                columns.push(c);
                columns.len() - 1
            }
        };
        wants.push(match name {
            "count" => Want::Count(slot),
            "sum" => Want::Sum(slot),
            "avg" => Want::Avg(slot),
            "min" => Want::Min(slot),
            "max" => Want::Max(slot),
            _ => return None,
        });
    }
    let (rows, syn) = match bounds {
        Some((lo, hi)) => table.synopsis_within(&columns, lo, hi)?,
        None => table.synopsis(&columns)?,
    };
    let fields = agg.schema.fields();
    let mut row = Vec::with_capacity(wants.len());
    for (want, field) in wants.iter().zip(fields.iter()) {
        let ty = field.data_type();
        let v = match want {
            Want::Rows => ScalarValue::Int64(Some(i64::try_from(rows).ok()?)),
            Want::Count(s) => ScalarValue::Int64(Some(i64::try_from(syn[*s].count).ok()?)),
            Want::Sum(s) => sum(&syn[*s], ty)?,
            Want::Avg(s) => avg(&syn[*s], ty)?,
            Want::Min(s) => bound(&syn[*s], syn[*s].min, ty)?,
            Want::Max(s) => bound(&syn[*s], syn[*s].max, ty)?,
        };
        if v.data_type() != *ty {
            return None;
        }
        row.push(Expr::Literal(v, None));
    }
    Some(LogicalPlan::Values(Values {
        schema: agg.schema.clone(),
        values: vec![row],
    }))
}

/// The bounds `[lo, hi]` (microseconds) that `filters` put on the table's partition column,
/// when they are nothing but such bounds (`ts >= '...'`, `ts > now() - INTERVAL '1 minute'`).
fn time_bounds<'a>(def: &TableDef, filters: impl Iterator<Item = &'a Expr>) -> Option<(i64, i64)> {
    let (mut lo, mut hi) = (i64::MIN, i64::MAX);
    for e in filters.flat_map(split_conjunction) {
        let f = row_filter(def, std::slice::from_ref(e));
        let [(col, a, b)] = f.time[..] else {
            return None;
        };
        if !f.equal.is_empty() || col != def.partition_column {
            return None;
        }
        lo = lo.max(a);
        hi = hi.min(b);
    }
    Some((lo, hi))
}

fn null(ty: &DataType) -> Option<ScalarValue> {
    ScalarValue::try_from(ty).ok()
}

fn sum(s: &ColumnSynopsis, ty: &DataType) -> Option<ScalarValue> {
    if s.count == 0 {
        return null(ty);
    }
    Some(match (s.sum?, ty) {
        (Num::Int(v), DataType::Int64) => ScalarValue::Int64(Some(i64::try_from(v).ok()?)),
        (Num::Int(v), DataType::UInt64) => ScalarValue::UInt64(Some(u64::try_from(v).ok()?)),
        (Num::Float(v), DataType::Float64) => ScalarValue::Float64(Some(v)),
        _ => return None,
    })
}

fn avg(s: &ColumnSynopsis, ty: &DataType) -> Option<ScalarValue> {
    if *ty != DataType::Float64 {
        return None;
    }
    if s.count == 0 {
        return null(ty);
    }
    let v = match s.sum? {
        // Exact integer sum, one rounding.
        Num::Int(v) => v as f64 / s.count as f64,
        Num::Float(v) => v / s.count as f64,
    };
    Some(ScalarValue::Float64(Some(v)))
}

fn bound(s: &ColumnSynopsis, v: Option<Num>, ty: &DataType) -> Option<ScalarValue> {
    if s.count == 0 {
        return null(ty);
    }
    if !s.ordered {
        return None;
    }
    let int = |n: Num| match n {
        Num::Int(i) => Some(i),
        Num::Float(_) => None,
    };
    let v = v?;
    Some(match ty {
        DataType::Int8 => ScalarValue::Int8(Some(i8::try_from(int(v)?).ok()?)),
        DataType::Int16 => ScalarValue::Int16(Some(i16::try_from(int(v)?).ok()?)),
        DataType::Int32 => ScalarValue::Int32(Some(i32::try_from(int(v)?).ok()?)),
        DataType::Int64 => ScalarValue::Int64(Some(i64::try_from(int(v)?).ok()?)),
        DataType::UInt8 => ScalarValue::UInt8(Some(u8::try_from(int(v)?).ok()?)),
        DataType::UInt16 => ScalarValue::UInt16(Some(u16::try_from(int(v)?).ok()?)),
        DataType::UInt32 => ScalarValue::UInt32(Some(u32::try_from(int(v)?).ok()?)),
        DataType::UInt64 => ScalarValue::UInt64(Some(u64::try_from(int(v)?).ok()?)),
        // Values were Float32 to begin with, so this conversion is exact.
        DataType::Float32 => ScalarValue::Float32(Some(v.as_f64() as f32)),
        DataType::Float64 => ScalarValue::Float64(Some(v.as_f64())),
        DataType::Date32 => ScalarValue::Date32(Some(i32::try_from(int(v)?).ok()?)),
        DataType::Timestamp(TimeUnit::Microsecond, tz) => {
            ScalarValue::TimestampMicrosecond(Some(i64::try_from(int(v)?).ok()?), tz.clone())
        }
        _ => return None,
    })
}
