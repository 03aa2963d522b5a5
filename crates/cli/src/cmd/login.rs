//! `tessera login` and `tessera logout`: save (or forget) the server URL and API
//! key in the config file that every client command reads (see
//! [`super::config`]). The key is checked against the server before it is saved.

use clap::Args;
use serde_json::Value;

use super::client::{Client, Failure, finish, tokio_runtime};
use super::config::{self, FileConfig, ProcessEnv};
use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE};

#[derive(Debug, Args)]
pub struct LoginArgs {
    /// The server (default: $TESSERA_URL, the saved one, or http://127.0.0.1:7700).
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// Read the API key from standard input (one line) instead of
    /// $TESSERA_API_KEY. Keys are not taken as arguments: those end up in the
    /// shell history and the process list.
    #[arg(long)]
    pub key_stdin: bool,
}

/// `tessera login`: checks the key with `GET /v1/whoami` and saves URL and key.
pub fn login(a: LoginArgs) -> i32 {
    finish((|| {
        let env = ProcessEnv;
        let path = config::path(&env);
        let saved = config::read(&path).map_err(|e| Failure(EXIT_BAD_INPUT, e))?;
        let url = a
            .url
            .or_else(|| std::env::var("TESSERA_URL").ok().filter(|u| !u.is_empty()))
            .or(saved.url)
            .unwrap_or_else(|| config::DEFAULT_URL.to_string());
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(Failure(
                EXIT_BAD_INPUT,
                format!("--url {url:?}: give an http:// or https:// URL"),
            ));
        }
        let key = if a.key_stdin {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .map_err(|e| Failure(EXIT_BAD_INPUT, format!("reading the key from stdin: {e}")))?;
            line.trim().to_string()
        } else {
            std::env::var("TESSERA_API_KEY").unwrap_or_default()
        };
        if key.is_empty() {
            return Err(Failure(
                EXIT_BAD_INPUT,
                "no key: pipe it in with --key-stdin (e.g. `echo \"$KEY\" | tessera login --key-stdin`) or export TESSERA_API_KEY".into(),
            ));
        }
        let client = Client::new(&url, &key);
        let me: Value =
            tokio_runtime()?.block_on(client.call(reqwest::Method::GET, "/v1/whoami", None))?;
        config::write(
            &path,
            &FileConfig {
                url: Some(client.url.clone()),
                api_key: Some(key),
            },
        )
        .map_err(|e| Failure(EXIT_FAILURE, e))?;
        eprintln!(
            "Logged in to {} as {} (tenant {}, role {}); saved to {}",
            client.url,
            me["subject"].as_str().unwrap_or("?"),
            me["tenant"].as_str().unwrap_or("?"),
            me["role"].as_str().unwrap_or("?"),
            path.display()
        );
        Ok(0)
    })())
}

/// `tessera logout`: forgets the saved key (keeps the URL).
pub fn logout() -> i32 {
    finish((|| {
        let path = config::path(&ProcessEnv);
        let mut saved = config::read(&path).map_err(|e| Failure(EXIT_BAD_INPUT, e))?;
        if saved.api_key.take().is_none() {
            eprintln!("No key saved in {}", path.display());
            return Ok(0);
        }
        config::write(&path, &saved).map_err(|e| Failure(EXIT_FAILURE, e))?;
        eprintln!("Removed the key from {}", path.display());
        Ok(0)
    })())
}
