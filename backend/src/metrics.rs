//! `vhost-user-rdma counters PATH`: reads a daemon's counters socket and prints its document,
//! as JSON (what the socket gives) or as OpenMetrics text (Prometheus' exposition format) for a
//! node exporter's textfile collector or a scrape proxy. The metrics are the JSON's numbers,
//! named by their path in the document: `"transport":{"tx_packets":5}` becomes
//! `vhost_user_rdma_transport_tx_packets{device="PATH"} 5`; array elements get an `index`
//! label. One schema, the counters socket's; docs/daemon.md, "Counters", lists its keys.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use serde_json::Value;

/// Print a daemon's counters (read from its --counters-socket).
#[derive(Parser, Debug)]
#[command(name = "vhost-user-rdma counters")]
pub struct CountersArgs {
    /// The daemon's --counters-socket.
    pub path: PathBuf,
    /// OpenMetrics text (Prometheus' exposition format) instead of the JSON document.
    #[arg(long)]
    pub openmetrics: bool,
}

/// Reads the document at `path` (the daemon writes it and closes the connection).
pub fn read(path: &std::path::Path) -> std::io::Result<String> {
    let mut s = UnixStream::connect(path)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut doc = String::new();
    s.read_to_string(&mut doc)?;
    Ok(doc)
}

/// The counters document `json` as OpenMetrics text, every sample labelled `device`.
pub fn openmetrics(json: &str, device: &str) -> Result<String, String> {
    let v: Value =
        serde_json::from_str(json).map_err(|e| format!("not a counters document: {e}"))?;
    let mut samples = Vec::new();
    flatten(&v, "vhost_user_rdma", &mut Vec::new(), &mut samples);
    let device = escape(device);
    let mut out = String::new();
    let mut last = String::new();
    for (name, labels, value) in samples {
        if name != last {
            out.push_str(&format!("# TYPE {name} unknown\n"));
            last.clone_from(&name);
        }
        let mut l = format!("device=\"{device}\"");
        for (k, v) in labels {
            l.push_str(&format!(",{k}=\"{v}\""));
        }
        out.push_str(&format!("{name}{{{l}}} {value}\n"));
    }
    out.push_str("# EOF\n");
    Ok(out)
}

type Sample = (String, Vec<(&'static str, usize)>, String);

fn flatten(v: &Value, name: &str, labels: &mut Vec<(&'static str, usize)>, out: &mut Vec<Sample>) {
    match v {
        Value::Number(n) => out.push((name.to_string(), labels.clone(), n.to_string())),
        Value::Bool(b) => out.push((name.to_string(), labels.clone(), u8::from(*b).to_string())),
        Value::Object(m) => {
            for (k, v) in m {
                flatten(v, &format!("{name}_{}", metric_part(k)), labels, out);
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                labels.push(("index", i));
                flatten(v, name, labels, out);
                labels.pop();
            }
        }
        // Strings and nulls are not measurements.
        Value::String(_) | Value::Null => {}
    }
}

/// A key as a metric name's part: letters, digits and `_`.
fn metric_part(k: &str) -> String {
    k.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `vhost-user-rdma counters ...`.
pub fn main_with_args<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let a = match CountersArgs::try_parse_from(args) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let doc = match read(&a.path) {
        Ok(d) => d,
        Err(e) => {
            eprintln!(
                "vhost-user-rdma counters: {}: {e} (is it a daemon's --counters-socket?)",
                a.path.display()
            );
            return ExitCode::FAILURE;
        }
    };
    if !a.openmetrics {
        print!("{doc}");
        return ExitCode::SUCCESS;
    }
    match openmetrics(&doc, &a.path.display().to_string()) {
        Ok(t) => {
            print!("{t}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vhost-user-rdma counters: {}: {e}", a.path.display());
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_becomes_samples_named_by_their_path() {
        let doc = r#"{"connections":1,"busy":true,"transport":{"tx_packets":5,"rx_bytes":123},
            "shards":[{"qps":2},{"qps":3}],"name":"x","none":null}"#;
        let t = openmetrics(doc, "/run/a \"b\".sock").unwrap();
        let want = "\
# TYPE vhost_user_rdma_busy unknown
vhost_user_rdma_busy{device=\"/run/a \\\"b\\\".sock\"} 1
# TYPE vhost_user_rdma_connections unknown
vhost_user_rdma_connections{device=\"/run/a \\\"b\\\".sock\"} 1
# TYPE vhost_user_rdma_shards_qps unknown
vhost_user_rdma_shards_qps{device=\"/run/a \\\"b\\\".sock\",index=\"0\"} 2
vhost_user_rdma_shards_qps{device=\"/run/a \\\"b\\\".sock\",index=\"1\"} 3
# TYPE vhost_user_rdma_transport_rx_bytes unknown
vhost_user_rdma_transport_rx_bytes{device=\"/run/a \\\"b\\\".sock\"} 123
# TYPE vhost_user_rdma_transport_tx_packets unknown
vhost_user_rdma_transport_tx_packets{device=\"/run/a \\\"b\\\".sock\"} 5
# EOF
";
        assert_eq!(t, want);
        assert!(openmetrics("{", "d").is_err());
    }
}
