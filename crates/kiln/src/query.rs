//! `kiln query`: the query API from a terminal. It calls a server's
//! `querier.v1.QuerierService` (Connect, `application/proto`) exactly as the UI does, and
//! prints what a pipe or a person wants: SVG or folded flame graphs, pprof files, top
//! tables, series as text or CSV, diffs, labels.
//!
//! Times are `now`, `now-1h` and the like, RFC 3339, or epoch seconds/ms/µs/ns; `0` is the
//! epoch. A query that matches no data says so on standard error and exits with
//! [`NO_DATA`], so a script can tell "nothing there" from an error (1) and bad usage (2).

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use kiln_query::api;
use prost::Message;

/// Exit status of a query that matched no data.
pub const NO_DATA: u8 = 3;

/// Which server, and as which tenant: shared by the commands that call a server's API.
#[derive(Args)]
pub struct ServerAddress {
    /// Server URL.
    #[arg(
        long,
        env = "KILN_URL",
        default_value = "http://localhost:4040",
        global = true
    )]
    pub url: String,
    /// Tenant (sent as X-Scope-OrgID).
    #[arg(long, env = "KILN_TENANT", global = true)]
    pub tenant: Option<String>,
    #[command(flatten)]
    pub auth: crate::client::ClientAuth,
}

#[derive(Args)]
pub struct QueryArgs {
    #[command(flatten)]
    server: ServerAddress,
    #[command(subcommand)]
    command: QueryCommand,
}

/// What to select: `TYPE{matchers}`, where TYPE is a profile type id
/// (`process_cpu:cpu:nanoseconds:cpu:nanoseconds`) or a legacy `app.cpu` name.
#[derive(Args, Clone)]
struct Selection {
    /// Query, e.g. 'process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name="api"}'.
    #[arg(long, short)]
    query: String,
    /// Start: now-1h, RFC 3339, or epoch seconds/ms/µs/ns (0 is the epoch).
    #[arg(long, default_value = "now-1h")]
    from: String,
    /// End, in the same forms.
    #[arg(long, default_value = "now")]
    to: String,
}

impl Selection {
    fn describe(&self) -> String {
        format!("{} between {} and {}", self.query, self.from, self.to)
    }
}

#[derive(Subcommand)]
enum QueryCommand {
    /// A merged flame graph: SVG by default, or folded stacks, pprof or JSON.
    Flamegraph {
        #[command(flatten)]
        selection: Selection,
        #[arg(long, value_enum, default_value = "svg")]
        format: FlameFormat,
        /// Nodes to keep; the rest are summed into "other" nodes (0: the server's
        /// default, -1: every node).
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        max_nodes: i64,
        /// Output file [default: standard output].
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
    /// Functions by self and total value.
    Top {
        #[command(flatten)]
        selection: Selection,
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Sort by total instead of self.
        #[arg(long)]
        by_total: bool,
        /// Print values as plain numbers in the profile's unit, not as `1.23 s` or `4.5 MiB`.
        #[arg(long)]
        raw: bool,
    },
    /// Totals over time, one series per value of the group-by labels.
    Series {
        #[command(flatten)]
        selection: Selection,
        /// Step in seconds.
        #[arg(long, default_value_t = 60.0)]
        step: f64,
        #[arg(long = "group-by")]
        group_by: Vec<String>,
        #[arg(long, value_enum, default_value = "text")]
        format: SeriesFormat,
    },
    /// Biggest changes per function between two selections or two time ranges.
    Diff {
        #[command(flatten)]
        left: Selection,
        /// Right-hand query [default: the left query].
        #[arg(long)]
        right_query: Option<String>,
        /// Right-hand start [default: the left start].
        #[arg(long)]
        right_from: Option<String>,
        /// Right-hand end [default: the left end].
        #[arg(long)]
        right_to: Option<String>,
        #[arg(long, default_value_t = 10)]
        limit: usize,
        /// Rank every function's change with its statistical confidence (the server's
        /// `POST /api/v1/compare`, docs/insight.md) instead of by size alone.
        #[arg(long)]
        explain: bool,
    },
    /// Label names, or the values of one label.
    Labels {
        /// List the values of this label instead of the names.
        #[arg(long)]
        name: Option<String>,
        /// Only series matching this selector, e.g. '{service_name="api"}'.
        #[arg(long, short)]
        query: Option<String>,
        /// Start, as for the other subcommands.
        #[arg(long, default_value = "now-1h")]
        from: String,
        #[arg(long, default_value = "now")]
        to: String,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum FlameFormat {
    Svg,
    Folded,
    Pprof,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum SeriesFormat {
    Text,
    Csv,
}

struct Client {
    url: String,
    tenant: Option<String>,
    authorization: Option<String>,
    http: reqwest::blocking::Client,
}

impl Client {
    /// One POST to the server (`path` after its URL), with the tenant; shows a spinner
    /// on a terminal while it waits. `what` names it in errors.
    fn post(
        &self,
        what: &str,
        path: &str,
        content_type: &str,
        body: &[u8],
    ) -> anyhow::Result<Vec<u8>> {
        let url = format!("{}{path}", self.url.trim_end_matches('/'));
        let mut http = self
            .http
            .post(&url)
            .header("Content-Type", content_type)
            .body(body.to_vec());
        if let Some(tenant) = &self.tenant {
            http = http.header("X-Scope-OrgID", tenant);
        }
        if let Some(authorization) = &self.authorization {
            http = http.header("Authorization", authorization);
        }
        let progress = Progress::start(what);
        let result = http.send();
        progress.stop();
        match result {
            Ok(response) if response.status().is_success() => Ok(response
                .bytes()
                .context("cannot read the response")?
                .to_vec()),
            Ok(response) => {
                let status = response.status().as_u16();
                let text = response.text().unwrap_or_default();
                let message = serde_json::from_str::<serde_json::Value>(&text)
                    .ok()
                    .and_then(|error| error["message"].as_str().map(str::to_string))
                    .unwrap_or(text);
                bail!("{what} failed with HTTP {status}: {}", message.trim())
            }
            Err(err) => Err(err).with_context(|| format!("cannot reach {url}")),
        }
    }

    /// One unary Connect call.
    fn call_raw(&self, method: &str, request: &impl Message) -> anyhow::Result<Vec<u8>> {
        let path = format!("/querier.v1.QuerierService/{method}");
        self.post(method, &path, "application/proto", &request.encode_to_vec())
    }

    /// A JSON POST to one of Kiln's own APIs.
    fn post_json(&self, path: &str, body: &serde_json::Value) -> anyhow::Result<serde_json::Value> {
        let answer = self.post(path, path, "application/json", body.to_string().as_bytes())?;
        serde_json::from_slice(&answer).with_context(|| format!("invalid answer from {path}"))
    }

    fn call<T: Message + Default>(
        &self,
        method: &str,
        request: &impl Message,
    ) -> anyhow::Result<T> {
        let body = self.call_raw(method, request)?;
        T::decode(body.as_slice()).with_context(|| format!("invalid {method} response"))
    }
}

/// A spinner on standard error after half a second, only when it is a terminal.
struct Progress {
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    fn start(what: &str) -> Progress {
        let done = Arc::new(AtomicBool::new(false));
        if !std::io::stderr().is_terminal() {
            return Progress { done, thread: None };
        }
        let flag = done.clone();
        let what = what.to_string();
        let thread = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(500));
            let frames = ['|', '/', '-', '\\'];
            let mut frame = 0;
            while !flag.load(Ordering::Relaxed) {
                eprint!("\r{} {what}…", frames[frame % frames.len()]);
                frame += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            if frame > 0 {
                eprint!("\r{}\r", " ".repeat(what.len() + 4));
            }
        });
        Progress {
            done,
            thread: Some(thread),
        }
    }

    fn stop(mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Splits `TYPE{matchers}` into a profile type id and a label selector, by the same rules
/// as the server's render API (a legacy `app.cpu` becomes a `service_name` matcher).
fn split_query(query: &str) -> anyhow::Result<(String, String)> {
    use kiln_query::request::render_query;
    match render_query(query) {
        Ok((type_id, selector)) => Ok((type_id, selector.to_string())),
        // A malformed selector goes to the server as written, for it to say where the
        // problem is, under the type its name stands for.
        Err(err) => match query.trim().split_once('{') {
            Some((name, rest)) => {
                Ok((render_query(&format!("{name}{{}}"))?.0, format!("{{{rest}")))
            }
            None => Err(err.into()),
        },
    }
}

/// A time as `--from`/`--to` take it, in the API's milliseconds.
fn millis(value: &str) -> anyhow::Result<i64> {
    let nanos = kiln_query::request::parse_time("time", value, kiln_model::time::now_nanos())
        .map_err(|err| anyhow::anyhow!("invalid time {value:?}: {err}"))?;
    Ok(nanos.div_euclid(1_000_000))
}

impl Selection {
    fn merge_request(&self, max_nodes: i64) -> anyhow::Result<api::SelectMergeStacktracesRequest> {
        let (profile_type_id, label_selector) = split_query(&self.query)?;
        Ok(api::SelectMergeStacktracesRequest {
            profile_type_id,
            label_selector,
            start: millis(&self.from)?,
            end: millis(&self.to)?,
            max_nodes: (max_nodes != 0).then_some(max_nodes),
            ..Default::default()
        })
    }
}

/// A flame tree read from Pyroscope's tree bytes: every node as (path, self value).
struct Stacks {
    entries: Vec<(Vec<String>, i64)>,
}

impl Stacks {
    fn from_tree_bytes(bytes: &[u8]) -> anyhow::Result<Stacks> {
        let entries = kiln_query::merge::read_tree_bytes(bytes)
            .context("invalid tree in the response")?
            .into_iter()
            .filter(|(_, self_value)| *self_value > 0)
            .collect();
        Ok(Stacks { entries })
    }

    fn folded(&self) -> String {
        let mut out = String::new();
        for (path, value) in &self.entries {
            out.push_str(&path.join(";"));
            out.push(' ');
            out.push_str(&value.to_string());
            out.push('\n');
        }
        out
    }

    /// Per function: (self, total), total counting a function once per stack.
    fn functions(&self) -> HashMap<String, (i64, i64)> {
        let mut functions: HashMap<String, (i64, i64)> = HashMap::new();
        for (path, value) in &self.entries {
            if let Some(leaf) = path.last() {
                functions.entry(leaf.clone()).or_default().0 += value;
            }
            let mut seen: Vec<&String> = Vec::new();
            for frame in path {
                if !seen.contains(&frame) {
                    functions.entry(frame.clone()).or_default().1 += value;
                    seen.push(frame);
                }
            }
        }
        functions
    }

    fn total(&self) -> i64 {
        self.entries.iter().map(|(_, value)| value).sum()
    }
}

fn write_output(output: Option<&PathBuf>, bytes: &[u8]) -> anyhow::Result<()> {
    match output {
        Some(path) => {
            std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
        }
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(bytes)?;
            stdout.flush()?;
            Ok(())
        }
    }
}

/// A value in its profile's unit for a person: `1.23 s`, `45.6 MiB`, `12.3 k`.
fn human_value(value: i64, unit: &str) -> String {
    let magnitude = value.unsigned_abs() as f64;
    let sign = if value < 0 { "-" } else { "" };
    let scaled = |steps: &[(f64, &str)]| {
        let (divisor, suffix) = steps
            .iter()
            .rev()
            .find(|(divisor, _)| magnitude >= *divisor)
            .unwrap_or(&steps[0]);
        if *divisor == 1.0 {
            format!("{sign}{magnitude} {suffix}")
        } else {
            format!("{sign}{:.2} {suffix}", magnitude / divisor)
        }
    };
    match unit {
        "nanoseconds" => scaled(&[
            (1.0, "ns"),
            (1e3, "µs"),
            (1e6, "ms"),
            (1e9, "s"),
            (60e9, "min"),
            (3600e9, "h"),
        ]),
        "microseconds" => scaled(&[(1.0, "µs"), (1e3, "ms"), (1e6, "s"), (60e6, "min")]),
        "milliseconds" => scaled(&[(1.0, "ms"), (1e3, "s"), (60e3, "min"), (3600e3, "h")]),
        "seconds" => scaled(&[(1.0, "s"), (60.0, "min"), (3600.0, "h")]),
        "bytes" => scaled(&[
            (1.0, "B"),
            (1024.0, "KiB"),
            (1048576.0, "MiB"),
            (1073741824.0, "GiB"),
            (1099511627776.0, "TiB"),
        ]),
        _ => {
            let text = scaled(&[(1.0, ""), (1e3, "k"), (1e6, "M"), (1e9, "G")]);
            text.trim_end().to_string()
        }
    }
}

/// `kiln query diff --explain`: the server's ranked comparison as a table.
fn explain_diff(
    client: &Client,
    left: &Selection,
    right: &Selection,
    limit: usize,
) -> anyhow::Result<ExitCode> {
    let (profile_type, left_selector) = split_query(&left.query)?;
    let (right_type, right_selector) = split_query(&right.query)?;
    if right_type != profile_type {
        bail!("both sides must have one profile type: {profile_type} and {right_type}");
    }
    let side = |selector: String, selection: &Selection| -> anyhow::Result<serde_json::Value> {
        Ok(serde_json::json!({
            "selector": selector,
            "from": millis(&selection.from)?,
            "until": millis(&selection.to)?,
        }))
    };
    let answer = client.post_json(
        "/api/v1/compare",
        &serde_json::json!({
            "profile_type": profile_type,
            "left": side(left_selector, left)?,
            "right": side(right_selector, right)?,
            "limit": limit,
        }),
    )?;
    if answer["left"]["profiles"] == 0 && answer["right"]["profiles"] == 0 {
        return no_data(&format!("{} nor {}", left.describe(), right.describe()));
    }
    print_explained(&answer)?;
    Ok(ExitCode::SUCCESS)
}

/// Prints a comparison (a refusal is an answer too, said on standard error).
fn print_explained(answer: &serde_json::Value) -> anyhow::Result<()> {
    let mut out = String::new();
    for side in ["left", "right"] {
        out.push_str(&format!(
            "{side:<5}  {} profiles, total {}, {:.1} per second\n",
            answer[side]["profiles"],
            answer[side]["total"],
            answer[side]["rate"].as_f64().unwrap_or(0.0)
        ));
    }
    let method = &answer["method"];
    out.push_str(&format!(
        "{}, {} correction, alpha {}: {} of {} functions significant\n",
        method["test"].as_str().unwrap_or(""),
        method["correction"].as_str().unwrap_or(""),
        method["alpha"],
        answer["significant"],
        method["tested"]
    ));
    if let Some(reason) = answer["refused"].as_str() {
        eprintln!("kiln query: {reason}");
    }
    out.push_str(&format!(
        "{:>4}  {:>9}  {:>9}  {:>9}  {:>10}  {:<11}  function\n",
        "rank", "left", "right", "change", "confidence", "significant"
    ));
    let functions = answer["functions"].as_array().cloned().unwrap_or_default();
    for (rank, function) in functions.iter().enumerate() {
        let share = |key: &str| 100.0 * function[key].as_f64().unwrap_or(0.0);
        let confidence = function["confidence"]
            .as_f64()
            .map_or("-".to_string(), |c| format!("{:.4}%", 100.0 * c));
        out.push_str(&format!(
            "{:>4}  {:>8.2}%  {:>8.2}%  {:>+7.2}pt  {:>10}  {:<11}  {}\n",
            rank + 1,
            share("left_share"),
            share("right_share"),
            share("delta_share"),
            confidence,
            if function["significant"] == true {
                "yes"
            } else {
                "no"
            },
            function["name"].as_str().unwrap_or("")
        ));
    }
    write_output(None, out.as_bytes())
}

fn percent(part: i64, whole: i64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

fn tree_stacks(
    client: &Client,
    request: &api::SelectMergeStacktracesRequest,
) -> anyhow::Result<Stacks> {
    let mut request = request.clone();
    request.format = api::PROFILE_FORMAT_TREE;
    let response: api::SelectMergeStacktracesResponse =
        client.call("SelectMergeStacktraces", &request)?;
    Stacks::from_tree_bytes(&response.tree)
}

/// Says on standard error that nothing matched; the caller exits with [`NO_DATA`].
fn no_data(what: &str) -> anyhow::Result<ExitCode> {
    eprintln!("kiln query: no data for {what}");
    Ok(ExitCode::from(NO_DATA))
}

/// Writes the output; the exit status says whether there was any.
fn finish(output: Option<&PathBuf>, bytes: &[u8]) -> anyhow::Result<ExitCode> {
    write_output(output, bytes)?;
    Ok(ExitCode::SUCCESS)
}

pub fn run(args: QueryArgs) -> anyhow::Result<ExitCode> {
    let client = Client {
        url: args.server.url,
        tenant: args.server.tenant,
        authorization: args.server.auth.authorization()?,
        http: args.server.auth.blocking(Duration::from_secs(300))?,
    };
    match args.command {
        QueryCommand::Flamegraph {
            selection,
            format,
            max_nodes,
            output,
        } => {
            let request = selection.merge_request(max_nodes)?;
            match format {
                FlameFormat::Pprof => {
                    let merge = api::SelectMergeProfileRequest {
                        profile_type_id: request.profile_type_id,
                        label_selector: request.label_selector,
                        start: request.start,
                        end: request.end,
                        ..Default::default()
                    };
                    let body = client.call_raw("SelectMergeProfile", &merge)?;
                    let profile = kiln_model::pprof::decode(&body, usize::MAX)
                        .context("invalid pprof in the response")?;
                    if profile.sample.is_empty() {
                        return no_data(&selection.describe());
                    }
                    finish(output.as_ref(), &kiln_model::compress::gzip(&body))
                }
                FlameFormat::Json => {
                    let response: api::SelectMergeStacktracesResponse =
                        client.call("SelectMergeStacktraces", &request)?;
                    let empty = response
                        .flamegraph
                        .as_ref()
                        .is_none_or(|flamegraph| flamegraph.total == 0);
                    if empty {
                        return no_data(&selection.describe());
                    }
                    let mut text = serde_json::to_string_pretty(&response)?;
                    text.push('\n');
                    finish(output.as_ref(), text.as_bytes())
                }
                FlameFormat::Folded => {
                    let stacks = tree_stacks(&client, &request)?;
                    if stacks.entries.is_empty() {
                        return no_data(&selection.describe());
                    }
                    finish(output.as_ref(), stacks.folded().as_bytes())
                }
                FlameFormat::Svg => {
                    let stacks = tree_stacks(&client, &request)?;
                    if stacks.entries.is_empty() {
                        return no_data(&selection.describe());
                    }
                    let folded = stacks.folded();
                    let mut options = inferno::flamegraph::Options::default();
                    options.title = selection.query.clone();
                    options.count_name = request
                        .profile_type_id
                        .split(':')
                        .nth(2)
                        .unwrap_or("samples")
                        .to_string();
                    let mut svg = Vec::new();
                    inferno::flamegraph::from_lines(&mut options, folded.lines(), &mut svg)
                        .context("cannot draw the flame graph")?;
                    finish(output.as_ref(), &svg)
                }
            }
        }
        QueryCommand::Top {
            selection,
            limit,
            by_total,
            raw,
        } => {
            let request = selection.merge_request(-1)?;
            let stacks = tree_stacks(&client, &request)?;
            if stacks.entries.is_empty() {
                return no_data(&selection.describe());
            }
            let unit = request.profile_type_id.split(':').nth(2).unwrap_or("");
            let show = |value: i64| {
                if raw {
                    value.to_string()
                } else {
                    human_value(value, unit)
                }
            };
            let total = stacks.total();
            let mut functions: Vec<(String, (i64, i64))> = stacks.functions().into_iter().collect();
            functions.sort_by(|a, b| {
                let key =
                    |entry: &(String, (i64, i64))| if by_total { entry.1 .1 } else { entry.1 .0 };
                key(b).cmp(&key(a)).then(a.0.cmp(&b.0))
            });
            let mut out = String::new();
            out.push_str(&format!(
                "{:>16} {:>7} {:>16} {:>7}  function\n",
                "self", "self%", "total", "total%"
            ));
            for (name, (self_value, total_value)) in functions.into_iter().take(limit) {
                out.push_str(&format!(
                    "{:>16} {:>6.2}% {:>16} {:>6.2}%  {name}\n",
                    show(self_value),
                    percent(self_value, total),
                    show(total_value),
                    percent(total_value, total)
                ));
            }
            finish(None, out.as_bytes())
        }
        QueryCommand::Series {
            selection,
            step,
            group_by,
            format,
        } => {
            let merge = selection.merge_request(0)?;
            let request = api::SelectSeriesRequest {
                profile_type_id: merge.profile_type_id,
                label_selector: merge.label_selector,
                start: merge.start,
                end: merge.end,
                group_by,
                step,
                ..Default::default()
            };
            let response: api::SelectSeriesResponse = client.call("SelectSeries", &request)?;
            if response
                .series
                .iter()
                .all(|series| series.points.is_empty())
            {
                return no_data(&selection.describe());
            }
            let mut out = String::new();
            if matches!(format, SeriesFormat::Csv) {
                out.push_str("series,timestamp,value\n");
            }
            for series in &response.series {
                // Without group-by labels the one series is the whole selection: name it so.
                let name = if series.labels.is_empty() {
                    request.label_selector.clone()
                } else {
                    let labels: Vec<String> = series
                        .labels
                        .iter()
                        .map(|label| format!("{}={:?}", label.name, label.value))
                        .collect();
                    format!("{{{}}}", labels.join(","))
                };
                match format {
                    SeriesFormat::Text => out.push_str(&format!("{name}\n")),
                    SeriesFormat::Csv => {}
                }
                for point in &series.points {
                    let time = kiln_model::time::format_rfc3339(point.timestamp * 1_000_000);
                    match format {
                        SeriesFormat::Text => out.push_str(&format!("  {time}  {}\n", point.value)),
                        SeriesFormat::Csv => out.push_str(&format!(
                            "\"{}\",{time},{}\n",
                            name.replace('"', "\"\""),
                            point.value
                        )),
                    }
                }
            }
            finish(None, out.as_bytes())
        }
        QueryCommand::Diff {
            left,
            right_query,
            right_from,
            right_to,
            limit,
            explain,
        } => {
            let right = Selection {
                query: right_query.unwrap_or_else(|| left.query.clone()),
                from: right_from.unwrap_or_else(|| left.from.clone()),
                to: right_to.unwrap_or_else(|| left.to.clone()),
            };
            if explain {
                return explain_diff(&client, &left, &right, limit);
            }
            let left_stacks = tree_stacks(&client, &left.merge_request(-1)?)?;
            let right_stacks = tree_stacks(&client, &right.merge_request(-1)?)?;
            let (left_total, right_total) = (left_stacks.total(), right_stacks.total());
            if left_stacks.entries.is_empty() && right_stacks.entries.is_empty() {
                return no_data(&format!("{} nor {}", left.describe(), right.describe()));
            }
            let left_functions = left_stacks.functions();
            let right_functions = right_stacks.functions();
            let mut names: Vec<&String> = left_functions
                .keys()
                .chain(right_functions.keys())
                .collect();
            names.sort();
            names.dedup();
            // Change in share of the total, so two ranges of different length compare.
            let mut changes: Vec<(f64, &String, i64, i64)> = names
                .into_iter()
                .map(|name| {
                    let before = left_functions.get(name).map_or(0, |v| v.0);
                    let after = right_functions.get(name).map_or(0, |v| v.0);
                    (
                        percent(after, right_total) - percent(before, left_total),
                        name,
                        before,
                        after,
                    )
                })
                .filter(|(change, _, _, _)| *change != 0.0)
                .collect();
            changes.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
            let mut out = format!("left total {left_total}, right total {right_total}\n");
            let line = |(change, name, before, after): &(f64, &String, i64, i64)| {
                format!("{change:>+9.2}%  {before:>14} -> {after:<14}  {name}\n")
            };
            out.push_str("grew (self, share of total):\n");
            for change in changes.iter().filter(|c| c.0 > 0.0).take(limit) {
                out.push_str(&line(change));
            }
            out.push_str("shrank (self, share of total):\n");
            for change in changes.iter().rev().filter(|c| c.0 < 0.0).take(limit) {
                out.push_str(&line(change));
            }
            finish(None, out.as_bytes())
        }
        QueryCommand::Labels {
            name,
            query,
            from,
            to,
        } => {
            let what = format!(
                "{} {} between {from} and {to}",
                name.as_deref()
                    .map_or("label names".to_string(), |name| format!(
                        "values of label {name:?}"
                    )),
                query
                    .as_deref()
                    .map_or(String::new(), |query| format!("in {query}"))
            );
            let matchers: Vec<String> = query.into_iter().collect();
            let (start, end) = (millis(&from)?, millis(&to)?);
            let names = match name {
                Some(name) => {
                    let response: api::LabelValuesResponse = client.call(
                        "LabelValues",
                        &api::LabelValuesRequest {
                            name,
                            matchers,
                            start,
                            end,
                        },
                    )?;
                    response.names
                }
                None => {
                    let response: api::LabelNamesResponse = client.call(
                        "LabelNames",
                        &api::LabelNamesRequest {
                            matchers,
                            start,
                            end,
                        },
                    )?;
                    response.names
                }
            };
            if names.is_empty() {
                return no_data(&what);
            }
            let mut out = names.join("\n");
            out.push('\n');
            finish(None, out.as_bytes())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_split_into_type_and_selector() {
        let (type_id, selector) =
            split_query(r#"process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name="a"}"#)
                .unwrap();
        assert_eq!(type_id, "process_cpu:cpu:nanoseconds:cpu:nanoseconds");
        assert_eq!(selector, r#"{service_name="a"}"#);
        let (type_id, selector) = split_query(r#"myapp.alloc_objects{env="prod"}"#).unwrap();
        assert_eq!(type_id, "memory:alloc_objects:count:space:bytes");
        assert_eq!(selector, r#"{service_name="myapp", env="prod"}"#);
        let (_, selector) = split_query("myapp").unwrap();
        assert_eq!(selector, r#"{service_name="myapp"}"#);
        assert!(split_query(r#"{service_name="a"}"#).is_err());
    }

    #[test]
    fn values_print_in_human_units() {
        assert_eq!(human_value(1_234_000_000, "nanoseconds"), "1.23 s");
        assert_eq!(human_value(999, "nanoseconds"), "999 ns");
        assert_eq!(human_value(45_600_000, "nanoseconds"), "45.60 ms");
        assert_eq!(human_value(47_815_065, "bytes"), "45.60 MiB");
        assert_eq!(human_value(512, "bytes"), "512 B");
        assert_eq!(human_value(12_300, "count"), "12.30 k");
        assert_eq!(human_value(7, "count"), "7");
        assert_eq!(human_value(-2_000_000_000, "nanoseconds"), "-2.00 s");
    }

    #[test]
    fn tree_bytes_become_folded_stacks() {
        // virtual root → main (self 2) → work (self 300); main → idle (self 5)
        let mut bytes = vec![0, 0, 1];
        bytes.extend_from_slice(&[4, b'm', b'a', b'i', b'n', 2, 2]);
        bytes.extend_from_slice(&[4, b'w', b'o', b'r', b'k', 0xac, 0x02, 0]);
        bytes.extend_from_slice(&[4, b'i', b'd', b'l', b'e', 5, 0]);
        let stacks = Stacks::from_tree_bytes(&bytes).unwrap();
        assert_eq!(stacks.folded(), "main 2\nmain;work 300\nmain;idle 5\n");
        assert_eq!(stacks.total(), 307);
        let functions = stacks.functions();
        assert_eq!(functions["main"], (2, 307));
        assert_eq!(functions["work"], (300, 300));
        assert!(Stacks::from_tree_bytes(&[4, b'm']).is_err());
    }
}
