mod common;
use std::time::Duration;
use tessera_sandbox::ExecRequest;

#[test]
fn smoke() {
    if !common::root_or_skip("smoke") {
        return;
    }
    let sb = common::sandbox();
    let out = sb.exec(&ExecRequest::shell("echo hi; id; hostname; pwd; ls /; cat /proc/self/cgroup; ls /proc | head; python3 -c 'print(1+1)'").timeout(Duration::from_secs(10))).unwrap();
    eprintln!(
        "{:?}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    sb.destroy().unwrap();
}
