//! A deterministic stand-in for JoinBase's `nyct_lite` data set (New York yellow cab trips of
//! January 2016): same columns, realistic distributions, a few rows from late 2017 like the
//! real file, generated from a seed so every run and every machine sees the same rows.
//!
//! Row `i` depends only on `(seed, rows, i)`, so the rows can be generated in any order, in
//! parallel and in chunks of any size. Pickup times rise with `i` (rows come in time order,
//! like readings arriving at a broker), denser by day than by night, on weekdays than on
//! Sundays, and thin on January 23-24 (the 2016 blizzard). Money is generated in cents and
//! written with two decimals, so `total_amount` is exactly the sum of its parts and both
//! sides of a comparison parse the same decimal text into the same `Float32`.

use std::fmt::Write as _;

/// The table, exactly as JoinBase's benchmark creates it (it also creates database
/// `benchmark`).
pub const DDL: &str = "CREATE TABLE benchmark.nyct_lite(vendor_id String, pickup_datetime DateTime, dropoff_datetime DateTime, passenger_count Int8, trip_distance Float32, pickup_longitude Float32, pickup_latitude Float32, rate_code Int8, dropoff_longitude Float32, dropoff_latitude Float32, payment_type Int8, fare_amount Float32, extra Float32, mta_tax Float32, tip_amount Float32, tolls_amount Float32, improvement_surcharge Float32, total_amount Float32) PARTITION BY ymdh12(pickup_datetime)";

/// The generator's version: bump it whenever the rows it makes change, so files written by an
/// older one are not reused.
pub const VERSION: u32 = 1;

/// Rows of the real `nyct_lite`.
pub const FULL_ROWS: usize = 10_906_860;

/// Rows with a pickup in November or December 2017 (at most; fewer in tiny data sets).
pub const LATE_ROWS: usize = 12;

/// 2016-01-01 00:00:00 UTC in Unix seconds.
const JAN_2016: i64 = 1_451_606_400;
/// 2017-11-01 00:00:00 UTC in Unix seconds.
const NOV_2017: i64 = 1_509_494_400;
const DAY: i64 = 86_400;

/// Relative pickups per hour of the day (NYC yellow cabs: a trough at 5 am, a peak at 7 pm).
const HOURLY: [f64; 24] = [
    0.55, 0.40, 0.30, 0.22, 0.17, 0.17, 0.35, 0.55, 0.65, 0.65, 0.63, 0.65, 0.70, 0.70, 0.73, 0.72,
    0.65, 0.75, 0.90, 0.92, 0.85, 0.85, 0.85, 0.72,
];
/// Relative pickups per weekday, Monday first.
const WEEKDAY: [f64; 7] = [0.85, 0.92, 0.97, 1.03, 1.08, 1.05, 0.90];

/// splitmix64: tiny, fast, and good enough to draw benchmark data from.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose stream is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.unit(); // (0, 1]: ln stays finite
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// One of `table`'s values, each as likely as its weight (per 10,000).
    fn pick<T: Copy>(&mut self, table: &[(T, u64)]) -> T {
        let total: u64 = table.iter().map(|e| e.1).sum();
        let mut r = self.below(total);
        for &(v, w) in table {
            if r < w {
                return v;
            }
            r -= w;
        }
        table[table.len() - 1].0
    }
}

/// The splitmix64 finaliser.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The data set: `rows` trips drawn from `seed`.
#[derive(Debug, Clone)]
pub struct Generator {
    seed: u64,
    rows: usize,
    late: Vec<usize>,
    /// Cumulative share of January's pickups by the end of each of its 744 hours.
    cdf: Vec<f64>,
}

impl Generator {
    /// `rows` trips from `seed`.
    pub fn new(rows: usize, seed: u64) -> Self {
        // Spread the late rows evenly through the file, as stray records are in the real one.
        let n_late = LATE_ROWS.min(rows / 1000);
        let late = (0..n_late)
            .map(|j| j * rows / n_late + rows / (2 * n_late))
            .collect();
        let mut cdf = Vec::with_capacity(31 * 24);
        let mut sum = 0.0;
        for day in 0..31 {
            // 2016-01-01 was a Friday (weekday 4, Monday = 0).
            let mut w = WEEKDAY[(day + 4) % 7];
            w *= match day + 1 {
                23 => 0.3, // the blizzard: a travel ban from the afternoon
                24 => 0.6,
                _ => 1.0,
            };
            for h in HOURLY {
                sum += w * h;
                cdf.push(sum);
            }
        }
        for c in &mut cdf {
            *c /= sum;
        }
        Self {
            seed,
            rows,
            late,
            cdf,
        }
    }

    /// Rows in the data set.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// How many rows have a pickup in late 2017.
    pub fn late_rows(&self) -> usize {
        self.late.len()
    }

    /// Appends rows `range` as CSV lines (table column order, no header) to `out`.
    pub fn write_csv(&self, range: std::ops::Range<usize>, out: &mut String) {
        for i in range {
            self.trip(i).write_csv(out);
        }
    }

    /// Pickup time of January row `i`, in seconds since the start of 2016: the inverse of the
    /// hourly distribution at the row's quantile (jittered within the row's own share).
    fn january_pickup(&self, i: usize, rng: &mut Rng) -> i64 {
        let u = ((i as f64 + rng.unit()) / self.rows as f64).min(1.0 - 1e-12);
        let h = self.cdf.partition_point(|&c| c <= u);
        let lo = if h == 0 { 0.0 } else { self.cdf[h - 1] };
        let frac = (u - lo) / (self.cdf[h] - lo);
        h as i64 * 3600 + ((frac * 3600.0) as i64).min(3599)
    }

    /// Row `i`.
    pub fn trip(&self, i: usize) -> Trip {
        let mut rng = Rng::new(mix(self.seed ^ mix(i as u64)));
        let pickup = if self.late.binary_search(&i).is_ok() {
            NOV_2017 + rng.below(61 * DAY as u64) as i64
        } else {
            JAN_2016 + self.january_pickup(i, &mut rng)
        };
        let hour = pickup.rem_euclid(DAY) / 3600;
        // 1970-01-01 was a Thursday (weekday 3).
        let weekday = ((pickup.div_euclid(DAY) + 3) % 7) as usize;

        let vendor_id = if rng.chance(0.53) { "2" } else { "1" };
        let passenger_count = rng.pick(&[
            (1, 7050),
            (2, 1420),
            (3, 410),
            (4, 200),
            (5, 560),
            (6, 350),
            (0, 5),
            (7, 2),
            (8, 2),
            (9, 1),
        ]);
        // JFK flat fares (rate 2), Newark (rate 3), the rest inside the city.
        let rate_code = rng.pick(&[
            (1, 9740),
            (2, 200),
            (3, 20),
            (4, 8),
            (5, 30),
            (6, 1),
            (99, 1),
        ]);
        let miles = match rate_code {
            2 => (17.0 + 2.5 * rng.normal()).max(8.0),
            3 => (16.0 + 3.0 * rng.normal()).max(8.0),
            _ if rng.chance(0.004) => 0.0,
            _ => (0.5 + 0.75 * rng.normal()).exp().clamp(0.01, 60.0),
        };
        let distance = (miles * 100.0).round() as i64;
        // Slower by day than by night, faster on highways to the airports.
        let mph = match (rate_code, hour) {
            (2 | 3, _) => 20.0,
            (_, 7..=19) => 9.0,
            _ => 14.0,
        } * (0.75 + 0.5 * rng.unit());
        let minutes = (miles / mph * 60.0 + 1.0 + 2.0 * rng.unit()).max(1.0);
        let dropoff = pickup + (minutes * 60.0) as i64;

        let (pickup_lon, pickup_lat, dropoff_lon, dropoff_lat) = if rng.chance(0.017) {
            (0.0, 0.0, 0.0, 0.0) // no GPS fix: the real file has these too
        } else {
            let lon = -73.982 + 0.025 * rng.normal();
            let lat = 40.752 + 0.030 * rng.normal();
            let (dlon, dlat) = if rate_code == 2 {
                (
                    -73.7822 + 0.003 * rng.normal(),
                    40.6441 + 0.003 * rng.normal(),
                )
            } else {
                // About 0.019 degrees of longitude and 0.0145 of latitude to a mile here;
                // streets make the straight line shorter than the trip.
                let angle = std::f64::consts::TAU * rng.unit();
                (
                    lon + 0.7 * miles * 0.019 * angle.cos(),
                    lat + 0.7 * miles * 0.0145 * angle.sin(),
                )
            };
            (lon, lat, dlon, dlat)
        };

        let payment_type = rng.pick(&[(1, 6600), (2, 3330), (3, 50), (4, 20)]);
        // Money in cents. The meter: $2.50, then $2.50 a mile and some time in traffic,
        // in 50-cent steps.
        let metered = 250 + (250.0 * miles + 25.0 * minutes * rng.unit()) as i64 / 50 * 50;
        let fare = match rate_code {
            2 => 5200,
            3 => 1750 + metered,
            4 => 2 * metered,
            5 => 100 * (20 + rng.below(81) as i64),
            _ => metered,
        };
        let night = !(6..20).contains(&hour);
        let rush = weekday < 5 && (16..20).contains(&hour);
        let extra = match rate_code {
            2 | 5 => 0,
            _ if night => 50,
            _ if rush => 100,
            _ => 0,
        };
        let mta_tax = if rate_code == 5 && rng.chance(0.5) {
            0
        } else {
            50
        };
        let tolls = match rate_code {
            3 => 1500,
            2 if rng.chance(0.3) => 554,
            _ if rng.chance(0.03) => 554,
            _ => 0,
        };
        let tip = if payment_type == 1 {
            let pct = rng.pick(&[
                (0, 800),
                (10, 400),
                (15, 1500),
                (18, 1200),
                (20, 3500),
                (22, 800),
                (25, 1300),
                (30, 500),
            ]);
            (fare + extra) * pct / 100
        } else {
            0
        };
        let surcharge = 30;
        let mut trip = Trip {
            vendor_id,
            pickup,
            dropoff,
            passenger_count,
            distance,
            pickup_lon,
            pickup_lat,
            rate_code,
            dropoff_lon,
            dropoff_lat,
            payment_type,
            fare,
            extra,
            mta_tax,
            tip,
            tolls,
            surcharge,
        };
        // Refunds and disputes: every amount negated, paid with "no charge" or "dispute".
        if rng.chance(0.001) {
            trip.payment_type = if rng.chance(0.5) { 3 } else { 4 };
            trip.tip = 0;
            for c in [
                &mut trip.fare,
                &mut trip.extra,
                &mut trip.mta_tax,
                &mut trip.tolls,
                &mut trip.surcharge,
            ] {
                *c = -*c;
            }
        }
        trip
    }
}

/// One trip; money in cents, distance in hundredths of a mile, times in Unix seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Trip {
    /// "1" (Creative Mobile) or "2" (VeriFone).
    pub vendor_id: &'static str,
    /// Pickup, Unix seconds.
    pub pickup: i64,
    /// Dropoff, Unix seconds.
    pub dropoff: i64,
    /// Passengers, 0..=9.
    pub passenger_count: i8,
    /// Hundredths of a mile.
    pub distance: i64,
    /// Degrees (0 without a GPS fix).
    pub pickup_lon: f64,
    /// Degrees.
    pub pickup_lat: f64,
    /// 1 standard, 2 JFK, 3 Newark, 4 Nassau/Westchester, 5 negotiated, 6 group, 99 unknown.
    pub rate_code: i8,
    /// Degrees.
    pub dropoff_lon: f64,
    /// Degrees.
    pub dropoff_lat: f64,
    /// 1 card, 2 cash, 3 no charge, 4 dispute.
    pub payment_type: i8,
    /// Cents.
    pub fare: i64,
    /// Cents.
    pub extra: i64,
    /// Cents.
    pub mta_tax: i64,
    /// Cents.
    pub tip: i64,
    /// Cents.
    pub tolls: i64,
    /// Cents.
    pub surcharge: i64,
}

impl Trip {
    /// Cents: the sum of the parts, as the real `total_amount` is.
    pub fn total(&self) -> i64 {
        self.fare + self.extra + self.mta_tax + self.tip + self.tolls + self.surcharge
    }

    /// Appends the trip as one CSV line in table column order.
    pub fn write_csv(&self, out: &mut String) {
        out.push_str(self.vendor_id);
        out.push(',');
        timestamp(out, self.pickup);
        out.push(',');
        timestamp(out, self.dropoff);
        let _ = write!(out, ",{},", self.passenger_count);
        fixed(out, self.distance, 2);
        out.push(',');
        degrees(out, self.pickup_lon);
        out.push(',');
        degrees(out, self.pickup_lat);
        let _ = write!(out, ",{},", self.rate_code);
        degrees(out, self.dropoff_lon);
        out.push(',');
        degrees(out, self.dropoff_lat);
        let _ = write!(out, ",{}", self.payment_type);
        for cents in [
            self.fare,
            self.extra,
            self.mta_tax,
            self.tip,
            self.tolls,
            self.surcharge,
            self.total(),
        ] {
            out.push(',');
            fixed(out, cents, 2);
        }
        out.push('\n');
    }
}

/// `v / 10^decimals` written exactly with `decimals` digits after the point.
fn fixed(out: &mut String, v: i64, decimals: u32) {
    let scale = 10i64.pow(decimals);
    let sign = if v < 0 { "-" } else { "" };
    let a = v.unsigned_abs();
    let _ = write!(
        out,
        "{sign}{}.{:0width$}",
        a / scale as u64,
        a % scale as u64,
        width = decimals as usize
    );
}

/// Degrees with six decimals (about 10 cm), as GPS logs have them.
fn degrees(out: &mut String, v: f64) {
    fixed(out, (v * 1e6).round() as i64, 6);
}

/// `YYYY-MM-DD HH:MM:SS` (UTC).
fn timestamp(out: &mut String, secs: i64) {
    let (y, m, d) = civil(secs.div_euclid(DAY));
    let s = secs.rem_euclid(DAY);
    let _ = write!(
        out,
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        s / 3600,
        s / 60 % 60,
        s % 60
    );
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csv(g: &Generator, range: std::ops::Range<usize>) -> String {
        let mut s = String::new();
        g.write_csv(range, &mut s);
        s
    }

    #[test]
    fn same_seed_same_rows_in_any_chunking() {
        let g = Generator::new(50_000, 7);
        let whole = csv(&g, 0..50_000);
        let parts = csv(&g, 0..12_345) + &csv(&g, 12_345..50_000);
        assert_eq!(whole, parts);
        assert_eq!(whole, csv(&Generator::new(50_000, 7), 0..50_000));
        assert_ne!(whole, csv(&Generator::new(50_000, 8), 0..50_000));
        assert_eq!(whole.lines().count(), 50_000);
        assert!(whole.lines().all(|l| l.split(',').count() == 18));
    }

    #[test]
    fn january_in_time_order_with_a_few_late_2017_rows() {
        let g = Generator::new(100_000, 1);
        assert_eq!(g.late_rows(), LATE_ROWS);
        let trips: Vec<Trip> = (0..g.rows()).map(|i| g.trip(i)).collect();
        let (late, jan): (Vec<&Trip>, Vec<&Trip>) =
            trips.iter().partition(|t| t.pickup >= NOV_2017);
        assert_eq!(late.len(), LATE_ROWS);
        assert!(late.iter().all(|t| t.pickup < NOV_2017 + 61 * DAY));
        assert!(
            jan.iter()
                .all(|t| (JAN_2016..JAN_2016 + 31 * DAY).contains(&t.pickup))
        );
        assert!(jan.windows(2).all(|w| w[0].pickup <= w[1].pickup));
        assert!(trips.iter().all(|t| t.dropoff > t.pickup));
        // Busier at 7 pm than at 5 am.
        let at = |h: i64| jan.iter().filter(|t| t.pickup % DAY / 3600 == h).count();
        assert!(at(19) > 3 * at(5), "{} vs {}", at(19), at(5));
    }

    #[test]
    fn distributions_look_like_taxi_trips() {
        let g = Generator::new(200_000, 2);
        let trips: Vec<Trip> = (0..g.rows()).map(|i| g.trip(i)).collect();
        let share = |f: &dyn Fn(&Trip) -> bool| {
            trips.iter().filter(|t| f(t)).count() as f64 / trips.len() as f64
        };
        assert!((0.65..0.75).contains(&share(&|t| t.passenger_count == 1)));
        assert!((0.95..0.99).contains(&share(&|t| t.rate_code == 1)));
        assert!((0.98..0.998).contains(&share(&|t| t.payment_type <= 2)));
        assert!((0.0005..0.002).contains(&share(&|t| t.total() < 0)));
        let mean_total = trips.iter().map(Trip::total).sum::<i64>() as f64 / 100.0 / 200_000.0;
        assert!((10.0..25.0).contains(&mean_total), "{mean_total}");
        let mut miles: Vec<i64> = trips.iter().map(|t| t.distance).collect();
        miles.sort();
        let median = miles[miles.len() / 2] as f64 / 100.0;
        assert!((1.2..2.5).contains(&median), "{median}");
    }

    #[test]
    fn text_is_exact() {
        let mut s = String::new();
        fixed(&mut s, -5, 2);
        s.push(' ');
        fixed(&mut s, 1234, 2);
        s.push(' ');
        degrees(&mut s, -73.9821);
        s.push(' ');
        timestamp(&mut s, JAN_2016 + 31 * DAY - 1);
        s.push(' ');
        timestamp(&mut s, 951_782_400); // 2000-02-29
        assert_eq!(
            s,
            "-0.05 12.34 -73.982100 2016-01-31 23:59:59 2000-02-29 00:00:00"
        );
    }
}
