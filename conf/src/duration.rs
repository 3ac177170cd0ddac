//! Human durations: `"500ms"`, `"10s"`, `"10m"`, `"2h"`, `"30 days"`, `"1w"`.

use std::time::Duration;

/// Parses a number followed by a unit (ms, s, m, h, d, w, y (365 days) and their long forms, plural or
/// not, with or without a space between).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("'{text}' is not a duration (e.g. '10m', '30 days')"))?;
    let secs = match unit.trim().to_ascii_lowercase().as_str() {
        "ms" | "millis" | "millisecond" | "milliseconds" => n / 1000.0,
        "" | "s" | "sec" | "secs" | "second" | "seconds" => n,
        "m" | "min" | "mins" | "minute" | "minutes" => n * 60.0,
        "h" | "hour" | "hours" => n * 3600.0,
        "d" | "day" | "days" => n * 86400.0,
        "w" | "week" | "weeks" => n * 7.0 * 86400.0,
        "y" | "year" | "years" => n * 365.0 * 86400.0,
        other => return Err(format!("unknown duration unit '{other}' in '{text}'")),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("'{text}' is not a duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(
            parse_duration("30 days").unwrap(),
            Duration::from_secs(30 * 86400)
        );
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(
            parse_duration("1 week").unwrap(),
            Duration::from_secs(7 * 86400)
        );
        assert!(parse_duration("ten minutes").is_err());
        assert!(parse_duration("3 fortnights").is_err());
    }
}
