//! The benchmark queries, each in Sluice's, DuckDB's and ClickHouse's spelling.

/// One benchmark query in each system's spelling.
#[derive(Debug)]
pub(super) struct Query {
    pub(super) name: &'static str,
    /// JoinBase's text, sent to Sluice as written.
    pub(super) sluice: &'static str,
    /// `dt'..'` as `TIMESTAMP '..'`, `date(x)` as `CAST(x AS DATE)`, `WHERE PARTS a..b` of
    /// the `ymdh12` partitions as the pickup range they cover.
    pub(super) duckdb: &'static str,
    /// ClickHouse's: `toDateTime('..', 'UTC')`, `toDate(x)`.
    pub(super) clickhouse: &'static str,
    /// Whether the query orders its rows (else answers are compared as sets).
    pub(super) ordered: bool,
}

static QUERIES: [Query; 8] = [
    Query {
        name: "Q1",
        sluice: "select count(passenger_count) from nyct_lite",
        duckdb: "select count(passenger_count) from nyct_lite",
        clickhouse: "select count(passenger_count) from nyct_lite",
        ordered: false,
    },
    Query {
        name: "Q2",
        sluice: "select sum(passenger_count) from nyct_lite",
        duckdb: "select sum(passenger_count) from nyct_lite",
        clickhouse: "select sum(passenger_count) from nyct_lite",
        ordered: false,
    },
    Query {
        name: "Q3",
        sluice: "select sum(total_amount) from nyct_lite",
        duckdb: "select sum(total_amount) from nyct_lite",
        clickhouse: "select sum(total_amount) from nyct_lite",
        ordered: false,
    },
    Query {
        name: "Q4",
        sluice: "select payment_type,avg(passenger_count) from nyct_lite group by payment_type",
        duckdb: "select payment_type,avg(passenger_count) from nyct_lite group by payment_type",
        clickhouse: "select payment_type,avg(passenger_count) from nyct_lite group by payment_type",
        ordered: false,
    },
    Query {
        name: "Q5",
        sluice: "select vendor_id,payment_type,rate_code,sum(passenger_count) from nyct_lite where passenger_count>3 group by vendor_id,payment_type,rate_code",
        duckdb: "select vendor_id,payment_type,rate_code,sum(passenger_count) from nyct_lite where passenger_count>3 group by vendor_id,payment_type,rate_code",
        clickhouse: "select vendor_id,payment_type,rate_code,sum(passenger_count) from nyct_lite where passenger_count>3 group by vendor_id,payment_type,rate_code",
        ordered: false,
    },
    Query {
        name: "Q6",
        sluice: "select vendor_id,payment_type,rate_code,count(passenger_count),sum(trip_distance),sum(total_amount),sum(tip_amount) from nyct_lite group by vendor_id,payment_type,rate_code",
        duckdb: "select vendor_id,payment_type,rate_code,count(passenger_count),sum(trip_distance),sum(total_amount),sum(tip_amount) from nyct_lite group by vendor_id,payment_type,rate_code",
        clickhouse: "select vendor_id,payment_type,rate_code,count(passenger_count),sum(trip_distance),sum(total_amount),sum(tip_amount) from nyct_lite group by vendor_id,payment_type,rate_code",
        ordered: false,
    },
    Query {
        name: "Q7",
        sluice: "SELECT rate_code, COUNT(vendor_id) num_trips FROM nyct_lite WHERE pickup_datetime < dt'2016-02-01 00:00:00' GROUP BY rate_code ORDER BY rate_code",
        duckdb: "SELECT rate_code, COUNT(vendor_id) num_trips FROM nyct_lite WHERE pickup_datetime < TIMESTAMP '2016-02-01 00:00:00' GROUP BY rate_code ORDER BY rate_code",
        clickhouse: "SELECT rate_code, COUNT(vendor_id) num_trips FROM nyct_lite WHERE pickup_datetime < toDateTime('2016-02-01 00:00:00', 'UTC') GROUP BY rate_code ORDER BY rate_code",
        ordered: true,
    },
    Query {
        name: "Q8",
        sluice: "SELECT date(pickup_datetime), avg(fare_amount) FROM nyct_lite where parts 2016010100..2016010800 WHERE passenger_count = 1 GROUP BY date(pickup_datetime)",
        duckdb: "SELECT CAST(pickup_datetime AS DATE), avg(fare_amount) FROM nyct_lite WHERE pickup_datetime >= TIMESTAMP '2016-01-01 00:00:00' AND pickup_datetime < TIMESTAMP '2016-01-08 00:00:00' AND passenger_count = 1 GROUP BY CAST(pickup_datetime AS DATE)",
        clickhouse: "SELECT toDate(pickup_datetime), avg(fare_amount) FROM nyct_lite WHERE pickup_datetime >= toDateTime('2016-01-01 00:00:00', 'UTC') AND pickup_datetime < toDateTime('2016-01-08 00:00:00', 'UTC') AND passenger_count = 1 GROUP BY toDate(pickup_datetime)",
        ordered: false,
    },
];

/// Refunds in the last half-day partition: JoinBase's alert query.
pub(super) static ALERT: Query = Query {
    name: "alert",
    sluice: "select count(total_amount) from nyct_lite where parts 2016013112 where total_amount<0",
    duckdb: "select count(total_amount) from nyct_lite where pickup_datetime >= TIMESTAMP '2016-01-31 12:00:00' and pickup_datetime < TIMESTAMP '2016-02-01 00:00:00' and total_amount<0",
    clickhouse: "select count(total_amount) from nyct_lite where pickup_datetime >= toDateTime('2016-01-31 12:00:00', 'UTC') and pickup_datetime < toDateTime('2016-02-01 00:00:00', 'UTC') and total_amount<0",
    ordered: false,
};

/// The queries timed one by one: the eight, then the alert query (so its answer is checked
/// too).
pub(super) fn timed_queries() -> impl Iterator<Item = &'static Query> {
    QUERIES.iter().chain(std::iter::once(&ALERT))
}
