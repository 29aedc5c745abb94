//! A block is readable by standard tools: the DuckDB query in docs/FORMAT.md, run on a
//! compacted block, gives the same self value per function as `kiln query top`.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// The SQL under the `duckdb-self-by-function` marker of docs/FORMAT.md.
fn documented_query() -> String {
    let format = std::fs::read_to_string(workspace_root().join("docs/FORMAT.md")).unwrap();
    let start = format
        .find("<!-- duckdb-self-by-function -->")
        .expect("marker in FORMAT.md");
    let rest = &format[start..];
    let sql_start = rest.find("```sql\n").expect("sql block") + "```sql\n".len();
    let sql_end = rest[sql_start..].find("```").expect("end of sql block");
    rest[sql_start..sql_start + sql_end].to_string()
}

fn duckdb_available() -> bool {
    let available = Command::new("python3")
        .args(["-c", "import duckdb"])
        .status()
        .is_ok_and(|status| status.success());
    if !available {
        println!("skipped: DuckDB is not installed (pip install duckdb)");
    }
    available
}

/// Runs `sql` in DuckDB; its rows as tab-separated text.
fn duckdb(server: &TestServer, sql: &str) -> String {
    let file = server.data_dir().join("query.sql");
    std::fs::write(&file, sql).unwrap();
    let output = Command::new("python3")
        .args([
            "-c",
            "import duckdb, sys\nfor row in duckdb.sql(sys.stdin.read()).fetchall(): print('\\t'.join(map(str, row)))",
        ])
        .stdin(std::fs::File::open(&file).unwrap())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "duckdb failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Ingests `profiles` (pprof) as service `api`, a minute apart in separate flushes, waits
/// for them to be one compacted block, and checks the documented query's self value per
/// function against `kiln query top`; returns that block's Parquet rows (records).
fn documented_query_agrees_with_kiln(profiles: &[Vec<u8>]) -> usize {
    let server = TestServer::start_with(eager_compaction);
    let mut sent = 0;
    for (index, profile) in profiles.iter().enumerate() {
        let from = 1_700_000_000 + 60 * index as i64;
        let (status, text) = server.post(
            &format!(
                "/ingest?name=api&format=pprof&from={from}&until={}",
                from + 10
            ),
            profile,
        );
        assert_eq!(status, 200, "{text}");
        sent += pprof_total(profile, 1);
        std::thread::sleep(Duration::from_millis(120));
    }
    let (runtime, metastore) = server.open_metastore();
    let deadline = Instant::now() + Duration::from_secs(60);
    let block = loop {
        let blocks = runtime.block_on(metastore.list_blocks()).unwrap();
        let live: Vec<_> = blocks
            .iter()
            .filter(|block| block.deleted_at_ms.is_none())
            .collect();
        // At the top level, where a lone block rests (below it, it moves on).
        let top = kiln_node::ServerConfig::default().compaction.levels.len() as u32;
        if live.len() == 1 && live[0].level == top {
            break live[0].clone();
        }
        assert!(Instant::now() < deadline, "no compacted block: {blocks:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let path = server.data_dir().join("blocks").join(&block.object_key);
    let sql = documented_query();
    let placeholder = "blocks/01JC3Z8X4N6V0Q2R7T9W1Y5B3D.parquet";
    assert!(sql.contains(placeholder), "{sql}");
    let sql = sql.replace(placeholder, &path.to_string_lossy());
    let from_duckdb: BTreeMap<String, i64> = duckdb(&server, &sql)
        .lines()
        .map(|line| {
            let (name, value) = line.rsplit_once('\t').unwrap();
            (name.to_string(), value.parse().unwrap())
        })
        .collect();

    let top = run_kiln([
        "query",
        "--url",
        server.url.as_str(),
        "top",
        "--raw",
        "--query",
        &format!(r#"{CPU}{{service_name="api"}}"#),
        "--from",
        "1699999000",
        "--to",
        "1700001000",
        "--limit",
        "1000000",
    ]);
    let from_kiln: BTreeMap<String, i64> = top
        .lines()
        .skip(1)
        .filter_map(|line| {
            // self, self%, total, total%, then the function name.
            let fields: Vec<&str> = line.split_whitespace().collect();
            let self_value: i64 = fields.first()?.parse().ok()?;
            let name = fields.get(4..)?.join(" ");
            (self_value != 0).then_some((name, self_value))
        })
        .collect();
    assert!(from_kiln.len() > 10, "{top}");
    assert_eq!(from_duckdb.len(), from_kiln.len());
    assert_eq!(from_duckdb, from_kiln);
    // Every profile is in the block, once.
    assert_eq!(from_duckdb.values().sum::<i64>(), sent);
    let path = path.to_string_lossy();
    duckdb(
        &server,
        &format!("SELECT count(*) FROM read_parquet('{path}')"),
    )
    .trim()
    .parse()
    .unwrap()
}

#[test]
fn a_duckdb_query_of_a_block_agrees_with_kiln() {
    if !duckdb_available() {
        return;
    }
    let profile = fixture("profefe-collector_cpu_1.prof");
    // Two profiles in two flushes, so that the block DuckDB reads is a compacted one.
    let records = documented_query_agrees_with_kiln(&[profile.clone(), profile]);
    assert_eq!(records, 1);
}

/// A dataset whose tables are longer than a record's 65,536 rows is several Parquet rows,
/// and the documented query joins their lists back into its tables.
#[test]
fn a_duckdb_query_of_a_dataset_over_several_records_agrees_with_kiln() {
    if !duckdb_available() {
        return;
    }
    // Five profiles of 14,000 stacks each, every one distinct: 70,000 samples, 140,001
    // stack nodes and 70,001 functions in the merged dataset.
    let profiles: Vec<Vec<u8>> = (0..5)
        .map(|profile| {
            // As Go's: sample counts, then CPU time (the type the query reads).
            let mut builder = kiln_model::build::ProfileBuilder::new(
                &[("samples", "count"), ("cpu", "nanoseconds")],
                Some(("cpu", "nanoseconds")),
                10_000_000,
            );
            for sample in 0..14_000 {
                let name = format!("f{profile}_{sample}");
                fn frame(function: &str) -> kiln_model::build::Frame<'_> {
                    kiln_model::build::Frame {
                        function,
                        file: "main.c",
                        line: 1,
                        module: "",
                        address: 0,
                    }
                }
                let stack = [
                    builder.location(&frame(&name)),
                    builder.location(&frame("main")),
                ];
                let count = 1 + sample % 7;
                builder.add(&stack, &[count, 10_000_000 * count], &[]);
            }
            prost::Message::encode_to_vec(&builder.finish(1_700_000_000_000_000_000, 10))
        })
        .collect();
    let records = documented_query_agrees_with_kiln(&profiles);
    assert!(records >= 2, "{records} records");
}
