//! The text output of `perf script` (Linux perf): per sample a header line
//! (`comm pid/tid [cpu] time: period event:`) and then one indented line per frame,
//! leaf first (`address symbol+offset (module)`), up to a blank line.
//!
//! Samples are grouped by `comm` and `pid` into labels. Clock events (`cpu-clock`,
//! `task-clock`) carry their period in nanoseconds and become CPU time; any other event
//! is counted in its own unit (its period, or 1 per sample without one). Frames perf
//! could not symbolize (`[unknown]`) keep their module and address.

use crate::build::{Frame, ProfileBuilder};
use crate::pprof::Profile;
use crate::FormatError;

struct Header<'a> {
    comm: &'a str,
    pid: &'a str,
    period: Option<i64>,
    event: &'a str,
}

/// `comm` may hold spaces, so the header is read from its fixed parts: the first token
/// after the command that is a pid (`123` or `123/456`) followed by a `[cpu]` or a
/// `seconds.fraction:` time.
fn parse_header(line: &str) -> Option<Header<'_>> {
    let tokens: Vec<&str> = line.split_whitespace().collect();
    let is_pid = |token: &str| {
        let mut parts = token.splitn(2, '/');
        parts
            .next()
            .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
            && parts
                .next()
                .is_none_or(|tid| !tid.is_empty() && tid.bytes().all(|b| b.is_ascii_digit()))
    };
    let is_time = |token: &str| {
        token
            .strip_suffix(':')
            .is_some_and(|time| time.contains('.') && time.parse::<f64>().is_ok())
    };
    let pid_at = (1..tokens.len()).find(|&at| {
        is_pid(tokens[at])
            && tokens
                .get(at + 1)
                .is_some_and(|next| next.starts_with('[') || is_time(next))
    })?;
    let comm_end =
        tokens[pid_at - 1].as_ptr() as usize - line.as_ptr() as usize + tokens[pid_at - 1].len();
    let comm = line[..comm_end].trim();
    let pid = tokens[pid_at].split('/').next().unwrap_or_default();
    let rest = &tokens[pid_at + 1..];
    let time_at = rest.iter().position(|token| is_time(token))?;
    let after_time = &rest[time_at + 1..];
    let (period, event) = match after_time {
        [period, event, ..] if period.bytes().all(|b| b.is_ascii_digit()) => {
            (period.parse().ok(), *event)
        }
        [event, ..] => (None, *event),
        [] => return None,
    };
    // `cpu-clock:pppH:` and `cycles:u:` name the event before the first colon.
    let event = event.split(':').next().unwrap_or(event);
    Some(Header {
        comm,
        pid,
        period,
        event,
    })
}

/// A frame line: `address symbol+0xoffset (module)`; the symbol may hold spaces.
fn parse_frame(line: &str) -> Option<Frame<'_>> {
    let line = line.trim();
    let (address, rest) = line.split_once(char::is_whitespace)?;
    let address = u64::from_str_radix(address, 16).ok()?;
    let rest = rest.trim();
    let (symbol, module) = match rest.rfind(" (") {
        Some(open) if rest.ends_with(')') => (&rest[..open], &rest[open + 2..rest.len() - 1]),
        _ => (rest, ""),
    };
    // Drop the offset into the function, so its samples aggregate by function.
    let symbol = match symbol.rfind("+0x") {
        Some(plus) if symbol[plus + 3..].bytes().all(|b| b.is_ascii_hexdigit()) => &symbol[..plus],
        _ => symbol,
    };
    let function = if symbol == "[unknown]" { "" } else { symbol };
    Some(Frame {
        function,
        module,
        address: if function.is_empty() { address } else { 0 },
        ..Default::default()
    })
}

fn is_clock(event: &str) -> bool {
    matches!(event, "cpu-clock" | "task-clock")
}

/// Parses `perf script` output into one pprof with a sample type per event.
pub fn parse(text: &[u8], max_samples: usize) -> Result<Profile, FormatError> {
    let text = std::str::from_utf8(text)
        .map_err(|err| FormatError::malformed(format!("perf script output is not UTF-8: {err}")))?;
    struct Sample<'a> {
        header: Header<'a>,
        frames: Vec<Frame<'a>>,
    }
    let mut samples: Vec<Sample<'_>> = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if line.starts_with(char::is_whitespace) {
            let Some(sample) = samples.last_mut() else {
                return Err(FormatError::malformed(format!(
                    "perf script line {}: a frame before any sample header",
                    number + 1
                )));
            };
            // Other indented lines (srcline, brstack) are not frames; skip them.
            if let Some(frame) = parse_frame(line) {
                sample.frames.push(frame);
            }
            continue;
        }
        let header = parse_header(line).ok_or_else(|| {
            FormatError::malformed(format!(
                "perf script line {}: {:?} is not a sample header (comm pid [cpu] time: event:)",
                number + 1,
                line.chars().take(120).collect::<String>()
            ))
        })?;
        samples.push(Sample {
            header,
            frames: Vec::new(),
        });
    }
    if samples.is_empty() {
        return Err(FormatError::malformed(
            "perf script output holds no samples",
        ));
    }
    let mut events: Vec<&str> = Vec::new();
    for sample in &samples {
        if !events.contains(&sample.header.event) {
            events.push(sample.header.event);
        }
    }
    let types: Vec<(&str, &str)> = events
        .iter()
        .map(|event| {
            if is_clock(event) {
                ("cpu", "nanoseconds")
            } else {
                (*event, "count")
            }
        })
        .collect();
    let period_type = types.first().copied();
    let mut builder = ProfileBuilder::new(&types, period_type, 0);
    let mut stack = Vec::new();
    let mut values = vec![0i64; events.len()];
    for sample in &samples {
        if sample.frames.is_empty() {
            continue;
        }
        stack.clear();
        for frame in &sample.frames {
            stack.push(builder.location(frame));
        }
        let column = events
            .iter()
            .position(|event| *event == sample.header.event)
            .unwrap_or(0);
        values.iter_mut().for_each(|value| *value = 0);
        values[column] = sample.header.period.unwrap_or(1);
        builder.add(
            &stack,
            &values,
            &[("comm", sample.header.comm), ("pid", sample.header.pid)],
        );
        if builder.sample_count() > max_samples {
            return Err(FormatError::Limit(format!(
                "perf script output has more than {max_samples} distinct stacks"
            )));
        }
    }
    Ok(builder.finish(0, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPT: &str = "\
burner 4242 [001] 12345.678901:     250000 cpu-clock:pppH: 
\t    55d4c3a2b1c4 spin+0x24 (/usr/bin/burner)
\t    55d4c3a2b000 main+0x10 (/usr/bin/burner)
\t    7f1234567890 [unknown] (/usr/lib/x86_64-linux-gnu/libc.so.6)

burner 4242 [000] 12345.679901:     250000 cpu-clock:pppH: 
\t    55d4c3a2b1c8 spin+0x28 (/usr/bin/burner)
\t    55d4c3a2b000 main+0x10 (/usr/bin/burner)
\t    7f1234567890 [unknown] (/usr/lib/x86_64-linux-gnu/libc.so.6)

Web Content 77/78 [002] 12345.680000:     250000 cpu-clock:pppH: 
\tffffffff81234567 std::vector<int, std::allocator<int> >::push_back(int const&)+0x1c ([kernel.kallsyms])

";

    #[test]
    fn samples_group_by_comm_and_pid_and_frames_aggregate_by_function() {
        let profile = parse(SCRIPT.as_bytes(), 1000).unwrap();
        assert_eq!(profile.sample_type.len(), 1);
        assert_eq!(
            profile.string_or_empty(profile.sample_type[0].r#type),
            "cpu"
        );
        assert_eq!(profile.sample.len(), 2);
        let first = profile.sample.get(0).unwrap();
        assert_eq!(first.value, &[500_000]);
        assert_eq!(first.location_id.len(), 3);
        let labels: Vec<(String, String)> = profile
            .sample
            .get(1)
            .unwrap()
            .label
            .iter()
            .map(|l| {
                (
                    profile.string_or_empty(l.key),
                    profile.string_or_empty(l.str),
                )
            })
            .collect();
        assert!(
            labels.contains(&("comm".into(), "Web Content".into())),
            "{labels:?}"
        );
        assert!(labels.contains(&("pid".into(), "77".into())), "{labels:?}");
        let names: Vec<String> = profile
            .function
            .iter()
            .map(|f| profile.string_or_empty(f.name))
            .collect();
        assert!(
            names.contains(&"std::vector<int, std::allocator<int> >::push_back(int const&)".into())
        );
        // The unknown libc frame keeps its module and address.
        let unknown = profile.location.iter().find(|l| l.line.is_empty()).unwrap();
        assert_eq!(unknown.address, 0x7f1234567890);
        assert!(crate::pprof::validate(&profile, &Default::default()).is_ok());
    }

    #[test]
    fn garbage_is_refused_with_the_line() {
        let err = parse(b"hello world\n", 1000).err().unwrap().to_string();
        assert!(err.contains("line 1"), "{err}");
        let err = parse(b"\t1234 main (/bin/x)\n", 1000)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("before any sample header"), "{err}");
        assert!(parse(b"", 1000).is_err());
    }
}
