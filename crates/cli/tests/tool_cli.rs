//! `tessera tool …` as a user runs it against `tessera up`: the shared client's
//! output (tables, `-o json|yaml`), error text and exit codes (0 ok, 1 a run-time
//! failure such as 401 or an unreachable server, 2 bad input or a 4xx about the
//! request), pinned with insta snapshots of the real binary's output.

mod common;

use std::process::Command;

use common::{BIN, up};

/// Runs `tessera ARGS` against `url` with `key`: (exit code, stdout, stderr).
fn tessera(url: &str, key: &str, args: &[&str]) -> (i32, String, String) {
    let o = Command::new(BIN)
        .args(args)
        .env("TESSERA_URL", url)
        .env("TESSERA_API_KEY", key)
        .env("TESSERA_CONFIG", "/nonexistent/tessera-config.yaml")
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// "exit N" and the stream, as one snapshot.
fn shown(r: &(i32, String, String), stream: &str) -> String {
    let text = if stream == "stdout" { &r.1 } else { &r.2 };
    format!("exit {}\n{text}", r.0)
}

#[test]
fn tool_commands_share_the_clients_output_errors_and_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let server = up(&dir.path().join("data"));
    let key = server.key.clone().unwrap();
    let url = server.url.clone();
    let t = |args: &[&str]| tessera(&url, &key, args);
    let file = dir.path().join("lookup.yaml");
    std::fs::write(
        &file,
        "name: lookup\ndescription: Look a thing up\ntarget: {type: http, url: \"http://127.0.0.1:9/\"}\n",
    )
    .unwrap();

    let r = t(&["tool", "register", "-f", file.to_str().unwrap()]);
    insta::assert_snapshot!(shown(&r, "stdout"), @r"
    exit 0
    NAME                     TARGET   KIND       APPROVE  GRANTS
    lookup                   http     effect     no       -
    ");
    let r = t(&["tool", "grant", "lookup", "--role", "developer"]);
    insta::assert_snapshot!(shown(&r, "stdout"), @r#"
    exit 0
    [{"role":"developer"}]
    "#);
    let r = t(&["tool", "list"]);
    insta::assert_snapshot!(shown(&r, "stdout"), @r"
    exit 0
    NAME                     TARGET   KIND       APPROVE  GRANTS
    lookup                   http     effect     no       role=developer
    ");
    // The same objects for scripts, as JSON and (new with the shared client) YAML.
    let (code, out, _) = t(&["tool", "list", "-o", "json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["items"][0]["name"], "lookup");
    let (code, out, _) = t(&["tool", "get", "lookup", "-o", "yaml"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_norway::from_str(&out).unwrap();
    assert_eq!(v["grants"][0]["role"], "developer");
    let r = t(&["tool", "ledger"]);
    insta::assert_snapshot!(shown(&r, "stdout"), @r"
    exit 0
    ID                                 STATE        TOOL                 SESSION          CALL        TRY NOTE
    ");

    // Mistakes: a 4xx about the request is exit 2, with the server's words once.
    let r = t(&["tool", "get", "nope"]);
    insta::assert_snapshot!(shown(&r, "stderr"), @r#"
    exit 2
    error: tool "nope" not found (404 not_found)
    "#);
    let r = t(&[
        "tool",
        "call",
        "lookup",
        "--session",
        "s1",
        "--call-id",
        "c1",
    ]);
    insta::assert_snapshot!(shown(&r, "stderr"), @r#"
    exit 2
    error: session "s1" not found in this tenant: invoke a runtime to create it (404 not_found)
    "#);
    let r = t(&[
        "tool",
        "call",
        "lookup",
        "--session",
        "s1",
        "--call-id",
        "c1",
        "--args",
        "nope",
    ]);
    insta::assert_snapshot!(shown(&r, "stderr"), @r"
    exit 2
    error: --args: not valid JSON (expected ident at line 1 column 2): nope
    ");
    let r = t(&["tool", "grant", "lookup"]);
    insta::assert_snapshot!(shown(&r, "stderr"), @r"
    exit 2
    error: tool lookup: give --runtime, --role, or both
    ");
    // A wrong key is a run-time failure (exit 1), as for every client command.
    let bad = format!("tsk_{}_{}", "0".repeat(12), "0".repeat(64));
    let r = tessera(&url, &bad, &["tool", "list"]);
    insta::assert_snapshot!(shown(&r, "stderr"), @r"
    exit 1
    error: a valid API key is required: send `Authorization: Bearer tsk_…` (401 unauthenticated)
    ");
    // No server there: exit 1, and what to do.
    let (code, _, err) = tessera("http://127.0.0.1:9", &key, &["tool", "list"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("cannot reach http://127.0.0.1:9") && err.contains("TESSERA_URL"),
        "{err}"
    );
}

#[test]
fn secret_headers_show_as_the_mark_in_every_output() {
    const SECRET: &str = "sk-cli-SECRET-0123456789";
    let dir = tempfile::tempdir().unwrap();
    let server = up(&dir.path().join("data"));
    let key = server.key.clone().unwrap();
    let url = server.url.clone();
    let t = |args: &[&str]| tessera(&url, &key, args);
    let file = dir.path().join("pay.yaml");
    let spec = |key: &str, description: &str| {
        format!(
            "name: pay\ndescription: {description}\ntarget:\n  type: http\n  url: \"http://127.0.0.1:9/\"\n  headers:\n    X-Api-Key: {key}\n    X-Plain: visible\n"
        )
    };
    std::fs::write(&file, spec(&format!("{{secret: \"{SECRET}\"}}"), "pays")).unwrap();
    let f = file.to_str().unwrap();
    let r = t(&["tool", "register", "-f", f]);
    assert_eq!(r.0, 0, "{}", r.2);
    for args in [
        &["tool", "get", "pay", "-o", "json"][..],
        &["tool", "get", "pay", "-o", "yaml"],
        &["tool", "get", "pay"],
        &["tool", "list", "-o", "json"],
        &["tool", "list", "-o", "yaml"],
        &["tool", "list"],
    ] {
        let r = t(args);
        assert_eq!(r.0, 0, "{args:?}: {}", r.2);
        assert!(
            !r.1.contains("SECRET") && !r.2.contains("SECRET"),
            "{args:?} shows the secret: {r:?}"
        );
    }
    let r = t(&["tool", "get", "pay", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&r.1).unwrap();
    assert_eq!(v["target"]["headers"]["X-Api-Key"], "<secret>", "{v}");
    assert_eq!(v["target"]["headers"]["X-Plain"], "visible", "{v}");
    // Replaced with the mark sent back: accepted, the stored value kept.
    std::fs::write(&file, spec("\"<secret>\"", "pays, again")).unwrap();
    let r = t(&["tool", "register", "--replace", "-f", f, "-o", "json"]);
    assert_eq!(r.0, 0, "{}", r.2);
    assert!(!r.1.contains("SECRET"), "{}", r.1);
    // A secret too short to be scrubbed: bad input (2), naming the field.
    std::fs::write(&file, spec("{secret: \"abc\"}", "pays")).unwrap();
    let r = t(&["tool", "register", "--replace", "-f", f]);
    assert_eq!(r.0, 2, "{r:?}");
    assert!(r.2.contains("target.headers.X-Api-Key.secret"), "{}", r.2);
}
