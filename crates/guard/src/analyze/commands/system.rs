//! Commands against the machine rather than files: killing everything, shutdown,
//! security and logging services, firewalls, history, cron, environment exports, and
//! the disk tools that destroy filesystems.

use super::Cmd;
use crate::analyze::Analyzer;
use crate::analyze::names::is_block_device;
use crate::analyze::names::is_name;

impl Analyzer<'_> {
    pub(super) fn kill(&mut self, c: &Cmd<'_>) -> bool {
        let (args, span) = (c.args, c.span);
        let mut k = 0;
        if let Some(a) = args.first() {
            if a.text == "-s" || a.text == "-n" {
                k = 2;
            } else if a.text.starts_with('-') && a.text != "--" && a.text != "-1"
                || a.text == "-1" && args.len() > 1
            {
                k = 1;
            }
        }
        for a in args.iter().skip(k) {
            if a.text == "-1" || a.text == "1" {
                self.emit(
                    "cmd.kill_all",
                    span,
                    if a.text == "1" {
                        "kills init (pid 1), taking the machine down".into()
                    } else {
                        "kills every process the user can signal (pid -1)".into()
                    },
                );
            }
        }
        true
    }

    pub(super) fn pkill(&mut self, c: &Cmd<'_>) -> bool {
        let (args, flags, span) = (c.args, c.flags, c.span);
        for a in flags.operands_skipping(
            args,
            b"sUugGPtn",
            &[
                "signal", "uid", "euid", "group", "parent", "terminal", "user",
            ],
        ) {
            let t = a.text.as_str();
            if matches!(
                t,
                "init"
                    | "systemd"
                    | "."
                    | ".*"
                    | ""
                    | "^"
                    | "sshd"
                    | "containerd"
                    | "dockerd"
                    | "kubelet"
            ) {
                self.emit(
                    "cmd.kill_all",
                    span,
                    format!("kills `{t}`, which takes the machine or every process down"),
                );
            }
        }
        true
    }

    pub(super) fn shutdown(&mut self, c: &Cmd<'_>) -> bool {
        let (name, args, span) = (c.name, c.args, c.span);
        if !args
            .iter()
            .any(|a| a.text == "-c" || a.text == "--help" || a.text == "--show")
        {
            self.emit(
                "cmd.shutdown",
                span,
                format!("`{name}` stops or restarts the machine"),
            );
        }
        false
    }

    pub(super) fn init(&mut self, c: &Cmd<'_>) -> bool {
        let (name, args, span) = (c.name, c.args, c.span);
        if args.first().is_some_and(|a| a.text == "0" || a.text == "6") {
            self.emit(
                "cmd.shutdown",
                span,
                format!("`{name} {}` stops or restarts the machine", args[0].text),
            );
        }
        false
    }

    pub(super) fn auditctl(&mut self, c: &Cmd<'_>) -> bool {
        let (args, span) = (c.args, c.span);
        let e0 = args
            .windows(2)
            .any(|w| w[0].text == "-e" && w[1].text == "0");
        if e0 || args.iter().any(|a| a.text == "-D") {
            self.emit(
                "cmd.audit_tamper",
                span,
                "turns off the audit system or deletes its rules".into(),
            );
        }
        false
    }

    pub(super) fn setenforce(&mut self, c: &Cmd<'_>) -> bool {
        let (args, span) = (c.args, c.span);
        if args
            .first()
            .is_some_and(|a| a.text == "0" || a.text.eq_ignore_ascii_case("permissive"))
        {
            self.emit(
                "cmd.audit_tamper",
                span,
                "switches SELinux to permissive".into(),
            );
        }
        false
    }

    pub(super) fn iptables(&mut self, c: &Cmd<'_>) -> bool {
        let (args, span) = (c.args, c.span);
        let flush = args
            .iter()
            .any(|a| matches!(a.text.as_str(), "-F" | "--flush" | "-X" | "--delete-chain"));
        let policy_accept = args
            .windows(3)
            .any(|w| (w[0].text == "-P" || w[0].text == "--policy") && w[2].text == "ACCEPT");
        if flush || policy_accept {
            self.emit(
                "cmd.firewall_tamper",
                span,
                "flushes firewall rules or opens the default policy".into(),
            );
        }
        false
    }

    pub(super) fn ufw(&mut self, c: &Cmd<'_>) -> bool {
        let (flags, span) = (c.flags, c.span);
        if flags
            .operands
            .first()
            .is_some_and(|a| a.text == "disable" || a.text == "reset")
        {
            self.emit(
                "cmd.firewall_tamper",
                span,
                "turns the ufw firewall off".into(),
            );
        }
        false
    }

    pub(super) fn nft(&mut self, c: &Cmd<'_>) -> bool {
        let (flags, span) = (c.flags, c.span);
        let t: Vec<&str> = flags.operands.iter().map(|a| a.text.as_str()).collect();
        if t.len() >= 2
            && (t[0] == "flush" && t[1] == "ruleset" || t[0] == "delete" && t[1] == "table")
        {
            self.emit(
                "cmd.firewall_tamper",
                span,
                "deletes nftables firewall rules".into(),
            );
        }
        false
    }

    pub(super) fn history(&mut self, c: &Cmd<'_>) -> bool {
        let (args, span) = (c.args, c.span);
        if args
            .iter()
            .any(|a| a.text == "-c" || a.text.starts_with("-c") || a.text == "-d")
        {
            self.emit("cmd.history_tamper", span, "clears shell history".into());
        }
        false
    }

    pub(super) fn set_cmd(&mut self, c: &Cmd<'_>) -> bool {
        let (args, span) = (c.args, c.span);
        if args
            .windows(2)
            .any(|w| w[0].text == "+o" && w[1].text == "history")
        {
            self.emit("cmd.history_tamper", span, "turns shell history off".into());
        }
        false
    }

    pub(super) fn unset(&mut self, c: &Cmd<'_>) -> bool {
        let (args, span) = (c.args, c.span);
        if args.iter().any(|a| a.text == "HISTFILE") {
            self.emit(
                "cmd.history_tamper",
                span,
                "unsets HISTFILE, so history is not saved".into(),
            );
        }
        false
    }

    pub(super) fn export(&mut self, c: &Cmd<'_>) -> bool {
        let (args, span) = (c.args, c.span);
        for a in args {
            if let Some((k, v)) = a.text.split_once('=') {
                if is_name(k) && self.vars.get(k).is_none_or(|x| x != v) {
                    self.set_var(k, v.to_string(), span);
                }
            }
        }
        false
    }

    pub(super) fn crontab(&mut self, c: &Cmd<'_>) -> bool {
        let (args, span) = (c.args, c.span);
        if args.iter().any(|a| a.text == "-r") {
            self.emit("cmd.cron_tamper", span, "removes the user's crontab".into());
        } else if !args
            .iter()
            .any(|a| a.text == "-l" || a.text == "-e" || a.text == "-h" || a.text == "--help")
        {
            self.emit(
                "cmd.cron_tamper",
                span,
                "installs a new crontab (runs commands on a schedule)".into(),
            );
        }
        true
    }

    pub(super) fn disk(&mut self, c: &Cmd<'_>) -> bool {
        let (name, args, span) = (c.name, c.args, c.span);
        let readonly = match name {
            "fdisk" | "sfdisk" | "gdisk" | "sgdisk" | "parted" => {
                args.iter().any(|a| {
                    matches!(
                        a.text.as_str(),
                        "-l" | "--list" | "-p" | "print" | "--print" | "-d" | "--dump"
                    )
                }) && !args.iter().any(|a| {
                    a.text.contains("mklabel")
                        || a.text.starts_with("-Z")
                        || a.text == "--zap-all"
                        || a.text == "-o"
                })
            }
            "hdparm" => !args.iter().any(|a| {
                a.text.starts_with("--security-erase")
                    || a.text.starts_with("--trim-sector")
                    || a.text == "--yes-i-know-what-i-am-doing"
            }),
            "badblocks" => !args.iter().any(|a| a.text == "-w"),
            "nvme" => !args
                .iter()
                .any(|a| matches!(a.text.as_str(), "format" | "sanitize")),
            "cryptsetup" => !args
                .iter()
                .any(|a| matches!(a.text.as_str(), "luksFormat" | "erase" | "luksErase")),
            _ => false,
        };
        if !readonly {
            for a in args {
                let t = self.resolve(&a.text);
                if is_block_device(&t) {
                    self.emit(
                        "cmd.disk_destroy",
                        span,
                        format!("`{name}` destroys the filesystem or data on {t}"),
                    );
                    break;
                }
            }
        }
        true
    }

    /// `systemctl` / `service`: shutdown, and stopping security, logging or firewall
    /// services.
    pub(super) fn services(&mut self, c: &Cmd<'_>) -> bool {
        let (name, flags, span) = (c.name, c.flags, c.span);
        let ops: Vec<&str> = flags.operands.iter().map(|a| a.text.as_str()).collect();
        let (action, units): (&str, Vec<&str>) = if name == "service" {
            (
                ops.get(1).copied().unwrap_or(""),
                ops.first().copied().into_iter().collect(),
            )
        } else {
            (
                ops.first().copied().unwrap_or(""),
                ops.iter().skip(1).copied().collect(),
            )
        };
        if name == "systemctl"
            && matches!(
                action,
                "reboot" | "poweroff" | "halt" | "kexec" | "soft-reboot"
            )
        {
            self.emit(
                "cmd.shutdown",
                span,
                format!("`systemctl {action}` stops or restarts the machine"),
            );
            return false;
        }
        if !matches!(action, "stop" | "disable" | "mask" | "kill") {
            return false;
        }
        for u in units {
            let u = u.trim_end_matches(".service");
            if matches!(
                u,
                "auditd"
                    | "apparmor"
                    | "selinux"
                    | "falco"
                    | "osqueryd"
                    | "wazuh-agent"
                    | "rsyslog"
                    | "syslog"
                    | "systemd-journald"
            ) {
                self.emit(
                    "cmd.audit_tamper",
                    span,
                    format!("stops the `{u}` security or logging service"),
                );
            } else if matches!(
                u,
                "firewalld"
                    | "ufw"
                    | "nftables"
                    | "iptables"
                    | "ip6tables"
                    | "netfilter-persistent"
            ) {
                self.emit(
                    "cmd.firewall_tamper",
                    span,
                    format!("stops the `{u}` firewall"),
                );
            }
        }
        false
    }

    pub(super) fn killall5(&mut self, c: &Cmd<'_>) -> bool {
        self.emit(
            "cmd.kill_all",
            c.span,
            "killall5 signals every process".into(),
        );
        false
    }

    pub(super) fn apparmor_off(&mut self, c: &Cmd<'_>) -> bool {
        self.emit(
            "cmd.audit_tamper",
            c.span,
            format!("`{}` turns AppArmor protection off", c.name),
        );
        false
    }
}

/// Tools that make, wipe or repartition filesystems and disks.
pub(super) fn is_disk_tool(name: &str) -> bool {
    name.starts_with("mkfs")
        || matches!(
            name,
            "mke2fs"
                | "mkswap"
                | "mkntfs"
                | "mkdosfs"
                | "wipefs"
                | "blkdiscard"
                | "sgdisk"
                | "sfdisk"
                | "fdisk"
                | "parted"
                | "cfdisk"
                | "gdisk"
                | "hdparm"
                | "badblocks"
                | "nvme"
                | "cryptsetup"
        )
}
