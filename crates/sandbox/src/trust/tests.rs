use super::*;
use std::process::Command;

const MANIFEST: &[u8] = b"d \"bin\" 755\nf \"bin/sh\" 755 00\n";

fn digest_of(m: &[u8]) -> String {
    let h = Sha256::digest(m);
    let mut s = String::from("sha256:");
    for b in h {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn key(kind: KeyKind) -> (SigningKey, String) {
    let (private, public) = generate_key(kind).unwrap();
    (SigningKey::from_pem(&private).unwrap(), public)
}

fn indent(pem: &str) -> String {
    pem.lines()
        .map(|l| format!("      {l}\n"))
        .collect::<String>()
}

/// A policy with signers `release` (P-256) and `edge` (Ed25519) and one rule.
fn policy(release: &str, edge: &str, rule: &str) -> TrustPolicy {
    let text = format!(
        "signers:\n  release:\n    public_key: |\n{}  edge:\n    public_key: |\n{}rules:\n{rule}",
        indent(release),
        indent(edge)
    );
    TrustPolicy::parse("policy.yaml", &text, Path::new(".")).unwrap()
}

fn stored(b: Bundle) -> StoredBundle {
    // Through JSON, as the registry stores it.
    StoredBundle {
        file: "a.sigstore.json".into(),
        bundle: Bundle::from_json(&b.to_json().unwrap()).unwrap(),
    }
}

fn cand<'a>(digest: &'a str, manifest: &'a [u8], bundles: &'a [StoredBundle]) -> Candidate<'a> {
    Candidate {
        name: "web",
        digest,
        manifest: Some(manifest),
        bundles,
    }
}

const ALL: Subject<'static> = Subject {
    tenant: "acme",
    runtime_class: "standard",
};

const SIGNED: &str = "  - name: signed\n    require_signed: true\n";

#[test]
fn a_template_signed_by_an_allowed_key_is_admitted() {
    let (p256, p256_pub) = key(KeyKind::P256);
    let (ed, ed_pub) = key(KeyKind::Ed25519);
    let pol = policy(&p256_pub, &ed_pub, SIGNED);
    let d = digest_of(MANIFEST);
    for (k, who) in [(&p256, "release"), (&ed, "edge")] {
        let b = [stored(k.sign(MANIFEST).unwrap())];
        assert_eq!(signed_digest(&b[0].bundle).as_deref(), Some(d.as_str()));
        let ok = pol.check(&cand(&d, MANIFEST, &b), &ALL).unwrap();
        assert_eq!(ok.rules, ["signed"]);
        assert_eq!(ok.signers, [who]);
    }
}

#[test]
fn unsigned_tampered_and_wrongly_signed_templates_are_refused() {
    let (p256, p256_pub) = key(KeyKind::P256);
    let (_, ed_pub) = key(KeyKind::Ed25519);
    let (stranger, _) = key(KeyKind::P256);
    let pol = policy(
        &p256_pub,
        &ed_pub,
        "  - name: release-only\n    require_signed: true\n    signers: [release]\n",
    );
    let d = digest_of(MANIFEST);

    let e = pol.check(&cand(&d, MANIFEST, &[]), &ALL).unwrap_err();
    assert_eq!(e.rule, "release-only");
    let msg = e.to_string();
    assert!(msg.contains("\"web\"") && msg.contains(&d), "{msg}");
    assert!(msg.contains("not signed"), "{msg}");

    // Signed, then the tree changed: a new manifest, a new digest.
    let b = [stored(p256.sign(MANIFEST).unwrap())];
    let tampered = b"d \"bin\" 755\nf \"bin/sh\" 4755 00\n";
    let td = digest_of(tampered);
    let e = pol.check(&cand(&td, tampered, &b), &ALL).unwrap_err();
    assert!(e.why.contains("no attached signature verifies"), "{e}");

    // Signed by a key the rule does not name.
    let b = [stored(stranger.sign(MANIFEST).unwrap())];
    let e = pol.check(&cand(&d, MANIFEST, &b), &ALL).unwrap_err();
    assert!(e.why.contains("by release"), "{e}");

    // A signature whose bytes were changed.
    let mut forged = p256.sign(MANIFEST).unwrap();
    if let SignatureContent::MessageSignature(m) = &mut forged.content {
        let mut s = m.signature.as_bytes().to_vec();
        let n = s.len() - 1;
        s[n] ^= 1;
        m.signature = SignatureBytes::new(s);
    }
    let e = pol.check(&cand(&d, MANIFEST, &[stored(forged)]), &ALL);
    assert!(e.is_err());

    // The built-in host template cannot be signed.
    let host = Candidate {
        name: "host",
        digest: "host",
        manifest: None,
        bundles: &[],
    };
    let e = pol.check(&host, &ALL).unwrap_err();
    assert!(e.why.contains("cannot be signed"), "{e}");
}

#[test]
fn pinned_digests_and_scopes() {
    let (p256, p256_pub) = key(KeyKind::P256);
    let (_, ed_pub) = key(KeyKind::Ed25519);
    let d = digest_of(MANIFEST);
    let other = digest_of(b"other");
    let pol = policy(
        &p256_pub,
        &ed_pub,
        &format!(
            "  - name: pin\n    templates: [web]\n    digests: [\"{d}\"]\n  - name: vm-signed\n    tenants: [acme]\n    runtime_classes: [isolated]\n    require_signed: true\n"
        ),
    );
    // Pinned digest: admitted; another digest of the same name: refused.
    assert_eq!(
        pol.check(&cand(&d, MANIFEST, &[]), &ALL).unwrap().rules,
        ["pin"]
    );
    let e = pol.check(&cand(&other, b"other", &[]), &ALL).unwrap_err();
    assert_eq!(e.rule, "pin");
    assert!(e.why.contains(&d), "{e}");
    // The signature rule is for acme's isolated class only.
    let vm = Subject::new("acme", "isolated");
    assert!(pol.check(&cand(&d, MANIFEST, &[]), &vm).is_err());
    assert!(pol.applies("web", &vm) && pol.applies("web", &ALL));
    assert!(!pol.applies("db", &Subject::new("beta", "isolated")));
    let b = [stored(p256.sign(MANIFEST).unwrap())];
    let ok = pol.check(&cand(&d, MANIFEST, &b), &vm).unwrap();
    assert_eq!(ok.rules, ["pin", "vm-signed"]);
    // Another tenant in the isolated class: no rule applies.
    let db = Candidate {
        name: "db",
        ..cand(&other, b"other", &[])
    };
    let ok = pol.check(&db, &Subject::new("beta", "isolated")).unwrap();
    assert!(ok.rules.is_empty());
}

#[test]
fn identities_want_certificates_and_keys_want_keys() {
    let (p256, _) = key(KeyKind::P256);
    let text = "signers:\n  ci:\n    subject: https://github.com/acme/images/.github/workflows/build.yml@refs/heads/main\n    issuer: https://token.actions.githubusercontent.com\nrules:\n  - require_signed: true\n";
    let pol = TrustPolicy::parse("p.yaml", text, Path::new(".")).unwrap();
    let d = digest_of(MANIFEST);
    let b = [stored(p256.sign(MANIFEST).unwrap())];
    let e = pol.check(&cand(&d, MANIFEST, &b), &ALL).unwrap_err();
    assert_eq!(e.rule, "rules[0]");
    assert!(
        e.why.contains("signed with a key, not a certificate"),
        "{e}"
    );
}

#[test]
fn a_signer_may_require_a_log_entry() {
    let (p256, p256_pub) = key(KeyKind::P256);
    let text = format!(
        "signers:\n  release:\n    require_tlog: true\n    public_key: |\n{}rules:\n{SIGNED}",
        indent(&p256_pub)
    );
    let pol = TrustPolicy::parse("p.yaml", &text, Path::new(".")).unwrap();
    let d = digest_of(MANIFEST);
    let b = [stored(p256.sign(MANIFEST).unwrap())];
    let e = pol.check(&cand(&d, MANIFEST, &b), &ALL).unwrap_err();
    assert!(e.why.contains("no transparency-log entry"), "{e}");
}

#[test]
fn bad_policies_name_the_file_and_the_field() {
    let (_, p256_pub) = key(KeyKind::P256);
    let k = format!(
        "signers:\n  release:\n    public_key: |\n{}",
        indent(&p256_pub)
    );
    let cases = [
        (
            "rules: [{require_signed: true, sigers: [x]}]\n".to_string(),
            "rules[0].sigers",
            "unknown field",
        ),
        (
            format!("{k}rules: [{{require_signed: true, signers: [relase]}}]\n"),
            "rules[0].signers[0]",
            "no signer \"relase\"",
        ),
        (
            format!("{k}rules: [{{digests: [\"sha256:abc\"]}}]\n"),
            "rules[0].digests[0]",
            "64",
        ),
        (
            format!("{k}rules: [{{tenants: [acme]}}]\n"),
            "rules[0]",
            "asks for nothing",
        ),
        (
            format!("{k}rules: [{{require_signed: true, tenants: []}}]\n"),
            "rules[0].tenants",
            "empty",
        ),
        (
            "rules: [{require_signed: true}]\n".to_string(),
            "rules[0].require_signed",
            "no signers",
        ),
        (
            "signers: {x: {public_key: nonsense}}\n".to_string(),
            "signers.x.public_key",
            "PEM",
        ),
        (
            "signers: {x: {subject: a}}\n".to_string(),
            "signers.x",
            "either `key`",
        ),
        (
            "signers: {x: {key: missing.pub}}\n".to_string(),
            "signers.x.key",
            "missing.pub",
        ),
        (
            "trusted_root: nowhere.json\n".to_string(),
            "trusted_root",
            "nowhere.json",
        ),
    ];
    for (text, field, needle) in cases {
        let e = TrustPolicy::parse("trust.yaml", &text, Path::new("/nonexistent")).unwrap_err();
        assert_eq!(e.file, "trust.yaml");
        assert_eq!(e.field, field, "{text}: {e}");
        assert!(e.to_string().contains(needle), "{text}: {e}");
    }
}

#[test]
fn bundles_have_cosigns_layout() {
    let (p256, public) = key(KeyKind::P256);
    let b = p256.sign(MANIFEST).unwrap();
    let v: serde_json::Value = serde_json::from_str(&b.to_json().unwrap()).unwrap();
    assert_eq!(
        v["mediaType"],
        "application/vnd.dev.sigstore.bundle.v0.3+json"
    );
    assert_eq!(
        v["messageSignature"]["messageDigest"]["algorithm"],
        "SHA2_256"
    );
    let hint = v["verificationMaterial"]["publicKey"]["hint"]
        .as_str()
        .unwrap();
    let der = parse_public_key(&public).unwrap();
    let want = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(der.as_bytes()));
    assert_eq!(hint, want);
    let md = v["messageSignature"]["messageDigest"]["digest"]
        .as_str()
        .unwrap();
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(md)
            .unwrap(),
        Sha256::digest(MANIFEST).to_vec()
    );
}

fn openssl(args: &[&str]) -> bool {
    Command::new("openssl")
        .args(args)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// A signature made by another implementation (OpenSSL's command line), put into
/// cosign's bundle layout by hand, verifies; so does its public key file.
#[test]
fn a_bundle_signed_by_openssl_verifies() {
    if !openssl(&["version"]) {
        eprintln!("skipped: no `openssl` command here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).display().to_string();
    std::fs::write(p("manifest"), MANIFEST).unwrap();
    assert!(openssl(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        &p("ec.key")
    ]));
    assert!(openssl(&[
        "pkey",
        "-in",
        &p("ec.key"),
        "-pubout",
        "-out",
        &p("ec.pub")
    ]));
    assert!(openssl(&[
        "dgst",
        "-sha256",
        "-sign",
        &p("ec.key"),
        "-out",
        &p("ec.sig"),
        &p("manifest")
    ]));
    assert!(openssl(&[
        "genpkey",
        "-algorithm",
        "ed25519",
        "-out",
        &p("ed.key")
    ]));
    assert!(openssl(&[
        "pkey",
        "-in",
        &p("ed.key"),
        "-pubout",
        "-out",
        &p("ed.pub")
    ]));
    assert!(openssl(&[
        "pkeyutl",
        "-sign",
        "-rawin",
        "-inkey",
        &p("ed.key"),
        "-in",
        &p("manifest"),
        "-out",
        &p("ed.sig")
    ]));
    let std_b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let bundle = |sig: &str| {
        let j = serde_json::json!({
            "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
            "verificationMaterial": {"publicKey": {"hint": "unused"}},
            "messageSignature": {
                "messageDigest": {"algorithm": "SHA2_256", "digest": std_b64(&Sha256::digest(MANIFEST))},
                "signature": std_b64(&std::fs::read(p(sig)).unwrap()),
            }
        });
        StoredBundle {
            file: sig.into(),
            bundle: Bundle::from_json(&j.to_string()).unwrap(),
        }
    };
    let text = format!(
        "signers:\n  release: {{key: {}}}\n  edge: {{key: {}}}\nrules:\n{SIGNED}",
        p("ec.pub"),
        p("ed.pub")
    );
    let pol = TrustPolicy::parse("p.yaml", &text, dir.path()).unwrap();
    let d = digest_of(MANIFEST);
    for (sig, who) in [("ec.sig", "release"), ("ed.sig", "edge")] {
        let b = [bundle(sig)];
        let ok = pol.check(&cand(&d, MANIFEST, &b), &ALL).unwrap();
        assert_eq!(ok.signers, [who]);
    }
    // OpenSSL's private keys sign here too.
    let k = SigningKey::from_pem(&std::fs::read_to_string(p("ed.key")).unwrap()).unwrap();
    let b = [stored(k.sign(MANIFEST).unwrap())];
    assert_eq!(
        pol.check(&cand(&d, MANIFEST, &b), &ALL).unwrap().signers,
        ["edge"]
    );
}

#[test]
fn attestation_is_required_where_a_rule_says_so() {
    let p = TrustPolicy::parse(
        "policy.yaml",
        "rules:\n  - name: secure-on-attested\n    tenants: [secure]\n    require_attested: true\n",
        Path::new("."),
    )
    .unwrap();
    let secure = Subject::new("secure", "standard");
    assert_eq!(
        p.requires_attestation("host", &secure),
        Some("secure-on-attested")
    );
    assert_eq!(
        p.requires_attestation("tools", &Subject::new("beta", "standard")),
        None
    );
    // Asking only for attestation admits any template, `host` included.
    let c = Candidate {
        name: "host",
        digest: "host",
        manifest: None,
        bundles: &[],
    };
    assert!(p.check(&c, &secure).is_ok());
}
