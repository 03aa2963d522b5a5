//! Per-command semantics: one dispatch table from a program's name to what it does,
//! then a generic pass that checks path-like operands as reads for every program that
//! does not say what it reads itself.

mod files;
mod net;
mod shells;
mod system;
mod text;

use super::flags::Flags;
use super::names::{DOWNLOADERS, INTERPS, MINERS, NETCATS, NO_READ, SHELLS, looks_like_path};
use super::{Analyzer, Arg, Inv, Stage, has_unk};
use crate::types::FileOp;

/// One command about to run, as the per-command rules see it.
pub(super) struct Cmd<'c> {
    /// The program's basename, lowercased.
    pub name: &'c str,
    pub args: &'c [Arg],
    pub flags: &'c Flags,
    /// The span findings about this command point at.
    pub span: (usize, usize),
    pub inv: &'c Inv,
    pub depth: usize,
}

/// `python`, `python3`, `python3.12`, … and the other interpreters.
fn is_interpreter(shell_name: &str) -> bool {
    INTERPS.contains(&shell_name)
        || (shell_name.starts_with("python")
            && shell_name[6..]
                .bytes()
                .all(|b| b.is_ascii_digit() || b == b'.'))
}

impl Analyzer<'_> {
    pub(super) fn dispatch(
        &mut self,
        name: &str,
        args: &[Arg],
        inv: &mut Inv,
        depth: usize,
    ) -> Stage {
        let span = inv.span;
        let lname = name.to_ascii_lowercase();
        let name = lname.as_str();
        let flags = Flags::parse(args);
        let mut stage = Stage::default();

        if MINERS.contains(&name) {
            self.emit(
                "cmd.crypto_miner",
                span,
                format!("runs the cryptocurrency miner `{name}`"),
            );
        }
        let shell_name = name.strip_suffix(".exe").unwrap_or(name);
        let c = Cmd {
            name,
            args,
            flags: &flags,
            span,
            inv,
            depth,
        };
        let st = &mut stage;
        // Each arm says whether the command accounts for its own reads (true), or
        // leaves its path-like operands to the generic read check below (false).
        let own_reads = match name {
            _ if SHELLS.contains(&shell_name) => self.shell(&c, st),
            _ if is_interpreter(shell_name) => self.interpreter(&c, st),
            "eval" => self.eval(&c),
            "source" | "." => self.source(&c),
            "rm" | "unlink" | "rmdir" | "srm" => self.rm(&c),
            "shred" | "wipe" => self.shred(&c),
            "find" => {
                st.out = self.find(&c);
                true
            }
            "mv" => self.mv(&c),
            "cp" | "install" | "rsync" | "scp" => self.cp(&c),
            "ln" => self.ln(&c),
            "tee" => self.tee(&c, st),
            "dd" => self.dd(&c),
            "truncate" | "touch" => self.truncate(&c),
            "chmod" | "chown" | "chgrp" => self.chmod(&c),
            "sed" | "perl-i" => self.sed(&c),
            "grep" | "egrep" | "fgrep" | "rg" | "ag" | "awk" | "gawk" | "mawk" => self.grep(&c),
            "cd" | "pushd" => self.cd(&c),
            "echo" => self.echo(&c, st),
            "printf" => self.printf_cmd(&c, st),
            "cat" | "tac" => self.cat(&c, st),
            "which" => self.which(&c, st),
            "openssl" if args.first().is_some_and(|a| a.text == "s_client") => {
                self.openssl_client(st)
            }
            "base64" | "base32" | "basenc" | "xxd" | "rev" | "tr" | "gunzip" | "zcat"
            | "uudecode" | "openssl" | "gzip" | "bzip2" | "xz" | "unxz" | "bunzip2" => {
                self.decode_cmd(&c, st)
            }
            _ if DOWNLOADERS.contains(&name) => {
                st.out = Some(self.download(&c));
                true
            }
            _ if NETCATS.contains(&name) => self.netcat(&c, st),
            "socat" => self.socat(&c, st),
            "telnet" => self.telnet(st),
            "kill" => self.kill(&c),
            "killall5" => self.killall5(&c),
            "pkill" | "killall" => self.pkill(&c),
            "shutdown" | "reboot" | "halt" | "poweroff" => self.shutdown(&c),
            "init" | "telinit" => self.init(&c),
            "systemctl" | "service" => self.services(&c),
            "auditctl" => self.auditctl(&c),
            "setenforce" => self.setenforce(&c),
            "aa-teardown" | "aa-disable" | "aa-complain" => self.apparmor_off(&c),
            "iptables" | "ip6tables" | "iptables-legacy" | "iptables-nft" | "ip6tables-legacy"
            | "ip6tables-nft" => self.iptables(&c),
            "ufw" => self.ufw(&c),
            "nft" => self.nft(&c),
            "history" => self.history(&c),
            "set" => self.set_cmd(&c),
            "unset" => self.unset(&c),
            "export" | "declare" | "typeset" | "local" | "readonly" => self.export(&c),
            "crontab" => self.crontab(&c),
            _ if system::is_disk_tool(name) => self.disk(&c),
            _ => false,
        };

        if !own_reads && !NO_READ.contains(&name) {
            for a in args {
                let mut t = a.text.as_str();
                if t.starts_with("--") {
                    match t.split_once('=') {
                        Some((_, v)) => t = v,
                        None => continue,
                    }
                } else if t.starts_with('-') {
                    continue;
                }
                let t = t.trim_start_matches('@').trim_start_matches('<');
                if looks_like_path(t)
                    || self.cwd.is_some() && !t.is_empty() && !t.contains(' ') && !has_unk(t)
                {
                    let t = t.to_string();
                    self.file_op(FileOp::Read, &t, false, span);
                }
            }
        }
        stage
    }
}
