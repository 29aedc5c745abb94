//! Small CPU profiles for tests: this crate's, and other crates' through the `testing`
//! feature (a dev-dependency's).

use kiln_model::build::{Frame, ProfileBuilder};
use kiln_model::pprof::Profile;
use kiln_model::{Labels, ProfileType};

use crate::builder::{PprofInput, TypePlan};
use crate::DatasetBuilder;

/// One stack of a test profile: frames innermost first, its value and sample labels.
pub type TestSample<'a> = (&'a [&'a str], i64, &'a [(&'a str, &'a str)]);

/// A CPU profile of `samples` (frames in `main.c`, line 1).
pub fn cpu_profile(time_nanos: i64, samples: &[TestSample<'_>]) -> Profile {
    let mut profile = ProfileBuilder::new(&[("cpu", "nanoseconds")], None, 0);
    for (frames, value, sample_labels) in samples {
        let stack: Vec<u32> = frames
            .iter()
            .map(|function| {
                profile.location(&Frame {
                    function,
                    file: "main.c",
                    line: 1,
                    module: "",
                    address: 0,
                })
            })
            .collect();
        profile.add(&stack, &[*value], sample_labels);
    }
    profile.finish(time_nanos, 10)
}

/// Adds one CPU profile of `samples` (frames in `main.c`, line 1) with these series labels.
pub fn add_cpu_profile(
    builder: &mut DatasetBuilder,
    id: &str,
    labels: &[(&str, &str)],
    time_nanos: i64,
    samples: &[TestSample<'_>],
) {
    let profile = cpu_profile(time_nanos, samples);
    let index = kiln_model::pprof::validate(&profile, &Default::default()).expect("valid");
    let types = [TypePlan {
        value_index: 0,
        profile_type: ProfileType::parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds")
            .expect("profile type"),
        scale: None,
    }];
    builder.add_pprof(&PprofInput {
        profile: &profile,
        index: &index,
        id,
        time_nanos,
        duration_nanos: 10,
        labels: &Labels::from_pairs(labels.iter().copied()),
        types: &types,
        max_stack_depth: 100,
        sample_labels_per_sample: true,
    });
}
