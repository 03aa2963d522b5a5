//! Downloaders (what they write, and whether they print what they fetched), network
//! tools that can join a program to a connection (`nc -e`, `socat EXEC:`), `telnet`.

use super::Cmd;
use crate::analyze::names::url_basename;
use crate::analyze::{Analyzer, Out, Stage};
use crate::paths::normalize;
use crate::types::FileOp;

impl Analyzer<'_> {
    /// `openssl s_client`: a live connection.
    pub(super) fn openssl_client(&mut self, stage: &mut Stage) -> bool {
        stage.network = true;
        stage.out = Some(Out::Network);
        false
    }

    pub(super) fn netcat(&mut self, c: &Cmd<'_>, stage: &mut Stage) -> bool {
        let (name, args, span) = (c.name, c.args, c.span);
        stage.network = true;
        stage.out = Some(Out::Network);
        let exec = args.iter().any(|a| {
            let t = a.text.as_str();
            t == "-e"
                || t == "-c"
                || t.starts_with("--exec")
                || t.starts_with("--sh-exec")
                || t.starts_with("--lua-exec")
                || (t.starts_with('-')
                    && !t.starts_with("--")
                    && t.len() > 2
                    && (t.ends_with('e') || t.ends_with('c'))
                    && t[1..].bytes().all(|b| b.is_ascii_alphabetic()))
        });
        if exec {
            self.emit(
                "cmd.reverse_shell",
                span,
                format!("`{name}` hands a program's input and output to a network peer (-e / -c)"),
            );
        }
        true
    }

    pub(super) fn socat(&mut self, c: &Cmd<'_>, stage: &mut Stage) -> bool {
        let (args, span) = (c.args, c.span);
        stage.network = true;
        stage.out = Some(Out::Network);
        let low: Vec<String> = args.iter().map(|a| a.text.to_ascii_lowercase()).collect();
        let exec = low
            .iter()
            .any(|t| t.starts_with("exec:") || t.starts_with("system:") || t.contains(",exec:"));
        let net = low.iter().any(|t| {
            t.contains("tcp") || t.contains("udp") || t.contains("ssl") || t.contains("sctp")
        });
        if exec && net {
            self.emit(
                "cmd.reverse_shell",
                span,
                "socat joins a program to a network connection".into(),
            );
        }
        true
    }

    pub(super) fn telnet(&mut self, stage: &mut Stage) -> bool {
        stage.network = true;
        stage.out = Some(Out::Network);
        false
    }

    /// A downloader: records what it writes (so running it later is caught) and says
    /// whether its output is the fetched content.
    pub(super) fn download(&mut self, c: &Cmd<'_>) -> Out {
        let (name, args, span) = (c.name, c.args, c.span);
        let mut to_stdout = true;
        let urls: Vec<String> = args
            .iter()
            .filter(|a| a.text.contains("://"))
            .map(|a| a.text.clone())
            .collect();
        let mut i = 0;
        while i < args.len() {
            let t = args[i].text.as_str();
            let next = args.get(i + 1).map(|a| a.text.clone());
            let file_value = |opt: &str| -> Option<String> {
                if t == opt {
                    next.clone()
                } else {
                    t.strip_prefix(opt)
                        .filter(|v| !v.is_empty() && opt.len() == 2)
                        .map(str::to_string)
                }
            };
            match name {
                "curl" => {
                    if let Some(v) = file_value("-o")
                        .or_else(|| (t == "--output").then(|| next.clone()).flatten())
                    {
                        if v != "-" {
                            to_stdout = false;
                            self.downloaded.push(normalize(&self.resolve(&v)));
                            self.file_op(FileOp::Write, &v, false, span);
                        }
                    } else if t == "-O"
                        || t == "--remote-name"
                        || (t.starts_with('-') && !t.starts_with("--") && t.contains('O'))
                    {
                        to_stdout = false;
                        for u in &urls {
                            if let Some(b) = url_basename(u) {
                                self.downloaded.push(normalize(&self.resolve(&b)));
                            }
                        }
                    } else if matches!(
                        t,
                        "-d" | "--data"
                            | "--data-binary"
                            | "--data-raw"
                            | "--data-urlencode"
                            | "-F"
                            | "--form"
                            | "-T"
                            | "--upload-file"
                    ) {
                        if let Some(v) = next.clone() {
                            let p = v
                                .rsplit_once('@')
                                .map(|(_, p)| p.to_string())
                                .or_else(|| v.rsplit_once('<').map(|(_, p)| p.to_string()))
                                .unwrap_or(v.clone());
                            if t == "-T"
                                || t == "--upload-file"
                                || v.contains('@')
                                || v.contains('<')
                            {
                                self.file_op(FileOp::Read, &p, false, span);
                            }
                        }
                    }
                }
                "wget" => {
                    let v = if t == "-O" || t == "--output-document" {
                        next.clone()
                    } else if let Some(v) = t.strip_prefix("--output-document=") {
                        Some(v.to_string())
                    } else if t.starts_with('-') && !t.starts_with("--") && t.contains('O') {
                        let after = &t[t.find('O').unwrap_or(0) + 1..];
                        Some(if after.is_empty() {
                            next.clone().unwrap_or_default()
                        } else {
                            after.to_string()
                        })
                    } else {
                        None
                    };
                    if let Some(v) = v {
                        if v != "-" {
                            self.downloaded.push(normalize(&self.resolve(&v)));
                            self.file_op(FileOp::Write, &v, false, span);
                            to_stdout = false;
                        } else {
                            to_stdout = true;
                        }
                        i += 1;
                        if i >= args.len() {
                            break;
                        }
                        continue;
                    }
                    if matches!(t, "--post-file" | "--body-file") {
                        if let Some(v) = next.clone() {
                            self.file_op(FileOp::Read, &v, false, span);
                        }
                    }
                }
                _ => {
                    if let Some(v) = file_value("-o") {
                        if v != "-" {
                            to_stdout = false;
                            self.downloaded.push(normalize(&self.resolve(&v)));
                        }
                    }
                }
            }
            i += 1;
        }
        if name == "wget" {
            let explicit = args.iter().any(|a| {
                a.text == "-O"
                    || a.text.starts_with("--output-document")
                    || (a.text.starts_with('-')
                        && !a.text.starts_with("--")
                        && a.text.contains('O'))
            });
            if !explicit {
                to_stdout = false;
                for u in &urls {
                    if let Some(b) = url_basename(u) {
                        self.downloaded.push(normalize(&self.resolve(&b)));
                    }
                }
            }
        }
        if to_stdout { Out::Remote } else { Out::Unknown }
    }
}
