//! `docs/otlp.md` carries the complete OTel mapping table, generated from the metric catalogue.
//! This test fails when the two drift apart; `GPUMON_BLESS=1 cargo test -p gpumon-sinks
//! --features otlp --test otlp_docs` rewrites the table.
#![cfg(feature = "otlp")]

const BEGIN: &str = "<!-- BEGIN GENERATED: otlp mapping (gpumon_sinks::otlp::mapping_markdown) -->\n";
const END: &str = "<!-- END GENERATED: otlp mapping -->";

#[test]
fn docs_mapping_table_matches_the_catalogue() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/otlp.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let start = doc.find(BEGIN).expect("docs/otlp.md lacks the BEGIN GENERATED marker") + BEGIN.len();
    let end = doc[start..].find(END).expect("docs/otlp.md lacks the END GENERATED marker") + start;
    let table = gpumon_sinks::otlp::mapping_markdown();
    if doc[start..end] != table {
        if std::env::var("GPUMON_BLESS").is_ok_and(|v| v == "1") {
            let updated = format!("{}{table}{}", &doc[..start], &doc[end..]);
            std::fs::write(&path, updated).unwrap();
            eprintln!("rewrote the mapping table in {}", path.display());
        } else {
            panic!(
                "the mapping table in docs/otlp.md is out of date with the metric catalogue; rerun with GPUMON_BLESS=1 \
                 to regenerate it.\n--- expected ---\n{table}"
            );
        }
    }
}
