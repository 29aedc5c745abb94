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

#[test]
fn a_duckdb_query_of_a_block_agrees_with_kiln() {
    let duckdb_available = Command::new("python3")
        .args(["-c", "import duckdb"])
        .status()
        .is_ok_and(|status| status.success());
    if !duckdb_available {
        println!("skipped: a_duckdb_query_of_a_block_agrees_with_kiln (pip install duckdb)");
        return;
    }
    let server = TestServer::start_with(eager_compaction);
    // Two profiles in two flushes, so that the block DuckDB reads is a compacted one.
    let profile = fixture("profefe-collector_cpu_1.prof");
    for from in [1_700_000_000, 1_700_000_060] {
        let (status, text) = server.post(
            &format!(
                "/ingest?name=api&format=pprof&from={from}&until={}",
                from + 10
            ),
            &profile,
        );
        assert_eq!(status, 200, "{text}");
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
    let output = Command::new("python3")
        .args([
            "-c",
            "import duckdb, sys\nfor name, value in duckdb.sql(sys.stdin.read()).fetchall(): print(f'{name}\\t{value}')",
        ])
        .stdin(std::fs::File::open({
            let file = server.data_dir().join("query.sql");
            std::fs::write(&file, &sql).unwrap();
            file
        })
        .unwrap())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "duckdb failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let from_duckdb: BTreeMap<String, i64> = String::from_utf8(output.stdout)
        .unwrap()
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
        "100000",
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
    assert_eq!(from_duckdb, from_kiln);
    // Both profiles are in the block: twice the single profile's total.
    assert_eq!(
        from_duckdb.values().sum::<i64>(),
        2 * pprof_total(&profile, 1)
    );
}
