//! The seccomp filter: a reviewed deny-list (`policy/seccomp.policy`) with a reason per
//! rule, compiled with `seccompiler`.

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

/// The reviewed policy, compiled into the binary.
pub const POLICY: &str = include_str!("../policy/seccomp.policy");

/// What a matching rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    Eperm,
    Enosys,
    Kill,
}

/// `argN [& MASK] == VALUE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Condition {
    pub arg: u8,
    pub mask: Option<u64>,
    pub value: u64,
}

/// One reviewed line of the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub syscall: String,
    pub nr: i64,
    pub action: Action,
    pub condition: Option<Condition>,
    pub reason: String,
    pub line: usize,
}

/// Parses the policy text. Errors name the line.
pub fn parse(text: &str) -> Result<Vec<Rule>, String> {
    let mut rules = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let l = raw.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let parts: Vec<&str> = l.split('|').map(str::trim).collect();
        if parts.len() != 4 {
            return Err(format!(
                "line {line}: want `syscall | action | condition | reason`, got {l:?}"
            ));
        }
        let (name, action, cond, reason) = (parts[0], parts[1], parts[2], parts[3]);
        let nr =
            syscall_nr(name).ok_or_else(|| format!("line {line}: unknown syscall {name:?}"))?;
        let action = match action {
            "EPERM" => Action::Eperm,
            "ENOSYS" => Action::Enosys,
            "KILL" => Action::Kill,
            a => {
                return Err(format!(
                    "line {line}: unknown action {a:?} (EPERM, ENOSYS, KILL)"
                ));
            }
        };
        if reason.is_empty() {
            return Err(format!(
                "line {line}: {name} has no reason; every rule needs one"
            ));
        }
        let condition = if cond.is_empty() {
            None
        } else {
            Some(parse_condition(cond).map_err(|e| format!("line {line}: {e}"))?)
        };
        rules.push(Rule {
            syscall: name.to_string(),
            nr,
            action,
            condition,
            reason: reason.to_string(),
            line,
        });
    }
    Ok(rules)
}

fn parse_num(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let r = if let Some(h) = s.strip_prefix("0x") {
        u64::from_str_radix(h, 16)
    } else {
        s.parse()
    };
    r.map_err(|_| format!("bad number {s:?}"))
}

fn parse_condition(c: &str) -> Result<Condition, String> {
    let (lhs, rhs) = c
        .split_once("==")
        .ok_or_else(|| format!("condition {c:?} has no `==`"))?;
    let value = parse_num(rhs)?;
    let (arg, mask) = match lhs.split_once('&') {
        Some((a, m)) => (a.trim(), Some(parse_num(m)?)),
        None => (lhs.trim(), None),
    };
    let arg = arg
        .strip_prefix("arg")
        .and_then(|n| n.parse::<u8>().ok())
        .filter(|n| *n <= 5)
        .ok_or_else(|| format!("condition {c:?}: want arg0..arg5"))?;
    Ok(Condition { arg, mask, value })
}

/// The default policy, parsed. Panics only if the compiled-in file is broken, which a
/// unit test rules out.
pub fn default_rules() -> Vec<Rule> {
    parse(POLICY).expect("policy/seccomp.policy parses (checked by tests)")
}

/// Compiles rules into BPF programs, one per action (the kernel applies the strictest
/// result of all installed filters). Syscalls of other architectures are killed.
pub fn compile(rules: &[Rule]) -> Result<Vec<BpfProgram>, String> {
    // Per action: syscall -> None (always) or Some(conditional rules).
    let mut by_action: BTreeMap<Action, BTreeMap<i64, Option<Vec<SeccompRule>>>> = BTreeMap::new();
    for r in rules {
        let map = by_action.entry(r.action).or_default();
        let entry = map.entry(r.nr).or_insert_with(|| Some(Vec::new()));
        match r.condition {
            None => *entry = None,
            Some(c) => {
                // A 4-byte compare is enough for the flag words used here and avoids the
                // sign-extension pitfalls of 64-bit compares on `int` arguments.
                let op = match c.mask {
                    Some(m) => SeccompCmpOp::MaskedEq(m),
                    None => SeccompCmpOp::Eq,
                };
                let cond = SeccompCondition::new(c.arg, SeccompCmpArgLen::Dword, op, c.value)
                    .map_err(|e| e.to_string())?;
                if let Some(list) = entry {
                    list.push(SeccompRule::new(vec![cond]).map_err(|e| e.to_string())?);
                }
            }
        }
    }
    let mut progs = Vec::new();
    for (action, map) in by_action {
        // seccompiler: an empty rule list means "match on the number alone".
        let map: BTreeMap<i64, Vec<SeccompRule>> = map
            .into_iter()
            .map(|(nr, rules)| (nr, rules.unwrap_or_default()))
            .collect();
        let act = match action {
            Action::Eperm => SeccompAction::Errno(libc::EPERM as u32),
            Action::Enosys => SeccompAction::Errno(libc::ENOSYS as u32),
            Action::Kill => SeccompAction::KillProcess,
        };
        let filter = SeccompFilter::new(map, SeccompAction::Allow, act, TargetArch::x86_64)
            .map_err(|e| e.to_string())?;
        let prog: BpfProgram = filter
            .try_into()
            .map_err(|e: seccompiler::BackendError| e.to_string())?;
        progs.push(prog);
    }
    progs.push(x32_guard());
    Ok(progs)
}

/// seccompiler checks the architecture (so i386 syscalls are killed) but not the x32
/// ABI, whose syscall numbers carry bit 30 on x86_64. This filter kills those.
fn x32_guard() -> BpfProgram {
    use seccompiler::sock_filter;
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const BPF_RET_K: u16 = 0x06;
    vec![
        // A = seccomp_data.nr (offset 0)
        sock_filter {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        },
        sock_filter {
            code: BPF_JGE_K,
            jt: 0,
            jf: 1,
            k: 0x4000_0000,
        },
        sock_filter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: 0x8000_0000,
        }, // KILL_PROCESS
        sock_filter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: 0x7fff_0000,
        }, // ALLOW
    ]
}

/// Installs the programs on the calling thread (needs no_new_privs or CAP_SYS_ADMIN).
pub fn apply(progs: &[BpfProgram]) -> Result<(), String> {
    for p in progs {
        seccompiler::apply_filter(p).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// x86_64 numbers of the syscalls the policy may name.
pub fn syscall_nr(name: &str) -> Option<i64> {
    use libc::*;
    Some(match name {
        "mount" => SYS_mount,
        "umount2" => SYS_umount2,
        "pivot_root" => SYS_pivot_root,
        "chroot" => SYS_chroot,
        "open_tree" => SYS_open_tree,
        "move_mount" => SYS_move_mount,
        "fsopen" => SYS_fsopen,
        "fsconfig" => SYS_fsconfig,
        "fsmount" => SYS_fsmount,
        "fspick" => SYS_fspick,
        "mount_setattr" => SYS_mount_setattr,
        "name_to_handle_at" => SYS_name_to_handle_at,
        "open_by_handle_at" => SYS_open_by_handle_at,
        "quotactl" => SYS_quotactl,
        "quotactl_fd" => 443,
        "swapon" => SYS_swapon,
        "swapoff" => SYS_swapoff,
        "unshare" => SYS_unshare,
        "setns" => SYS_setns,
        "clone" => SYS_clone,
        "clone3" => SYS_clone3,
        "ptrace" => SYS_ptrace,
        "process_vm_readv" => SYS_process_vm_readv,
        "process_vm_writev" => SYS_process_vm_writev,
        "kcmp" => SYS_kcmp,
        "pidfd_getfd" => SYS_pidfd_getfd,
        "perf_event_open" => SYS_perf_event_open,
        "bpf" => SYS_bpf,
        "init_module" => SYS_init_module,
        "finit_module" => SYS_finit_module,
        "delete_module" => SYS_delete_module,
        "kexec_load" => SYS_kexec_load,
        "kexec_file_load" => SYS_kexec_file_load,
        "reboot" => SYS_reboot,
        "acct" => SYS_acct,
        "syslog" => SYS_syslog,
        "iopl" => SYS_iopl,
        "ioperm" => SYS_ioperm,
        "settimeofday" => SYS_settimeofday,
        "clock_settime" => SYS_clock_settime,
        "clock_adjtime" => SYS_clock_adjtime,
        "adjtimex" => SYS_adjtimex,
        "sethostname" => SYS_sethostname,
        "setdomainname" => SYS_setdomainname,
        "lookup_dcookie" => SYS_lookup_dcookie,
        "_sysctl" => SYS__sysctl,
        "uselib" => SYS_uselib,
        "ustat" => SYS_ustat,
        "sysfs" => SYS_sysfs,
        "vhangup" => SYS_vhangup,
        "personality" => SYS_personality,
        "keyctl" => SYS_keyctl,
        "add_key" => SYS_add_key,
        "request_key" => SYS_request_key,
        "userfaultfd" => SYS_userfaultfd,
        "mbind" => SYS_mbind,
        "set_mempolicy" => SYS_set_mempolicy,
        "migrate_pages" => SYS_migrate_pages,
        "move_pages" => SYS_move_pages,
        "io_uring_setup" => SYS_io_uring_setup,
        "io_uring_enter" => SYS_io_uring_enter,
        "io_uring_register" => SYS_io_uring_register,
        "socket" => SYS_socket,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_parses_and_every_rule_has_a_reason() {
        let rules = default_rules();
        assert!(rules.len() > 50);
        for r in &rules {
            assert!(
                r.reason.len() > 5,
                "line {}: {} reason too short",
                r.line,
                r.syscall
            );
        }
        for must in [
            "mount",
            "ptrace",
            "bpf",
            "kexec_load",
            "init_module",
            "finit_module",
            "unshare",
            "keyctl",
            "setns",
            "io_uring_setup",
        ] {
            assert!(
                rules
                    .iter()
                    .any(|r| r.syscall == must && r.condition.is_none()),
                "{must}"
            );
        }
        assert!(rules.iter().any(|r| r.syscall == "clone"
            && r.condition
                == Some(Condition {
                    arg: 0,
                    mask: Some(0x1000_0000),
                    value: 0x1000_0000
                })));
        assert!(
            rules
                .iter()
                .any(|r| r.syscall == "socket" && r.condition.map(|c| c.value) == Some(17))
        );
    }

    #[test]
    fn policy_compiles() {
        let progs = compile(&default_rules()).unwrap();
        assert_eq!(progs.len(), 3, "EPERM, ENOSYS and the x32 guard");
    }

    #[test]
    fn bad_lines_are_reported_with_their_number() {
        assert!(parse("mount | EPERM | |").unwrap_err().contains("line 1"));
        assert!(
            parse("\nnosuch | EPERM | | r")
                .unwrap_err()
                .contains("line 2")
        );
        assert!(
            parse("mount | DENY | | reason")
                .unwrap_err()
                .contains("DENY")
        );
        assert!(parse("socket | EPERM | arg9 == 1 | reason").is_err());
        assert!(parse("socket | EPERM | arg0 = 1 | reason").is_err());
        assert!(parse("mount | EPERM | | reason").is_ok());
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(s in ".{0,200}") {
            let _ = parse(&s);
        }
    }
}
