//! Templates from an OCI image layout made here (tar+gzip layers, whiteouts, links),
//! and malicious layers that must be rejected without touching anything outside the
//! destination. `TESSERA_TEST_DEBOOTSTRAP=SUITE` also builds a real debootstrap
//! template and runs a shell in it (needs root, the network and debootstrap).

mod common;

use flate2::Compression;
use flate2::write::GzEncoder;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::Path;
use tessera_sandbox::template::{OciOptions, TemplateError, unpack_oci_layout};
use tessera_sandbox::{ExecRequest, SandboxSpec, Template};

enum E<'a> {
    File(&'a str, &'a [u8]),
    Dir(&'a str),
    Sym(&'a str, &'a str),
    Hard(&'a str, &'a str),
    Char(&'a str),
}

fn header(path: &str, kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    // Written raw: the tar crate refuses to *make* `..` paths, and the tests need them.
    let name = &mut h.as_old_mut().name;
    name[..path.len()].copy_from_slice(path.as_bytes());
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_cksum();
    h
}

fn layer(entries: &[E]) -> Vec<u8> {
    let mut b = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::fast()));
    for e in entries {
        match *e {
            E::File(p, data) => {
                let h = header(p, tar::EntryType::Regular, data.len() as u64, 0o644);
                b.append(&h, data).unwrap();
            }
            E::Dir(p) => b
                .append(&header(p, tar::EntryType::Directory, 0, 0o755), &[][..])
                .unwrap(),
            E::Sym(p, t) | E::Hard(p, t) => {
                let kind = if matches!(e, E::Sym(..)) {
                    tar::EntryType::Symlink
                } else {
                    tar::EntryType::Link
                };
                let mut h = header(p, kind, 0, 0o777);
                h.set_link_name_literal(t).unwrap();
                h.set_cksum();
                b.append(&h, &[][..]).unwrap();
            }
            E::Char(p) => b
                .append(&header(p, tar::EntryType::Char, 0, 0o666), &[][..])
                .unwrap(),
        }
    }
    b.into_inner().unwrap().finish().unwrap()
}

fn put_blob(layout: &Path, data: &[u8]) -> String {
    let hex: String = Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let dir = layout.join("blobs/sha256");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(&hex), data).unwrap();
    format!("sha256:{hex}")
}

/// Writes an OCI layout with these layers (oldest first); returns the layer digests.
fn layout(dir: &Path, layers: &[Vec<u8>]) -> Vec<String> {
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let config = br#"{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/usr/bin:/bin","GREETING=hi"],"WorkingDir":"/srv"},"rootfs":{"type":"layers","diff_ids":[]}}"#;
    let cdig = put_blob(dir, config);
    let mut descs = Vec::new();
    let mut digs = Vec::new();
    for l in layers {
        let d = put_blob(dir, l);
        descs.push(serde_json::json!({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d, "size": l.len()}));
        digs.push(d);
    }
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cdig, "size": config.len()},
        "layers": descs,
    }))
    .unwrap();
    let mdig = put_blob(dir, &manifest);
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mdig, "size": manifest.len(),
            "annotations": {"org.opencontainers.image.ref.name": "latest"}}],
    });
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    digs
}

fn opts() -> OciOptions {
    OciOptions {
        reference: Some("latest".into()),
        ..Default::default()
    }
}

#[test]
fn oci_layout_unpacks_layers_whiteouts_and_links() {
    let t = tempfile::tempdir().unwrap();
    let (lay, root) = (t.path().join("layout"), t.path().join("root"));
    std::fs::create_dir(&lay).unwrap();
    layout(
        &lay,
        &[
            layer(&[
                E::Dir("etc"),
                E::File("etc/hello", b"one"),
                E::File("etc/gone", b"x"),
                E::File("opt/dir/a", b"a"),
                E::File("opt/dir/b", b"b"),
                E::Sym("usr/lib/link", "../../etc/hello"),
                E::Sym("usr/abs", "/etc/hello"),
                E::Hard("etc/hard", "etc/hello"),
            ]),
            layer(&[
                E::File("etc/.wh.gone", b""),
                E::File("opt/dir/.wh..wh..opq", b""),
                E::File("opt/dir/c", b"c"),
                E::File("etc/hello", b"two"),
            ]),
        ],
    );
    let img = unpack_oci_layout(&lay, &root, &opts()).unwrap();
    assert_eq!(img.layers, 2);
    assert_eq!(img.env, vec!["PATH=/usr/bin:/bin", "GREETING=hi"]);
    assert_eq!(img.working_dir.as_deref(), Some("/srv"));
    let read = |p: &str| std::fs::read_to_string(root.join(p)).ok();
    assert_eq!(read("etc/hello").as_deref(), Some("two"));
    assert_eq!(
        read("etc/hard").as_deref(),
        Some("one"),
        "linked before the upper layer replaced hello"
    );
    assert_eq!(read("etc/gone"), None, "whited out");
    assert!(!root.join("etc/.wh.gone").exists());
    let mut names: Vec<String> = std::fs::read_dir(root.join("opt/dir"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec!["c"],
        "the opaque folder hides the lower layer's files"
    );
    assert_eq!(read("usr/lib/link").as_deref(), Some("two"));
    assert_eq!(
        std::fs::read_link(root.join("usr/abs")).unwrap(),
        Path::new("/etc/hello")
    );
    // A second unpack into the same (now full) folder is refused.
    assert!(matches!(
        unpack_oci_layout(&lay, &root, &opts()),
        Err(TemplateError::Format { .. })
    ));
    // A name that is not in the layout.
    let r = unpack_oci_layout(
        &lay,
        &t.path().join("other"),
        &OciOptions {
            reference: Some("nope".into()),
            ..Default::default()
        },
    );
    assert!(format!("{}", r.unwrap_err()).contains("no image named \"nope\""));

    // The unpacked image serves as a sandbox template: the file operations need no
    // program inside, so this tiny image is enough.
    if !common::root_or_skip("oci template in a sandbox") {
        return;
    }
    let sb = common::spawn(&SandboxSpec {
        template: Template::Dir(root.clone()),
        ..SandboxSpec::default()
    });
    assert_eq!(sb.read_file("/etc/hello").unwrap(), b"two");
    let ls: Vec<String> = sb
        .list("/opt/dir")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(ls, vec!["c"]);
    assert!(
        sb.write_file("/etc/new", b"x").is_err(),
        "the base is read-only"
    );
    sb.write_file("/workspace/ok", b"x").unwrap();
    // No shell in this image: a command fails to start, and says so.
    assert!(
        sb.exec(&ExecRequest::argv(["/bin/sh", "-c", "true"]))
            .is_err()
    );
}

/// Each malicious layer is rejected, and nothing is written outside the destination.
#[test]
fn malicious_layers_are_rejected() {
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim");
    std::fs::write(&victim, b"intact").unwrap();
    let o = outside.path().display().to_string();
    let deep_up = format!("../../../../../../../../../..{o}");
    let cases: Vec<(&str, Vec<Vec<u8>>, &str)> = vec![
        (
            "path traversal",
            vec![layer(&[E::File("../../evil", b"x")])],
            "`..`",
        ),
        (
            "relative symlink escaping",
            vec![layer(&[E::Sym("a/link", &deep_up)])],
            "climbs out",
        ),
        (
            "absolute symlink escaping",
            vec![layer(&[E::Sym("link", "/../../../etc")])],
            "climbs out",
        ),
        (
            "write through a symlink",
            vec![
                layer(&[E::Sym("x", &o)]),
                layer(&[E::File("x/victim", b"overwritten")]),
            ],
            "symlink",
        ),
        (
            "whiteout through a symlink",
            vec![
                layer(&[E::Sym("x", &o)]),
                layer(&[E::File("x/.wh.victim", b"")]),
            ],
            "symlink",
        ),
        (
            "hard link to a host file",
            vec![layer(&[E::Hard("h", &victim.display().to_string())])],
            "not a regular file of the image",
        ),
        (
            "device node",
            vec![layer(&[E::Char("dev/mem")])],
            "device nodes",
        ),
    ];
    for (what, layers, says) in cases {
        let t = tempfile::tempdir().unwrap();
        let lay = t.path().join("layout");
        std::fs::create_dir(&lay).unwrap();
        layout(&lay, &layers);
        let r = unpack_oci_layout(&lay, &t.path().join("root"), &opts());
        match r {
            Err(e @ TemplateError::Rejected { .. }) => {
                assert!(e.to_string().contains(says), "{what}: {e}")
            }
            other => panic!("{what}: expected a rejection, got {other:?}"),
        }
        assert_eq!(std::fs::read(&victim).unwrap(), b"intact", "{what}");
        assert_eq!(
            std::fs::read_dir(outside.path()).unwrap().count(),
            1,
            "{what}"
        );
    }
}

#[test]
fn tampered_blobs_are_rejected() {
    let t = tempfile::tempdir().unwrap();
    let lay = t.path().join("layout");
    std::fs::create_dir(&lay).unwrap();
    let digs = layout(&lay, &[layer(&[E::File("etc/x", b"x")])]);
    let hex = digs[0].strip_prefix("sha256:").unwrap();
    let p = lay.join("blobs/sha256").join(hex);
    let mut data = std::fs::read(&p).unwrap();
    let n = data.len();
    data[n - 1] ^= 1;
    std::fs::File::create(&p).unwrap().write_all(&data).unwrap();
    let e = unpack_oci_layout(&lay, &t.path().join("root"), &opts()).unwrap_err();
    assert!(matches!(e, TemplateError::Blob { .. }), "{e}");
    assert!(e.to_string().contains("digest"), "{e}");
}

/// A real debootstrap template, only when asked: `TESSERA_TEST_DEBOOTSTRAP=bookworm`.
#[test]
fn debootstrap_template_runs_a_shell() {
    let Ok(suite) = std::env::var("TESSERA_TEST_DEBOOTSTRAP") else {
        eprintln!("SKIPPED debootstrap_template_runs_a_shell: set TESSERA_TEST_DEBOOTSTRAP=SUITE");
        return;
    };
    if !common::root_or_skip("debootstrap_template_runs_a_shell") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    let mirror = std::env::var("TESSERA_TEST_DEBOOTSTRAP_MIRROR").ok();
    tessera_sandbox::template::debootstrap(&suite, &root, mirror.as_deref()).unwrap();
    let sb = common::spawn(&SandboxSpec {
        template: Template::Dir(root),
        ..SandboxSpec::default()
    });
    let out = sb
        .exec(&ExecRequest::shell(
            "grep -c . /etc/debian_version && ls /usr/bin | wc -l",
        ))
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
