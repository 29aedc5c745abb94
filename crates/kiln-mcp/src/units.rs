//! Values in words a person (and a model) reads at a glance: "8.36 s = 0.14 cores",
//! "310 MiB", "12.4 k".

/// A profile type id's parts: `name:sample_type:sample_unit:period_type:period_unit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileType<'a> {
    pub id: &'a str,
    pub name: &'a str,
    pub sample_type: &'a str,
    pub unit: &'a str,
}

impl<'a> ProfileType<'a> {
    pub fn parse(id: &'a str) -> ProfileType<'a> {
        let mut parts = id.split(':');
        let name = parts.next().unwrap_or(id);
        let sample_type = parts.next().unwrap_or(name);
        let unit = parts.next().unwrap_or("");
        ProfileType {
            id,
            name,
            sample_type,
            unit,
        }
    }

    /// The short name people use: `cpu`, `alloc_space`, `off_cpu`.
    pub fn short(&self) -> &'a str {
        self.sample_type
    }

    /// CPU time, whose rate over a range is a number of cores.
    fn is_cpu(&self) -> bool {
        self.unit == "nanoseconds" && self.sample_type == "cpu"
    }
}

/// `value` in its unit, and for CPU time over `span_ns` (a range, a step) the cores it
/// averages: "8.36 s = 0.14 cores".
pub fn human(value: f64, profile_type: &ProfileType<'_>, span_ns: Option<f64>) -> String {
    if value == 0.0 {
        return "0".into();
    }
    match profile_type.unit {
        "nanoseconds" => {
            let time = seconds(value / 1e9);
            match span_ns.filter(|span| *span > 0.0 && profile_type.is_cpu()) {
                Some(span) => format!("{time} = {} cores", significant(value / span)),
                None => time,
            }
        }
        "bytes" => bytes(value),
        _ => count(value),
    }
}

fn seconds(s: f64) -> String {
    let a = s.abs();
    if a < 1e-3 {
        format!("{} µs", significant(s * 1e6))
    } else if a < 1.0 {
        format!("{} ms", significant(s * 1e3))
    } else if a < 3600.0 {
        format!("{} s", significant(s))
    } else {
        format!("{} h", significant(s / 3600.0))
    }
}

fn bytes(b: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = b;
    let mut unit = 0;
    while value.abs() >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value:.0} B")
    } else {
        format!("{} {}", significant(value), UNITS[unit])
    }
}

fn count(n: f64) -> String {
    let a = n.abs();
    if a < 1e4 {
        format!("{n:.0}")
    } else if a < 1e6 {
        format!("{} k", significant(n / 1e3))
    } else if a < 1e9 {
        format!("{} M", significant(n / 1e6))
    } else {
        format!("{} G", significant(n / 1e9))
    }
}

/// Three significant figures, no trailing zeros past the point: 8.36, 12.4, 310, 0.0412.
pub fn significant(x: f64) -> String {
    let a = x.abs();
    let decimals = if a == 0.0 || a >= 100.0 {
        0
    } else if a >= 10.0 {
        1
    } else if a >= 1.0 {
        2
    } else {
        (2 - a.log10().floor() as i32).clamp(2, 9) as usize
    };
    let text = format!("{x:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// A share as a percentage with two decimals: "69.64 %".
pub fn percent(part: f64, whole: f64) -> String {
    if whole == 0.0 {
        return "0.00 %".into();
    }
    format!("{:.2} %", 100.0 * part / whole)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

    #[test]
    fn cpu_time_over_a_range_is_cores() {
        let cpu = ProfileType::parse(CPU);
        assert_eq!(cpu.short(), "cpu");
        // 8.36 s in a minute.
        assert_eq!(human(8.36e9, &cpu, Some(60e9)), "8.36 s = 0.139 cores");
        assert_eq!(
            human(2.4e9 * 3600.0, &cpu, Some(3600e9)),
            "2.4 h = 2.4 cores"
        );
        assert_eq!(human(15.1e6, &cpu, None), "15.1 ms");
    }

    #[test]
    fn bytes_and_counts() {
        let heap = ProfileType::parse("memory:inuse_space:bytes:space:bytes");
        assert_eq!(human(310.0 * 1024.0 * 1024.0, &heap, Some(1.0)), "310 MiB");
        assert_eq!(human(512.0, &heap, None), "512 B");
        let objects = ProfileType::parse("memory:alloc_objects:count:space:bytes");
        assert_eq!(human(12_400.0, &objects, None), "12.4 k");
        assert_eq!(human(999.0, &objects, None), "999");
    }

    #[test]
    fn shares() {
        assert_eq!(percent(1.0, 3.0), "33.33 %");
        assert_eq!(percent(1.0, 0.0), "0.00 %");
        assert_eq!(significant(0.04123), "0.0412");
        assert_eq!(significant(100.0), "100");
    }
}
