//! Collapsed ("folded") stacks: one `frame;frame;leaf value` per line, root first, as
//! written by Brendan Gregg's stackcollapse scripts, py-spy `--format raw` and rbspy.

use crate::build::{Frame, ProfileBuilder};
use crate::pprof::Profile;
use crate::{FormatError, ProfileType};

/// One parsed line: frames root first, and the sample value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoldedStack {
    pub frames: Vec<String>,
    pub value: i64,
}

/// Parses folded text. The value is the last space-separated token, so frames may contain
/// spaces (py-spy writes `eval (file.py:11)`). Blank lines are skipped.
pub fn parse(text: &[u8], max_lines: usize) -> Result<Vec<FoldedStack>, FormatError> {
    let text = std::str::from_utf8(text)
        .map_err(|err| FormatError::malformed(format!("folded stacks are not UTF-8: {err}")))?;
    let mut stacks = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r').trim();
        if line.is_empty() {
            continue;
        }
        if stacks.len() >= max_lines {
            return Err(FormatError::Limit(format!(
                "more than {max_lines} stacks in folded input"
            )));
        }
        let Some((stack, value)) = line.rsplit_once([' ', '\t']) else {
            return Err(FormatError::malformed(format!(
                "line {}: expected \"frame;frame value\"",
                index + 1
            )));
        };
        let value: i64 = value.trim().parse().map_err(|_| {
            FormatError::malformed(format!(
                "line {}: sample value {:?} is not an integer",
                index + 1,
                value.chars().take(32).collect::<String>()
            ))
        })?;
        if value < 0 {
            return Err(FormatError::malformed(format!(
                "line {}: negative sample value",
                index + 1
            )));
        }
        let frames: Vec<String> = stack
            .trim_end()
            .split(';')
            .filter(|frame| !frame.is_empty())
            .map(str::to_string)
            .collect();
        if frames.is_empty() {
            return Err(FormatError::malformed(format!(
                "line {}: empty stack",
                index + 1
            )));
        }
        stacks.push(FoldedStack { frames, value });
    }
    Ok(stacks)
}

/// A pprof of these stacks of `profile_type`, interned by [`ProfileBuilder`] like every
/// other text format: one function and one location per distinct frame, and one sample per
/// distinct stack.
pub fn to_pprof(stacks: &[FoldedStack], profile_type: &ProfileType) -> Profile {
    let mut builder = ProfileBuilder::new(
        &[(&profile_type.sample_type, &profile_type.sample_unit)],
        Some((&profile_type.period_type, &profile_type.period_unit)),
        0,
    );
    let mut location_ids = Vec::new();
    for stack in stacks {
        location_ids.clear();
        for frame in stack.frames.iter().rev() {
            location_ids.push(builder.location(&Frame {
                function: frame,
                ..Default::default()
            }));
        }
        builder.add(&location_ids, &[stack.value], &[]);
    }
    builder.finish(0, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pyspy_frames_with_spaces() {
        let stacks = parse(b"main (app.py:1);eval (file.py:11) 42\n\nfoo;bar 1\r\n", 10).unwrap();
        assert_eq!(stacks.len(), 2);
        assert_eq!(
            stacks[0].frames,
            vec!["main (app.py:1)", "eval (file.py:11)"]
        );
        assert_eq!(stacks[0].value, 42);
        assert_eq!(stacks[1].frames, vec!["foo", "bar"]);
    }

    #[test]
    fn rejects_bad_lines_with_line_numbers() {
        let err = parse(b"a;b 1\na;b x\n", 10).unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
        assert!(parse(b"nospace\n", 10).is_err());
        assert!(parse(b"a 1\nb 2\n", 1).is_err());
    }
}
