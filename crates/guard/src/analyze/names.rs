//! The name tables the rules key on, and small predicates over names and paths.

use crate::paths::normalize;

pub(super) const SHELLS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "fish", "csh", "tcsh", "rbash", "yash",
    "posh",
];
pub(super) const INTERPS: &[&str] = &[
    "python",
    "python2",
    "python3",
    "perl",
    "ruby",
    "node",
    "nodejs",
    "php",
    "lua",
    "pwsh",
    "powershell",
    "irb",
    "jshell",
    "deno",
    "bun",
];
pub(super) const DOWNLOADERS: &[&str] = &[
    "curl",
    "wget",
    "fetch",
    "aria2c",
    "axel",
    "lwp-download",
    "http",
    "https",
    "xh",
];
pub(super) const NETCATS: &[&str] = &[
    "nc",
    "ncat",
    "netcat",
    "nc.traditional",
    "nc.openbsd",
    "pwncat",
];
pub(super) const MINERS: &[&str] = &[
    "xmrig",
    "xmr-stak",
    "xmr-stak-cpu",
    "minerd",
    "cpuminer",
    "cpuminer-multi",
    "cgminer",
    "bfgminer",
    "ethminer",
    "t-rex",
    "nbminer",
    "lolminer",
    "phoenixminer",
    "ccminer",
    "nanominer",
    "gminer",
    "teamredminer",
    "srbminer",
    "srbminer-multi",
    "xmrig-cuda",
    "kawpowminer",
    "ethdcrminer64",
    "nheqminer",
    "claymore",
];
pub(super) const MINER_MARKERS: &[&str] = &[
    "stratum+tcp://",
    "stratum+ssl://",
    "stratum+tls://",
    "stratum2+tcp://",
    "stratum://",
    "minexmr.com",
    "supportxmr.com",
    "moneroocean.stream",
    "nanopool.org",
    "2miners.com",
    "hashvault.pro",
    "f2pool.com",
    "ethermine.org",
    "xmrpool.eu",
    "c3pool.com",
    "herominers.com",
    "unmineable.com",
    "--donate-level",
    "--randomx",
];
pub(super) const METADATA: &[&str] = &[
    "169.254.169.254",
    "metadata.google.internal",
    "100.100.100.200",
    "fd00:ec2::254",
    "169.254.170.2",
    "2852039166",
    "0xa9fea9fe",
    "0251.0376.0251.0376",
    "metadata.azure.com",
    "169.254.169.123",
];
pub(super) const PROTECTED: &[&str] = &[
    "/",
    "~",
    "/root",
    "/home",
    "/etc",
    "/usr",
    "/usr/bin",
    "/usr/sbin",
    "/usr/lib",
    "/usr/lib64",
    "/usr/share",
    "/usr/local",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/boot",
    "/var",
    "/var/lib",
    "/opt",
    "/srv",
    "/dev",
    "/proc",
    "/sys",
    "/snap",
    "/run",
];
/// Never inferred as file reads: these commands name paths without reading them.
pub(super) const NO_READ: &[&str] = &[
    "ls",
    "stat",
    "test",
    "[",
    "[[",
    "du",
    "df",
    "realpath",
    "readlink",
    "dirname",
    "basename",
    "echo",
    "printf",
    "which",
    "type",
    "mkdir",
    "cd",
    "pushd",
    "popd",
    "ssh",
    "ssh-add",
    "ssh-keygen",
    "ssh-copy-id",
    "sftp",
    "git",
    "touch",
    "export",
    "declare",
    "local",
    "readonly",
    "typeset",
    "unset",
    "alias",
    "exit",
    "return",
    "true",
    "false",
    "sleep",
    "kill",
    "pkill",
    "killall",
    "mount",
    "umount",
    "ln",
    "help",
    "man",
    "whereis",
    "command",
    "hash",
    "set",
    "docker",
    "kubectl",
    "helm",
    "make",
    "cargo",
    "npm",
    "pip",
    "pip3",
    "apt",
    "apt-get",
    "yum",
    "dnf",
    "go",
];

/// Programs whose copies and links the runtime identifies by content: everything with
/// rules of its own here (deleters, disk tools, shells, interpreters, downloaders,
/// network tools, wrappers that run another program, multi-call binaries, miners).
const FOLLOWED: &[&str] = &[
    "rm",
    "unlink",
    "rmdir",
    "srm",
    "shred",
    "wipe",
    "dd",
    "truncate",
    "mke2fs",
    "mkswap",
    "mkntfs",
    "mkdosfs",
    "wipefs",
    "blkdiscard",
    "sgdisk",
    "sfdisk",
    "fdisk",
    "parted",
    "cfdisk",
    "gdisk",
    "hdparm",
    "badblocks",
    "nvme",
    "cryptsetup",
    "find",
    "xargs",
    "chmod",
    "chown",
    "chgrp",
    "mv",
    "cp",
    "ln",
    "install",
    "rsync",
    "tee",
    "sed",
    "kill",
    "pkill",
    "killall",
    "killall5",
    "shutdown",
    "reboot",
    "halt",
    "poweroff",
    "init",
    "telinit",
    "systemctl",
    "service",
    "iptables",
    "ip6tables",
    "iptables-legacy",
    "iptables-nft",
    "ip6tables-legacy",
    "ip6tables-nft",
    "nft",
    "ufw",
    "auditctl",
    "setenforce",
    "crontab",
    "socat",
    "telnet",
    "openssl",
    "base64",
    "base32",
    "basenc",
    "xxd",
    "busybox",
    "toybox",
    "env",
    "sudo",
    "doas",
    "nice",
    "ionice",
    "nohup",
    "timeout",
    "setsid",
    "stdbuf",
    "chroot",
    "nsenter",
    "unshare",
    "su",
    "runuser",
    "strace",
    "ltrace",
    "flock",
    "watch",
    "eval",
    "systemd-run",
    "proxychains",
    "proxychains4",
];

/// See [`FOLLOWED`]; also `mkfs.*` and `pythonX.Y`.
pub(crate) fn followed(name: &str) -> bool {
    let n = name.strip_suffix(".exe").unwrap_or(name);
    FOLLOWED.contains(&n)
        || n.starts_with("mkfs")
        || SHELLS.contains(&n)
        || INTERPS.contains(&n)
        || n.starts_with("python") && n[6..].bytes().all(|b| b.is_ascii_digit() || b == b'.')
        || DOWNLOADERS.contains(&n)
        || NETCATS.contains(&n)
        || MINERS.contains(&n)
}

/// Multi-call binaries: they run the applet named by how they were called.
pub(crate) const MULTICALL: &[&str] = &["busybox", "toybox"];

pub(super) fn is_name(k: &str) -> bool {
    !k.is_empty()
        && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !k.as_bytes()[0].is_ascii_digit()
}

pub(crate) fn basename(p: &str) -> &str {
    p.trim_end_matches('/').rsplit('/').next().unwrap_or(p)
}

pub(super) fn looks_like_path(t: &str) -> bool {
    !t.is_empty()
        && t.len() < 4096
        && !t.contains("://")
        && !t.contains(' ')
        && (t.contains('/') || t.starts_with('.') || t.starts_with('~'))
}

pub(super) fn url_basename(u: &str) -> Option<String> {
    let path = u.split_once("://").map(|(_, r)| r).unwrap_or(u);
    let path = path.split(['?', '#']).next().unwrap_or("");
    let (_, p) = path.split_once('/')?;
    let b = basename(p);
    (!b.is_empty()).then(|| b.to_string())
}

pub(crate) fn is_block_device(p: &str) -> bool {
    let n = normalize(p);
    let Some(d) = n.strip_prefix("/dev/") else {
        return false;
    };
    [
        "sd", "hd", "vd", "xvd", "nvme", "mmcblk", "md", "dm-", "mapper/", "disk/", "loop", "sr",
        "nbd", "rbd", "zd", "bcache",
    ]
    .iter()
    .any(|p| d.starts_with(p))
        && !d.starts_with("mqueue")
}
