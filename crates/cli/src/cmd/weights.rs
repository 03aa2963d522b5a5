//! `tessera weights`: model weights sealed at rest and released only into attested,
//! isolated tasks (docs/trust.md#model-weights). Parses, calls the API, renders.

use clap::Subcommand;
use serde_json::{Value, json};

use super::client::{
    Client, Failure, Out, cell, escape, finish, items, show, table, tokio_runtime,
};
use crate::output::EXIT_BAD_INPUT;

#[derive(Debug, Subcommand)]
pub enum WeightsCommand {
    /// Store a weights file: it streams to the control plane, which seals it on the
    /// way (AES-256-GCM, a fresh data key wrapped under its key-encryption key). Tasks
    /// name it in `weights:` and read it at /weights/NAME/FILE.
    Put {
        /// The weights' name (letters, digits, '.', '_', '-').
        name: String,
        /// The file to store.
        file: std::path::PathBuf,
        /// The file's name inside the task's folder (default: the file's own name).
        #[arg(long = "as")]
        file_name: Option<String>,
        /// Release only into tasks of this runtime class (repeat for several).
        #[arg(long = "class")]
        classes: Vec<String>,
        #[command(flatten)]
        out: Out,
    },
    /// List your tenant's weights and those granted to it.
    List {
        #[command(flatten)]
        out: Out,
    },
    /// Let another tenant's tasks use these weights (as OWNER/NAME) (admins).
    Grant {
        name: String,
        /// The tenant to grant them to.
        #[arg(long)]
        tenant: String,
        /// Take the grant back instead.
        #[arg(long)]
        revoke: bool,
        #[command(flatten)]
        out: Out,
    },
    /// Delete weights and their sealed file.
    Delete {
        name: String,
        #[command(flatten)]
        out: Out,
    },
}

fn weights_table(v: &Value) -> String {
    let rows = items(v)
        .iter()
        .map(|w| {
            let classes = w["classes"]
                .as_array()
                .filter(|a| !a.is_empty())
                .map(|a| a.iter().map(cell).collect::<Vec<_>>().join(","))
                .unwrap_or_else(|| "any".into());
            let grants = w["grants"]
                .as_array()
                .map(|a| a.iter().map(cell).collect::<Vec<_>>().join(","))
                .unwrap_or_default();
            vec![
                cell(&w["name"]),
                cell(&w["file"]),
                human(w["bytes"].as_u64().unwrap_or(0)),
                classes,
                grants,
                cell(&w["sha256"]),
            ]
        })
        .collect();
    table(
        &["NAME", "FILE", "SIZE", "CLASSES", "GRANTED TO", "SHA256"],
        rows,
    )
}

fn human(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = b as f64;
    let mut i = 0;
    while x >= 1024.0 && i < U.len() - 1 {
        x /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{x:.1} {}", U[i])
    }
}

pub fn run(c: WeightsCommand) -> i32 {
    finish((|| {
        let client = Client::from_env()?;
        tokio_runtime()?.block_on(async move {
            match c {
                WeightsCommand::Put {
                    name,
                    file,
                    file_name,
                    classes,
                    out,
                } => {
                    let f = tokio::fs::File::open(&file)
                        .await
                        .map_err(|e| Failure(EXIT_BAD_INPUT, format!("{}: {e}", file.display())))?;
                    let len = f.metadata().await.map(|m| m.len()).unwrap_or(0);
                    let inner = file_name.unwrap_or_else(|| {
                        file.file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_else(|| name.clone())
                    });
                    let mut path = format!("/v1/weights/{}?file={}", escape(&name), escape(&inner));
                    if !classes.is_empty() {
                        path.push_str(&format!("&class={}", escape(&classes.join(","))));
                    }
                    let v = client
                        .upload(reqwest::Method::PUT, &path, progress_body(f, len))
                        .await?;
                    eprintln!();
                    show(&v, out.format, weights_table)
                }
                WeightsCommand::List { out } => {
                    let v = client
                        .call(reqwest::Method::GET, "/v1/weights", None)
                        .await?;
                    show(&v, out.format, weights_table)
                }
                WeightsCommand::Grant {
                    name,
                    tenant,
                    revoke,
                    out,
                } => {
                    let body = json!({ "tenant": tenant, "revoke": revoke }).to_string();
                    let path = format!("/v1/weights/{}/grants", escape(&name));
                    let v = client
                        .call(
                            reqwest::Method::POST,
                            &path,
                            Some(("application/json", body.into_bytes())),
                        )
                        .await?;
                    show(&v, out.format, weights_table)
                }
                WeightsCommand::Delete { name, out } => {
                    let path = format!("/v1/weights/{}", escape(&name));
                    let v = client.call(reqwest::Method::DELETE, &path, None).await?;
                    show(&v, out.format, |v| {
                        format!("deleted {}\n", cell(&v["deleted"]))
                    })
                }
            }
        })
    })())
}

/// The file as a streamed body, with progress on stderr (about once a second).
fn progress_body(f: tokio::fs::File, len: u64) -> reqwest::Body {
    use futures_util::StreamExt;
    let start = std::time::Instant::now();
    let mut sent = 0u64;
    let mut last = std::time::Instant::now();
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let chunks = futures_util::stream::unfold(f, |mut f| async move {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0u8; 1 << 20];
        match f.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<_, std::io::Error>(buf), f))
            }
            Err(e) => Some((Err(e), f)),
        }
    });
    let s = chunks.map(move |chunk| {
        if let Ok(b) = &chunk {
            sent += b.len() as u64;
            let done = sent == len;
            if last.elapsed().as_secs_f64() >= 1.0 || done {
                last = std::time::Instant::now();
                let secs = start.elapsed().as_secs_f64().max(1e-3);
                let pct = (sent * 100).checked_div(len).unwrap_or(100);
                // On a terminal one line rewritten in place; elsewhere (a log, a pipe)
                // a line each time. Either way the last one ends its line, so what the
                // command prints next starts on a line of its own.
                let (lead, end) = if tty {
                    ("\r", if done { "\n" } else { "   " })
                } else {
                    ("", "\n")
                };
                eprint!(
                    "{lead}  sent {} of {} ({pct}%), {}/s{end}",
                    human(sent),
                    human(len),
                    human((sent as f64 / secs) as u64)
                );
            }
        }
        chunk
    });
    reqwest::Body::wrap_stream(s)
}
