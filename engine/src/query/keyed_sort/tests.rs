//! [`KeyedSortExec`] against DataFusion's sort; [`super::window::KeyedWindowExec`] against
//! DataFusion's window operators.

use super::*;
use datafusion::arrow::array::{StringArray, TimestampMicrosecondArray};
use datafusion::arrow::compute::SortOptions;
use datafusion::arrow::datatypes::{Field, Schema, TimeUnit};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::physical_expr::PhysicalSortExpr;

/// Rows of 40 devices (one NULL), times shuffled, each (device, time) once, in batches.
fn input() -> (SchemaRef, Vec<RecordBatch>) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("device", DataType::Utf8, true),
        Field::new(
            "time",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            true,
        ),
        Field::new("tens", DataType::Int64, false),
    ]));
    let mut rows = Vec::new();
    let mut x = 7u64;
    for i in 0..40_000u64 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let d = (i % 40 != 0).then(|| format!("d{}", i % 40));
        // Mostly rising times with some out of order; one NULL time per device.
        let t = (i >= 40).then(|| (i as i64) * 1000 - ((x >> 40) % 3) as i64 * 40_007);
        rows.push((d, t, (i / 4000) as i64));
    }
    let batches = rows
        .chunks(300)
        .map(|c| {
            let d: StringArray = c.iter().map(|r| r.0.clone()).collect();
            let t: TimestampMicrosecondArray = c.iter().map(|r| r.1).collect();
            let v = datafusion::arrow::array::Int64Array::from_iter_values(c.iter().map(|r| r.2));
            RecordBatch::try_new(schema.clone(), vec![Arc::new(d), Arc::new(t), Arc::new(v)])
                .unwrap()
        })
        .collect();
    (schema, batches)
}

async fn run(
    plan: Arc<dyn ExecutionPlan>,
    memory: usize,
) -> (Vec<RecordBatch>, Option<MetricsSet>) {
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_limit(memory, 1.0)
        .build_arc()
        .unwrap();
    let config = datafusion::prelude::SessionConfig::new().with_sort_spill_reservation_bytes(1024);
    let ctx = Arc::new(
        TaskContext::default()
            .with_runtime(runtime)
            .with_session_config(config),
    );
    let out = plan.execute(0, ctx).unwrap().try_collect().await.unwrap();
    (out, plan.metrics())
}

#[tokio::test]
async fn sorts_as_datafusion_does_in_every_direction_and_hands_over_when_memory_is_short() {
    let (schema, batches) = input();
    for (desc_key, desc_time, nulls_first) in [
        (false, false, false),
        (true, false, true),
        (false, true, true),
        (true, true, false),
    ] {
        let opt = |descending| SortOptions {
            descending,
            nulls_first,
        };
        // A text key (hashed as text), or keys in the row format: text and a number.
        let mut keys = vec![PhysicalSortExpr::new(
            Arc::new(Column::new("device", 0)),
            opt(desc_key),
        )];
        if desc_key == nulls_first {
            let tens = Arc::new(Column::new("tens", 2));
            keys.push(PhysicalSortExpr::new(tens, opt(!desc_key)));
        }
        keys.push(PhysicalSortExpr::new(
            Arc::new(Column::new("time", 1)),
            opt(desc_time),
        ));
        let ordering = LexOrdering::new(keys).unwrap();
        let source =
            MemorySourceConfig::try_new_exec(std::slice::from_ref(&batches), schema.clone(), None)
                .unwrap();
        let sort = SortExec::new(ordering, source);
        let keyed = Arc::new(KeyedSortExec::of(&sort).expect("a keyed sort"));
        let (want, _) = run(Arc::new(sort), usize::MAX).await;
        let want = datafusion::arrow::compute::concat_batches(&schema, &want).unwrap();
        let (got, metrics) = run(keyed.clone(), usize::MAX).await;
        let got = datafusion::arrow::compute::concat_batches(&schema, &got).unwrap();
        assert_eq!(got, want, "{desc_key} {desc_time} {nulls_first}");
        let metrics = metrics.unwrap();
        assert_eq!(
            metrics.sum_by_name("keyed_rows").unwrap().as_usize(),
            40_000
        );
        // Memory for a few batches only: DataFusion's sort (spilling) gets the rows.
        let (got, metrics) = run(keyed, 512 * 1024).await;
        let got = datafusion::arrow::compute::concat_batches(&schema, &got).unwrap();
        assert_eq!(got, want);
        assert_eq!(
            metrics
                .unwrap()
                .sum_by_name("handed_to_sort")
                .unwrap()
                .as_usize(),
            1
        );
    }
}

/// `query`'s rows (on table `t` of `batches`) with [`KeyedSortRule`] and without, and the
/// plan with it, with its metrics.
async fn both_ways(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    query: &str,
    memory: usize,
) -> (RecordBatch, RecordBatch, String, Arc<dyn ExecutionPlan>) {
    use datafusion::execution::SessionStateBuilder;
    use datafusion::prelude::SessionContext;
    let mut out = Vec::new();
    for keyed in [true, false] {
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_limit(memory, 1.0)
            .build_arc()
            .unwrap();
        let config = datafusion::prelude::SessionConfig::new()
            .with_target_partitions(2)
            .with_sort_spill_reservation_bytes(1024);
        let mut state = SessionStateBuilder::new()
            .with_default_features()
            .with_config(config)
            .with_runtime_env(runtime);
        if keyed {
            state = state.with_physical_optimizer_rule(Arc::new(KeyedSortRule));
        }
        let ctx = SessionContext::new_with_state(state.build());
        let table = datafusion::datasource::MemTable::try_new(
            schema.clone(),
            vec![
                batches[..batches.len() / 2].to_vec(),
                batches[batches.len() / 2..].to_vec(),
            ],
        )
        .unwrap();
        ctx.register_table("t", Arc::new(table)).unwrap();
        let plan = (ctx.sql(query).await.unwrap())
            .create_physical_plan()
            .await
            .unwrap();
        let rows = datafusion::physical_plan::collect(plan.clone(), ctx.task_ctx())
            .await
            .unwrap();
        // A kept plan runs again after its state is reset (its nodes made anew).
        let again =
            datafusion::physical_plan::execution_plan::reset_plan_states(plan.clone()).unwrap();
        let rows_again = datafusion::physical_plan::collect(again, ctx.task_ctx())
            .await
            .unwrap();
        assert_eq!(rows, rows_again, "{query}");
        let shown = datafusion::physical_plan::display::DisplayableExecutionPlan::with_metrics(
            plan.as_ref(),
        )
        .indent(false)
        .to_string();
        let rows = datafusion::arrow::compute::concat_batches(&rows[0].schema(), &rows).unwrap();
        out.push((rows, shown, plan));
    }
    let (without, ..) = out.pop().unwrap();
    let (with, shown, plan) = out.pop().unwrap();
    (with, without, shown, plan)
}

#[tokio::test]
async fn window_functions_over_keys_answer_as_datafusion_does() {
    let (schema, batches) = input();
    // 40 keys of 1,000 rows: evaluated per key. Then 10,000 keys of 4 rows: the window
    // operator is given the sorted rows.
    let few_rows: Vec<RecordBatch> = (batches.iter())
        .map(|b| {
            let device: StringArray = (0..b.num_rows())
                .map(|i| Some(format!("k{}", (b.num_rows() * 7 + i) % 10_000)))
                .collect();
            let mut columns = b.columns().to_vec();
            columns[0] = Arc::new(device);
            RecordBatch::try_new(schema.clone(), columns).unwrap()
        })
        .collect();
    let queries = [
        "SELECT device, time, tens, lag(tens) OVER w AS a, lead(tens, 2, -1) OVER w AS b, \
         row_number() OVER w AS c, first_value(tens) OVER w AS d, count(*) OVER w AS e, \
         sum(tens) OVER (PARTITION BY device ORDER BY time ROWS BETWEEN 3 PRECEDING \
         AND CURRENT ROW) AS f \
         FROM t WINDOW w AS (PARTITION BY device ORDER BY time) \
         ORDER BY device NULLS FIRST, time NULLS FIRST, c",
        "SELECT device, time, lag(time, 1) OVER (PARTITION BY device ORDER BY time DESC NULLS LAST) \
         AS before FROM t ORDER BY device NULLS FIRST, time NULLS FIRST, before NULLS FIRST",
        "SELECT tens, count(*) AS n FROM (SELECT tens, lag(tens) OVER (PARTITION BY device \
         ORDER BY time) AS p FROM t) AS x WHERE p <> tens GROUP BY tens ORDER BY tens",
        "SELECT device, max(time) AS at, count(*) AS n FROM (SELECT device, time, tens, \
         lag(tens, 1, 0) OVER (PARTITION BY device ORDER BY time) AS p FROM t) AS x \
         WHERE p < tens OR p IS NULL GROUP BY device ORDER BY device NULLS FIRST",
    ];
    for (rows, path) in [(&batches, "keyed_rows"), (&few_rows, "small_keys")] {
        for q in queries {
            let (with, without, shown, _) = both_ways(&schema, rows, q, usize::MAX).await;
            assert!(shown.contains("SluiceKeyedWindow"), "{shown}");
            assert!(shown.contains(&format!("{path}=")), "{shown}");
            // The last query's projection reads neither the key nor the time.
            let trimmed = shown.contains("(not read above: device)");
            assert_eq!(trimmed, q == queries[2], "{shown}");
            // The last one's key is gathered only for the rows its filter keeps.
            let late = shown.contains("gathered after it: device");
            assert_eq!(late, q == queries[3], "{shown}");
            for c in 0..with.num_columns() {
                let (a, b) = (with.column(c), without.column(c));
                if let Some(i) = (0..a.len()).find(|&i| a.slice(i, 1) != b.slice(i, 1)) {
                    panic!(
                        "{path}: {q}: column {c} row {i}: {:?} vs {:?}; {shown}",
                        a.slice(i.saturating_sub(2), 5),
                        b.slice(i.saturating_sub(2), 5)
                    );
                }
            }
            assert_eq!(with, without, "{path}: {q}");
            assert!(with.num_rows() > 0);
        }
    }
    // Memory for a few batches only: DataFusion's sort and window operator get the rows.
    let (.., plan) = both_ways(&schema, &batches, queries[0], usize::MAX).await;
    let mut window = plan;
    while window.downcast_ref::<window::KeyedWindowExec>().is_none() {
        window = window.children()[0].clone();
    }
    // Over all the rows in one partition, read afresh.
    let source =
        MemorySourceConfig::try_new_exec(std::slice::from_ref(&batches), schema.clone(), None)
            .unwrap();
    let options = datafusion::physical_plan::ReplaceChildrenOptions::new(
        datafusion::physical_plan::ChildrenPropertiesMode::Recompute,
    );
    let window = window.replace_children(vec![source], options).unwrap();
    assert!(window.downcast_ref::<window::KeyedWindowExec>().is_some());
    let (want, _) = run(window.clone(), usize::MAX).await;
    let (got, metrics) = run(window.clone(), 512 * 1024).await;
    let whole = |b: Vec<RecordBatch>| {
        datafusion::arrow::compute::concat_batches(&window.schema(), &b).unwrap()
    };
    assert_eq!(whole(got), whole(want));
    let handed = metrics.unwrap().sum_by_name("handed_to_sort").unwrap();
    assert_eq!(handed.as_usize(), 1);
}
