//! Node attestation against a real software TPM (swtpm + tpm2-tools): a node's quote
//! verifies against what was approved; a changed binary or configuration, a forged
//! or a replayed quote, a doctored PCR value or event log are each refused with their
//! own error. Skips (saying why) where swtpm is not installed; with `CI` set, fails.

use tessera_node::attest::{
    AttestError, Measurement, Reference, Tpm,
    quote::{authentic, verify},
    tpm::Swtpm,
};

fn swtpm() -> Option<(Swtpm, Tpm, tempfile::TempDir)> {
    if !Swtpm::available() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but swtpm/tpm2-tools are missing: .ci/run installs them"
        );
        eprintln!("skipped: swtpm, swtpm_setup or tpm2-tools is not installed");
        return None;
    }
    let sw = Swtpm::start().expect("swtpm starts");
    let dir = tempfile::tempdir().unwrap();
    let tpm = Tpm::open(&sw.tcti(), dir.path()).expect("the TPM answers");
    Some((sw, tpm, dir))
}

fn log(binary: &[u8], config: &[u8]) -> Vec<Measurement> {
    vec![
        Measurement::of("tessera-binary", binary),
        Measurement::of("seccomp-policy", b"seccomp v1"),
        Measurement::of("node-config", config),
    ]
}

#[test]
fn a_node_attests_and_loses_it_when_what_it_runs_changes() {
    let Some((_sw, tpm, _d)) = swtpm() else {
        return;
    };
    let id = tpm.identity().unwrap();
    // The same keys on a second call (persistent handles).
    assert_eq!(tpm.identity().unwrap(), id);
    // Registration: the TPM recovers the verifier's secret, so the AK lives beside
    // the EK.
    let cred = tessera_node::attest::challenge(&id, b"registration secret", &[7; 32]).unwrap();
    assert_eq!(tpm.activate(&cred).unwrap(), b"registration secret");
    tpm.measure(&log(b"tessera 1", b"config 1")).unwrap();

    let nonce = b"nonce-0001-verifier";
    let e = tpm.quote(nonce).unwrap();
    authentic(&id.ak_public, &e, nonce).expect("a fresh quote is authentic");
    let reference = Reference::approving(&id.ak_public, &e);
    let v = verify(&reference, &e, nonce).expect("the approved state verifies");
    assert_eq!(v.measurements.len(), 3);

    // A changed binary: the quote is genuine but shows another digest.
    tpm.measure(&log(b"tessera 2 (patched)", b"config 1"))
        .unwrap();
    let n2 = b"nonce-0002";
    let e2 = tpm.quote(n2).unwrap();
    authentic(&id.ak_public, &e2, n2).unwrap();
    match verify(&reference, &e2, n2) {
        Err(AttestError::Changed { name, .. }) => assert_eq!(name, "tessera-binary"),
        other => panic!("a changed binary must fail: {other:?}"),
    }
    // A changed configuration.
    tpm.measure(&log(b"tessera 1", b"config 2")).unwrap();
    let e3 = tpm.quote(b"n3").unwrap();
    let err = verify(&reference, &e3, b"n3").unwrap_err();
    assert!(
        matches!(&err, AttestError::Changed { name, .. } if name == "node-config"),
        "{err}"
    );
    // Something extra measured, something left out.
    let mut more = log(b"tessera 1", b"config 1");
    more.push(Measurement::of("guest-kernel", b"vmlinuz"));
    tpm.measure(&more).unwrap();
    let e4 = tpm.quote(b"n4").unwrap();
    assert!(matches!(
        verify(&reference, &e4, b"n4"),
        Err(AttestError::Unapproved { .. })
    ));
    tpm.measure(&log(b"tessera 1", b"config 1")[..2]).unwrap();
    let e5 = tpm.quote(b"n5").unwrap();
    assert!(matches!(
        verify(&reference, &e5, b"n5"),
        Err(AttestError::Missing(n)) if n == "node-config"
    ));
    // Back to the approved state: attested again.
    tpm.measure(&log(b"tessera 1", b"config 1")).unwrap();
    let e6 = tpm.quote(b"n6").unwrap();
    verify(&reference, &e6, b"n6").unwrap();
}

#[test]
fn forged_replayed_and_doctored_quotes_are_refused() {
    let Some((_sw, tpm, _d)) = swtpm() else {
        return;
    };
    let id = tpm.identity().unwrap();
    tpm.measure(&log(b"tessera 1", b"config 1")).unwrap();
    let e = tpm.quote(b"old nonce").unwrap();
    let reference = Reference::approving(&id.ak_public, &e);

    // Replayed: a genuine quote answering an earlier challenge.
    let err = verify(&reference, &e, b"new nonce").unwrap_err();
    assert!(matches!(err, AttestError::Nonce { .. }), "{err}");
    assert!(err.to_string().contains("replayed"), "{err}");

    // Forged: one byte of the signed structure changed (here: the nonce inside it).
    let mut forged = e.clone();
    let at = forged
        .quote
        .find(&tessera_node::attest::hex(b"old nonce"))
        .unwrap();
    forged.quote.replace_range(at..at + 2, "00");
    assert_eq!(
        verify(&reference, &forged, b"old nonce").unwrap_err(),
        AttestError::Signature
    );
    // A signature from another TPM's key.
    let Some((_sw2, other, _d2)) = swtpm() else {
        return;
    };
    other.identity().unwrap();
    other.measure(&log(b"tessera 1", b"config 1")).unwrap();
    let theirs = other.quote(b"old nonce").unwrap();
    assert_eq!(
        verify(&reference, &theirs, b"old nonce").unwrap_err(),
        AttestError::Signature
    );

    // Doctored PCR value (to hide a change): does not hash to the signed digest.
    let mut doctored = e.clone();
    doctored.pcrs.insert(0, "11".repeat(32));
    assert_eq!(
        verify(&reference, &doctored, b"old nonce").unwrap_err(),
        AttestError::PcrDigest
    );
    // Doctored event log (a changed digest reported as the approved one).
    tpm.measure(&log(b"tessera 2 (patched)", b"config 1"))
        .unwrap();
    let mut lying = tpm.quote(b"n").unwrap();
    lying.log[0] = Measurement::of("tessera-binary", b"tessera 1");
    let err = verify(&reference, &lying, b"n").unwrap_err();
    assert!(matches!(err, AttestError::LogReplay { .. }), "{err}");
}
