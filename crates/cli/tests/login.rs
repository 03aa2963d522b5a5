//! `tessera login` saves the server and key in a private config file that every
//! client command reads; environment variables override it; `tessera logout`
//! forgets the key. Then users, service accounts, keys and tenants from the
//! command line, with `-o json` and `-o yaml`.

mod common;

use std::path::Path;
use std::process::Command;

use common::{BIN, run, up};

/// Runs `tessera` with only the config file (no TESSERA_URL/TESSERA_API_KEY).
fn tessera(config: &Path, stdin: Option<&str>, args: &[&str]) -> (i32, String, String) {
    let mut c = Command::new(BIN);
    c.args(args)
        .env_remove("TESSERA_URL")
        .env_remove("TESSERA_API_KEY")
        .env("TESSERA_CONFIG", config);
    run(c, stdin)
}

#[test]
fn login_saves_a_private_config_that_every_command_uses() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let server = up(&dir.path().join("data"));
    let admin = server.key.clone().unwrap();
    let cfg = dir.path().join("home/.config/tessera/config.yaml");

    // Before login: a clear message, exit 2.
    let (code, _, err) = tessera(&cfg, None, &["queue", "list"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("tessera login"), "{err}");

    // A wrong key is refused and nothing is saved.
    let bad = format!("tsk_{}_{}", "0".repeat(12), "0".repeat(64));
    let (code, _, err) = tessera(
        &cfg,
        Some(&bad),
        &["login", "--url", &server.url, "--key-stdin"],
    );
    assert_eq!(code, 1, "{err}");
    assert!(!cfg.exists());

    let (code, _, err) = tessera(
        &cfg,
        Some(&format!("{admin}\n")),
        &["login", "--url", &server.url, "--key-stdin"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("as admin (tenant admin, role admin)"), "{err}");
    let mode = std::fs::metadata(&cfg).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(std::fs::read_to_string(&cfg).unwrap().contains(&admin));

    // Every client command now works from the file.
    let (code, out, err) = tessera(&cfg, None, &["queue", "create", "default", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["name"], "default");
    let (code, out, _) = tessera(&cfg, None, &["queue", "list", "-o", "yaml"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_norway::from_str(&out).unwrap();
    assert_eq!(v["items"][0]["name"], "default");

    // Users, service accounts and keys.
    let (code, out, err) = tessera(
        &cfg,
        None,
        &[
            "user",
            "create",
            "alice",
            "--role",
            "developer",
            "-o",
            "json",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["role"],
        "developer"
    );
    let (code, _, err) = tessera(&cfg, None, &["sa", "create", "ci", "--role", "viewer"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = tessera(&cfg, None, &["apikey", "create", "sa:ci"]);
    assert_eq!(code, 0, "{err}");
    let ci_key = out
        .lines()
        .find_map(|l| l.strip_prefix("KEY (shown only now): "))
        .unwrap_or_else(|| panic!("{out}"))
        .to_string();
    let (code, out, _) = tessera(&cfg, None, &["user", "list"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("NAME") && out.contains("alice") && out.contains("developer"),
        "{out}"
    );
    let (code, out, _) = tessera(&cfg, None, &["serviceaccount", "get", "ci", "-o", "json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["subject"].as_str(), v["keys"].as_array().unwrap().len()),
        (Some("sa:ci"), 1)
    );

    // The environment beats the file: the service account's key reads, but may
    // not create queues.
    let o = Command::new(BIN)
        .args(["queue", "create", "other"])
        .env("TESSERA_CONFIG", &cfg)
        .env("TESSERA_API_KEY", &ci_key)
        .env_remove("TESSERA_URL")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("403"), "{o:?}");

    // Deleting the service account revokes its key.
    let (code, _, err) = tessera(&cfg, None, &["sa", "delete", "ci"]);
    assert_eq!(code, 0, "{err}");
    let o = Command::new(BIN)
        .args(["queue", "list"])
        .env("TESSERA_CONFIG", &cfg)
        .env("TESSERA_API_KEY", &ci_key)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("401"), "{o:?}");

    // Tenants: the system admin makes one and gets its first admin key once;
    // that key sees only its own tenant and may not make another.
    let (code, out, err) = tessera(&cfg, None, &["tenant", "create", "beta"]);
    assert_eq!(code, 0, "{err}");
    let beta_key = out
        .lines()
        .find_map(|l| l.strip_prefix("ADMIN KEY of beta (shown only now): "))
        .unwrap_or_else(|| panic!("{out}"))
        .to_string();
    let (code, out, _) = tessera(&cfg, None, &["tenant", "list"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("beta") && out.contains("admin") && out.contains("system"),
        "{out}"
    );
    let beta = |args: &[&str]| {
        Command::new(BIN)
            .args(args)
            .env("TESSERA_CONFIG", &cfg)
            .env("TESSERA_API_KEY", &beta_key)
            .output()
            .unwrap()
    };
    let o = beta(&["tenant", "list", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<_> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].clone())
        .collect();
    assert_eq!(names, vec!["beta"], "{o:?}");
    let o = beta(&["tenant", "create", "gamma"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("403"), "{o:?}");
    let o = beta(&["tenant", "get", "admin"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("404"), "{o:?}");

    // Logout forgets the key, keeps the URL.
    let (code, _, _) = tessera(&cfg, None, &["logout"]);
    assert_eq!(code, 0);
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(
        !text.contains(&admin) && text.contains(&server.url),
        "{text}"
    );
    let (code, _, err) = tessera(&cfg, None, &["queue", "list"]);
    assert_eq!(code, 2, "{err}");
}
