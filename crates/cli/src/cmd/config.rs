//! Where client commands find the server and the key: `tessera login` saves them
//! in a config file; environment variables override it.
//!
//! Order, first wins: `TESSERA_URL` / `TESSERA_API_KEY`, then the config file
//! (`$TESSERA_CONFIG`, else `$XDG_CONFIG_HOME/tessera/config.yaml`, else
//! `~/.config/tessera/config.yaml`), then the default URL `http://127.0.0.1:7700`.
//! The file holds a secret: it is written with mode 0600 in a 0700 folder.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The default server URL.
pub const DEFAULT_URL: &str = "http://127.0.0.1:7700";

/// The config file's contents.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
}

/// Where a setting came from, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Env(&'static str),
    File(PathBuf),
    Default,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Env(v) => write!(f, "${v}"),
            Source::File(p) => write!(f, "{}", p.display()),
            Source::Default => f.write_str("the default"),
        }
    }
}

/// The settings a client command uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub url: String,
    pub url_from: Source,
    pub key: Option<String>,
    pub key_from: Option<Source>,
}

/// The environment a resolution reads (a function so tests need not touch the
/// process environment).
pub trait Env {
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
#[derive(Debug, Clone, Copy)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
}

/// The config file's path.
pub fn path(env: &dyn Env) -> PathBuf {
    if let Some(p) = env.var("TESSERA_CONFIG") {
        return PathBuf::from(p);
    }
    if let Some(x) = env.var("XDG_CONFIG_HOME") {
        return PathBuf::from(x).join("tessera/config.yaml");
    }
    match env.var("HOME") {
        Some(h) => PathBuf::from(h).join(".config/tessera/config.yaml"),
        None => PathBuf::from(".tessera/config.yaml"),
    }
}

/// Reads the config file; a missing file is an empty config, a malformed one an
/// error naming the file and the field.
pub fn read(path: &Path) -> Result<FileConfig, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(FileConfig::default()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    if text.trim().is_empty() {
        return Ok(FileConfig::default());
    }
    serde_path_to_error::deserialize(serde_norway::Deserializer::from_str(&text)).map_err(|e| {
        format!(
            "{}: at {}: {}; fix or delete the file, or run `tessera login` again",
            path.display(),
            e.path(),
            e.inner()
        )
    })
}

/// Writes the config file, readable by its owner only.
pub fn write(path: &Path, cfg: &FileConfig) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    }
    let text = serde_norway::to_string(cfg).map_err(|e| e.to_string())?;
    // Written beside the file and renamed over it: never half a file, and never
    // a moment with the key in a file others can read.
    let tmp = path.with_extension("yaml.tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// Resolves the settings: environment first, then the file, then the default.
pub fn resolve(env: &dyn Env) -> Result<Settings, String> {
    let file_path = path(env);
    let file = read(&file_path)?;
    let (url, url_from) = match (env.var("TESSERA_URL"), file.url) {
        (Some(u), _) => (u, Source::Env("TESSERA_URL")),
        (None, Some(u)) => (u, Source::File(file_path.clone())),
        (None, None) => (DEFAULT_URL.to_string(), Source::Default),
    };
    let (key, key_from) = match (env.var("TESSERA_API_KEY"), file.api_key) {
        (Some(k), _) => (Some(k), Some(Source::Env("TESSERA_API_KEY"))),
        (None, Some(k)) => (Some(k), Some(Source::File(file_path))),
        (None, None) => (None, None),
    };
    Ok(Settings {
        url: url.trim_end_matches('/').to_string(),
        url_from,
        key,
        key_from,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    struct Fake(HashMap<&'static str, String>);
    impl Env for Fake {
        fn var(&self, name: &str) -> Option<String> {
            self.0.get(name).cloned()
        }
    }

    #[test]
    fn environment_beats_file_beats_default() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sub/config.yaml");
        let mut env = Fake(HashMap::from([(
            "TESSERA_CONFIG",
            file.display().to_string(),
        )]));
        let s = resolve(&env).unwrap();
        assert_eq!(
            (s.url.as_str(), s.url_from, s.key),
            (DEFAULT_URL, Source::Default, None)
        );
        write(
            &file,
            &FileConfig {
                url: Some("http://file:1/".into()),
                api_key: Some("tsk_file".into()),
            },
        )
        .unwrap();
        let s = resolve(&env).unwrap();
        assert_eq!(s.url, "http://file:1");
        assert_eq!(s.key.as_deref(), Some("tsk_file"));
        assert_eq!(s.key_from, Some(Source::File(file.clone())));
        env.0.insert("TESSERA_API_KEY", "tsk_env".into());
        let s = resolve(&env).unwrap();
        assert_eq!(
            (s.url.as_str(), s.key.as_deref()),
            ("http://file:1", Some("tsk_env"))
        );
        env.0.insert("TESSERA_URL", "http://env:2".into());
        assert_eq!(resolve(&env).unwrap().url, "http://env:2");
    }

    #[test]
    fn the_file_is_private_and_bad_files_are_named() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tessera/config.yaml");
        // An existing, world-readable file becomes private when rewritten.
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "url: http://x\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        write(
            &file,
            &FileConfig {
                url: None,
                api_key: Some("tsk_secret".into()),
            },
        )
        .unwrap();
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dmode = std::fs::metadata(file.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dmode, 0o700);
        std::fs::write(&file, "url: http://x\ncolour: red\n").unwrap();
        let e = read(&file).unwrap_err();
        assert!(e.contains("config.yaml") && e.contains("colour"), "{e}");
        // The default location follows XDG, then HOME.
        let env = Fake(HashMap::from([("HOME", "/home/u".to_string())]));
        assert_eq!(
            path(&env),
            PathBuf::from("/home/u/.config/tessera/config.yaml")
        );
        let env = Fake(HashMap::from([
            ("HOME", "/home/u".to_string()),
            ("XDG_CONFIG_HOME", "/x".to_string()),
        ]));
        assert_eq!(path(&env), PathBuf::from("/x/tessera/config.yaml"));
    }
}
