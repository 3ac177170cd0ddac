//! Gap filling: InfluxDB 3's `date_bin_gapfill(interval, time[, origin])` and TimescaleDB's
//! `time_bucket_gapfill(interval, time[, origin])`, with `locf(expr)` (the last value seen,
//! carried forward) and `interpolate(expr)` (linear between the values around a gap).
//!
//! A grouped query that names one of them is rewritten before planning into plain SQL:
//! the query grouped by `date_bin` (or `time_bucket`), a grid of every bucket from the one
//! holding the WHERE clause's lower time bound up to its upper bound (`now()` when none)
//! for every group the rows have, the grid left-joined with the groups' rows, and `locf` /
//! `interpolate` as window functions over each group's buckets in time order. So every
//! bucket of the range has one row per group, with NULL (or the filled value) where no row
//! fell; a NULL aggregate of a bucket that had rows is filled alike. Rows come ordered by
//! the groups, then time, unless the query orders them.

use crate::error::{Error, Result};
use datafusion::sql::sqlparser::ast::{
    BinaryOperator, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, GroupByExpr, SelectItem,
    SetExpr, Statement, Value,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;

/// The gap-filling bucket functions, and the plain function each stands for.
const BUCKETS: [(&str, &str); 2] = [
    ("date_bin_gapfill", "date_bin"),
    ("time_bucket_gapfill", "time_bucket"),
];

/// `statement` with its gap filling written out as plain SQL; unchanged when it has none.
pub(crate) fn rewrite(statement: Statement) -> Result<Statement> {
    if let Statement::Explain {
        describe_alias,
        analyze,
        verbose,
        query_plan,
        estimate,
        statement: inner,
        format,
        options,
    } = statement
    {
        return Ok(Statement::Explain {
            describe_alias,
            analyze,
            verbose,
            query_plan,
            estimate,
            statement: Box::new(rewrite(*inner)?),
            format,
            options,
        });
    }
    let Statement::Query(query) = &statement else {
        return Ok(statement);
    };
    let SetExpr::Select(select) = query.body.as_ref() else {
        return Ok(statement);
    };
    let items: Vec<(&Expr, Option<String>)> = (select.projection.iter())
        .filter_map(|item| match item {
            SelectItem::UnnamedExpr(e) => Some((e, None)),
            SelectItem::ExprWithAlias { expr, alias } => Some((expr, Some(alias.value.clone()))),
            _ => None,
        })
        .collect();
    let Some(bucket_at) = items.iter().position(|(e, _)| bucket_call(e).is_some()) else {
        if items.iter().any(|(e, _)| filler(e).is_some()) {
            return Err(bad(
                "locf() and interpolate() fill the gaps of date_bin_gapfill() or \
                 time_bucket_gapfill(), which this query does not group by",
            ));
        }
        return Ok(statement);
    };
    if items.len() != select.projection.len() {
        return Err(bad("a gap-filling query cannot select `*`"));
    }
    if select.distinct.is_some() {
        return Err(bad("a gap-filling query cannot be SELECT DISTINCT"));
    }
    let (plain, args) = bucket_call(items[bucket_at].0).expect("found above");
    let [interval, time, origin @ ..] = args.as_slice() else {
        return Err(bad("date_bin_gapfill takes (interval, time[, origin])"));
    };
    let origin = origin.first().map(|o| format!(", {o}")).unwrap_or_default();
    let GroupByExpr::Expressions(group_by, _) = &select.group_by else {
        return Err(bad(
            "a gap-filling query groups by its bucket and its other keys",
        ));
    };
    if group_by.is_empty() {
        return Err(bad(
            "a gap-filling query needs GROUP BY (its bucket and its other keys)",
        ));
    }
    // Which GROUP BY entry is which select item: by position, alias or expression.
    let item_of = |g: &Expr| -> Option<usize> {
        if let Expr::Value(v) = g
            && let Value::Number(n, _) = &v.value
        {
            return n.parse::<usize>().ok().and_then(|n| n.checked_sub(1));
        }
        let text = g.to_string();
        (items.iter())
            .position(|(e, alias)| e.to_string() == text || alias.as_deref() == Some(&text))
    };
    let mut keys: Vec<String> = Vec::new(); // group keys' SQL
    let mut key_items: Vec<Option<usize>> = Vec::new();
    for g in group_by {
        match item_of(g) {
            Some(i) if i == bucket_at => {}
            Some(i) if i < items.len() => {
                keys.push(items[i].0.to_string());
                key_items.push(Some(i));
            }
            _ if bucket_call(g).is_some() => {}
            _ => {
                keys.push(g.to_string());
                key_items.push(None);
            }
        }
    }
    let (lower, upper) = bounds(select.selection.as_ref(), &time.to_string())?;

    // Inner: the rows grouped by plain bucket and keys, one column per value.
    let mut inner = vec![format!("{plain}({interval}, {time}{origin}) AS __b")];
    inner.extend(
        keys.iter()
            .enumerate()
            .map(|(k, e)| format!("{e} AS __g{k}")),
    );
    let mut outer = Vec::new();
    let keys_cols: Vec<String> = (0..keys.len()).map(|k| format!("__g{k}")).collect();
    let partition = match keys_cols.is_empty() {
        true => String::new(),
        false => format!("PARTITION BY {} ", keys_cols.join(", ")),
    };
    let mut values = 0;
    for (i, (expr, alias)) in items.iter().enumerate() {
        let name = quote(match alias {
            Some(a) => a.clone(),
            None => column_name(expr),
        });
        if i == bucket_at {
            outer.push(format!("__b AS {name}"));
            continue;
        }
        if let Some(k) = key_items.iter().position(|k| *k == Some(i)) {
            outer.push(format!("__g{k} AS {name}"));
            continue;
        }
        let v = format!("__v{values}");
        values += 1;
        let (fill, inside) = match filler(expr) {
            Some((fill, inside)) => (Some(fill), inside),
            None => (None, (*expr).clone()),
        };
        inner.push(format!("{inside} AS {v}"));
        let before = format!(
            "OVER ({partition}ORDER BY __b ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)"
        );
        let after = format!(
            "OVER ({partition}ORDER BY __b ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING)"
        );
        outer.push(match fill {
            None => format!("{v} AS {name}"),
            Some(Fill::Locf) => format!("last_value({v}) IGNORE NULLS {before} AS {name}"),
            Some(Fill::Interpolate) => {
                // The fraction of the gap in DOUBLE (nanosecond differences times values
                // overflow BIGINT); an interpolated integer comes back as DOUBLE.
                let at = |b: &str| format!("CAST(CAST({b} AS BIGINT) AS DOUBLE)");
                let pv = format!("last_value({v}) IGNORE NULLS {before}");
                let pb = format!("last_value(CASE WHEN {v} IS NULL THEN NULL ELSE __b END) IGNORE NULLS {before}");
                let nv = format!("first_value({v}) IGNORE NULLS {after}");
                let nb = format!("first_value(CASE WHEN {v} IS NULL THEN NULL ELSE __b END) IGNORE NULLS {after}");
                format!(
                    "CASE WHEN {v} IS NOT NULL THEN {v} ELSE {pv} + ({nv} - {pv}) * ({} - {}) / ({} - {}) END AS {name}",
                    at("__b"),
                    at(&pb),
                    at(&nb),
                    at(&pb)
                )
            }
        });
    }
    let groups: Vec<String> = (1..=keys.len() + 1).map(|n| n.to_string()).collect();
    let from: Vec<String> = select.from.iter().map(|f| f.to_string()).collect();
    let mut agg = format!(
        "SELECT {} FROM {}{} GROUP BY {}",
        inner.join(", "),
        from.join(", "),
        (select.selection.as_ref()).map_or(String::new(), |w| format!(" WHERE {w}")),
        groups.join(", "),
    );
    if let Some(h) = &select.having {
        agg.push_str(&format!(" HAVING {h}"));
    }
    let (upper, upper_op) = upper;
    // The number of buckets is checked first (at most `MAX_GAPFILL_BUCKETS`): inside the
    // series' end, so that the check runs (or is folded, when constant) before the series is
    // made.
    let start = format!("{plain}({interval}, {lower}{origin})");
    let nanos = |t: &str| format!("CAST(CAST({t} AS TIMESTAMP) AS BIGINT)");
    let span = format!("{} - {}", nanos(&upper), nanos(&start));
    let step = nanos(&format!("TIMESTAMP '1970-01-01T00:00:00' + {interval}"));
    let end = format!("CASE WHEN sluice_gapfill_buckets({span}, {step}) >= 0 THEN {upper} END");
    let series = format!("SELECT unnest(generate_series({start}, {end}, {interval})) AS __b");
    let grid = match keys_cols.is_empty() {
        true => format!("SELECT __b FROM ({series}) __s WHERE __b {upper_op} {upper}"),
        false => format!(
            "SELECT __s.__b, {} FROM ({series}) __s CROSS JOIN (SELECT DISTINCT {} FROM __agg) __k \
             WHERE __s.__b {upper_op} {upper}",
            keys_cols
                .iter()
                .map(|k| format!("__k.{k}"))
                .collect::<Vec<_>>()
                .join(", "),
            keys_cols.join(", "),
        ),
    };
    let on: Vec<String> = std::iter::once("__grid.__b = __agg.__b".to_string())
        .chain(
            keys_cols
                .iter()
                .map(|k| format!("__grid.{k} IS NOT DISTINCT FROM __agg.{k}")),
        )
        .collect();
    let filled_cols: Vec<String> = std::iter::once("__grid.__b AS __b".to_string())
        .chain(keys_cols.iter().map(|k| format!("__grid.{k} AS {k}")))
        .chain((0..values).map(|v| format!("__agg.__v{v} AS __v{v}")))
        .collect();
    let order = match &query.order_by {
        Some(o) => format!(" {o}"),
        None => {
            let by: Vec<String> = keys_cols
                .iter()
                .cloned()
                .chain(["__b".to_string()])
                .collect();
            format!(" ORDER BY {}", by.join(", "))
        }
    };
    let limit = (query.limit_clause.as_ref()).map_or(String::new(), |l| format!(" {l}"));
    let with = match &query.with {
        Some(w) if w.recursive => return Err(bad("a gap-filling query cannot be WITH RECURSIVE")),
        Some(w) => {
            let ctes: Vec<String> = w.cte_tables.iter().map(|c| c.to_string()).collect();
            format!("{}, ", ctes.join(", "))
        }
        None => String::new(),
    };
    let sql = format!(
        "WITH {with}__agg AS ({agg}), __grid AS ({grid}), \
         __filled AS (SELECT {} FROM __grid LEFT JOIN __agg ON {}) \
         SELECT {} FROM __filled{order}{limit}",
        filled_cols.join(", "),
        on.join(" AND "),
        outer.join(", "),
    );
    let mut parsed = Parser::parse_sql(&GenericDialect {}, &sql)
        .map_err(|e| bad(&format!("the gap-filling query did not rewrite: {e}")))?;
    Ok(parsed.remove(0))
}

fn bad(message: &str) -> Error {
    Error::sql(message.to_string())
}

/// The name an unaliased column gets: a column's name as written (without its quotes;
/// identifiers are case-sensitive here), else the expression's text.
fn column_name(e: &Expr) -> String {
    match e {
        Expr::Identifier(i) => i.value.clone(),
        Expr::CompoundIdentifier(parts) if !parts.is_empty() => {
            parts[parts.len() - 1].value.clone()
        }
        _ => e.to_string(),
    }
}

/// A double-quoted identifier.
pub(crate) fn quote(name: String) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The plain bucket function and the arguments of a gap-filling bucket call.
fn bucket_call(e: &Expr) -> Option<(&'static str, Vec<&Expr>)> {
    let Expr::Function(f) = e else { return None };
    let name = f.name.to_string().to_ascii_lowercase();
    let (_, plain) = BUCKETS.iter().find(|(n, _)| *n == name)?;
    Some((plain, arguments(&f.args)?))
}

pub(crate) fn arguments(args: &FunctionArguments) -> Option<Vec<&Expr>> {
    let FunctionArguments::List(list) = args else {
        return None;
    };
    (list.args.iter())
        .map(|a| match a {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e),
            _ => None,
        })
        .collect()
}

enum Fill {
    Locf,
    Interpolate,
}

/// `locf(x)` / `interpolate(x)`: which, and `x`.
fn filler(e: &Expr) -> Option<(Fill, Expr)> {
    let Expr::Function(f) = e else { return None };
    let fill = match f.name.to_string().to_ascii_lowercase().as_str() {
        "locf" => Fill::Locf,
        "interpolate" => Fill::Interpolate,
        _ => return None,
    };
    let args = arguments(&f.args)?;
    let [inside] = args.as_slice() else {
        return None;
    };
    Some((fill, (*inside).clone()))
}

/// The time range the WHERE clause sets on `time`: its lower bound (required) and its upper
/// bound with the comparison the buckets must pass (`now()` and `<=` when none).
fn bounds(selection: Option<&Expr>, time: &str) -> Result<(String, (String, &'static str))> {
    let mut conjuncts = Vec::new();
    if let Some(w) = selection {
        split_and(w, &mut conjuncts);
    }
    let is_time = |e: &Expr| {
        let text = e.to_string();
        text == time || text.rsplit('.').next() == time.rsplit('.').next()
    };
    let (mut lower, mut upper): (Vec<String>, Vec<(String, &'static str)>) = Default::default();
    for c in conjuncts {
        match c {
            Expr::BinaryOp { left, op, right } => {
                let (op, other) = match (is_time(left), is_time(right)) {
                    (true, false) => (op.clone(), right),
                    (false, true) => (flip(op), left),
                    _ => continue,
                };
                match op {
                    BinaryOperator::GtEq | BinaryOperator::Gt => lower.push(other.to_string()),
                    BinaryOperator::Lt => upper.push((other.to_string(), "<")),
                    BinaryOperator::LtEq => upper.push((other.to_string(), "<=")),
                    _ => {}
                }
            }
            Expr::Between {
                expr,
                negated: false,
                low,
                high,
            } if is_time(expr) => {
                lower.push(low.to_string());
                upper.push((high.to_string(), "<="));
            }
            _ => {}
        }
    }
    if lower.is_empty() {
        return Err(bad(&format!(
            "gap filling needs a lower bound on {time} in WHERE (e.g. {time} >= '2024-01-01T00:00:00Z')"
        )));
    }
    // Several bounds: the narrowest range (the latest lower bound, the earliest upper one;
    // an upper bound written twice, with < and <=, counts as <).
    let ts = |e: &String| format!("CAST({e} AS TIMESTAMP)");
    let lower = format!(
        "greatest({})",
        lower.iter().map(ts).collect::<Vec<_>>().join(", ")
    );
    let upper = match upper.as_slice() {
        [] => ("now()".to_string(), "<="),
        [(e, op)] => (ts(e), *op),
        many => {
            let op = match many.iter().any(|(_, op)| *op == "<") {
                true => "<",
                false => "<=",
            };
            let all: Vec<String> = many.iter().map(|(e, _)| ts(e)).collect();
            (format!("least({})", all.join(", ")), op)
        }
    };
    Ok((lower, upper))
}

fn split_and<'a>(e: &'a Expr, out: &mut Vec<&'a Expr>) {
    match e {
        Expr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            split_and(left, out);
            split_and(right, out);
        }
        Expr::Nested(inner) => split_and(inner, out),
        other => out.push(other),
    }
}

/// The comparison seen from the other side (`a < b` is `b > a`).
fn flip(op: &BinaryOperator) -> BinaryOperator {
    match op {
        BinaryOperator::Lt => BinaryOperator::Gt,
        BinaryOperator::LtEq => BinaryOperator::GtEq,
        BinaryOperator::Gt => BinaryOperator::Lt,
        BinaryOperator::GtEq => BinaryOperator::LtEq,
        other => other.clone(),
    }
}
