//! `tessera template …`: build, check, register, list and remove templates, and their
//! signatures (keygen, sign, attach, manifest, verify against a trust policy).

use clap::{Args, Subcommand};
use serde::Serialize;

use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE, fail, print_json};

#[derive(Debug, Subcommand)]
pub enum TemplateCommand {
    /// Build a template directory: unpack an OCI image layout, or run debootstrap.
    Build(TemplateBuildArgs),
    /// Check that a directory can serve as a template (a folder with bin/sh).
    Check {
        /// The template directory.
        dir: std::path::PathBuf,
    },
    /// Register a template with the server on this machine (copied into its data
    /// folder, content-addressed): tenants then name it (`NAME` or
    /// `NAME@sha256:<hex>`) for sandboxes, agent runtimes and jobs.
    Import(TemplateImportArgs),
    /// List the registered templates.
    List(TemplateListArgs),
    /// Unregister a template name (sandboxes already made from it keep running).
    Rm {
        #[command(flatten)]
        at: RegistryArgs,
        /// The template's name.
        name: String,
    },
    /// Make a signing key pair: PREFIX.key (PKCS#8 PEM, 0600) and PREFIX.pub (the
    /// public key a trust policy names).
    Keygen(KeygenArgs),
    /// Sign a registered template (its manifest) with a key and attach the Sigstore
    /// bundle to its digest.
    Sign(SignArgs),
    /// Attach a Sigstore bundle made elsewhere (`cosign sign-blob --bundle B` over the
    /// output of `tessera template manifest NAME`).
    Attach(AttachArgs),
    /// Print the manifest a template's digest is taken over: what a signature signs.
    Manifest {
        #[command(flatten)]
        at: RegistryArgs,
        /// `NAME` or `NAME@sha256:<hex>`.
        name: String,
    },
    /// Check a template against a trust policy file, as the server does at every start.
    Verify(VerifyArgs),
}

#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Write PREFIX.key and PREFIX.pub (neither may exist).
    #[arg(long, value_name = "PREFIX")]
    pub out: std::path::PathBuf,
    /// An Ed25519 key instead of ECDSA P-256 (cosign's default).
    #[arg(long)]
    pub ed25519: bool,
}

#[derive(Debug, Args)]
pub struct SignArgs {
    #[command(flatten)]
    pub at: RegistryArgs,
    /// A PKCS#8 PEM private key (`tessera template keygen`, `openssl genpkey`).
    #[arg(long, value_name = "FILE")]
    pub key: std::path::PathBuf,
    /// Also write the bundle here.
    #[arg(long, value_name = "FILE")]
    pub output: Option<std::path::PathBuf>,
    /// `NAME` or `NAME@sha256:<hex>`.
    pub name: String,
}

#[derive(Debug, Args)]
pub struct AttachArgs {
    #[command(flatten)]
    pub at: RegistryArgs,
    /// `NAME` or `NAME@sha256:<hex>`.
    pub name: String,
    /// The bundle (JSON).
    pub bundle: std::path::PathBuf,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub at: RegistryArgs,
    /// The trust policy (YAML; see docs/trust.md).
    #[arg(long, value_name = "FILE")]
    pub policy: std::path::PathBuf,
    /// The tenant the workload is for.
    #[arg(long, default_value = "default")]
    pub tenant: String,
    /// The runtime class it runs in.
    #[arg(long, default_value = tessera_sandbox::class::DEFAULT_CLASS)]
    pub runtime_class: String,
    /// Print one JSON document.
    #[arg(long)]
    pub json: bool,
    /// `NAME` or `NAME@sha256:<hex>`.
    pub name: String,
}

/// Where the registry is: the server's data folder, or its `--templates DIR`.
#[derive(Debug, Args)]
pub struct RegistryArgs {
    /// The server's data folder (`tessera up --data`); the registry is DATA/templates.
    #[arg(long, value_name = "DIR")]
    pub data: Option<std::path::PathBuf>,
    /// The registry folder itself (`tessera up --templates`), instead of DATA/templates.
    #[arg(long, value_name = "DIR", conflicts_with = "data")]
    pub templates: Option<std::path::PathBuf>,
}

impl RegistryArgs {
    fn open(&self) -> Result<tessera_sandbox::TemplateRegistry, String> {
        let dir = match (&self.templates, &self.data) {
            (Some(t), _) => t.clone(),
            (None, Some(d)) => d.join("templates"),
            (None, None) => crate::cmd::up::default_data_dir().join("templates"),
        };
        tessera_sandbox::TemplateRegistry::open(&dir).map_err(|e| e.to_string())
    }
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("from").required(true).args(["dir", "oci"])))]
pub struct TemplateImportArgs {
    /// The template's name: 1 to 63 of a-z, 0-9, '.', '_', '-'.
    #[arg(long)]
    pub name: String,
    /// An OCI image layout directory to unpack (instead of a root folder).
    #[arg(long, value_name = "LAYOUT")]
    pub oci: Option<std::path::PathBuf>,
    /// With --oci: the image's name in the layout.
    #[arg(long = "ref", value_name = "NAME", requires = "oci")]
    pub reference: Option<String>,
    #[command(flatten)]
    pub at: RegistryArgs,
    /// Print one JSON document.
    #[arg(long)]
    pub json: bool,
    /// A root folder (from `tessera template build`, debootstrap, an unpacked image).
    pub dir: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct TemplateListArgs {
    #[command(flatten)]
    pub at: RegistryArgs,
    #[command(flatten)]
    pub out: super::client::Out,
    /// The same as `-o json` (kept for scripts written before `-o`).
    #[arg(long, hide = true)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["oci", "debootstrap", "kernel"])))]
pub struct TemplateBuildArgs {
    /// An OCI image layout directory (index.json, blobs/), e.g. from
    /// `skopeo copy docker://debian:stable oci:DIR:stable` or `docker buildx --output type=oci`.
    #[arg(long, value_name = "LAYOUT")]
    pub oci: Option<std::path::PathBuf>,
    /// With --oci: the image's name in the layout (its `org.opencontainers.image.ref.name`,
    /// e.g. `stable`); needed when the layout holds several.
    #[arg(long = "ref", value_name = "NAME", requires = "oci")]
    pub reference: Option<String>,
    /// Build a Debian-family root with `debootstrap --variant=minbase SUITE` (root and
    /// the debootstrap tool needed).
    #[arg(long, value_name = "SUITE")]
    pub debootstrap: Option<String>,
    /// With --debootstrap: the mirror to use (default: debootstrap's).
    #[arg(long, value_name = "URL", requires = "debootstrap")]
    pub mirror: Option<String>,
    /// A micro-VM kernel template instead (for `tessera up --vm-kernel DIR` and
    /// `tessera sandbox run --runtime-class isolated --vm-kernel DIR`), from a kernel
    /// package: Debian's `linux-image-cloud-amd64` `.deb`, or the folder `dpkg-deb -x`
    /// made of it (`boot/vmlinuz-*`, `lib/modules/VERSION/`). Needs `dpkg-deb` for a
    /// `.deb`.
    #[arg(long, value_name = "DEB|DIR")]
    pub kernel: Option<std::path::PathBuf>,
    /// Print one JSON document.
    #[arg(long)]
    pub json: bool,
    /// The new template directory (must not exist, or be empty).
    pub dir: std::path::PathBuf,
}

/// `tessera template …`.
pub fn template(c: TemplateCommand) -> i32 {
    use tessera_sandbox::template as t;
    match c {
        TemplateCommand::Check { dir } => match t::check_dir(&dir) {
            Ok(()) => {
                println!("{}: usable as a template", dir.display());
                0
            }
            Err(e) => fail(EXIT_BAD_INPUT, e),
        },
        TemplateCommand::Import(a) => {
            let reg = match a.at.open() {
                Ok(r) => r,
                Err(e) => return fail(EXIT_FAILURE, e),
            };
            let res = match (&a.oci, &a.dir) {
                (Some(layout), _) => {
                    eprintln!(
                        "unpacking {} into {}",
                        layout.display(),
                        reg.root().display()
                    );
                    let opts = t::OciOptions {
                        reference: a.reference.clone(),
                        ..Default::default()
                    };
                    reg.import_oci(&a.name, layout, &opts)
                }
                (None, Some(dir)) => {
                    eprintln!("copying {} into {}", dir.display(), reg.root().display());
                    reg.import_dir(&a.name, dir)
                }
                (None, None) => return fail(EXIT_BAD_INPUT, "give a root folder or --oci LAYOUT"),
            };
            match res {
                Ok(r) if a.json => print_json(&r),
                Ok(r) => {
                    println!(
                        "registered {}@{} ({} files, {} bytes)",
                        r.name, r.digest, r.files, r.bytes
                    );
                    println!(
                        "tenants name it as \"template\": \"{}\" (or pinned: \"{}@{}\")",
                        r.name, r.name, r.digest
                    );
                    0
                }
                Err(e @ tessera_sandbox::RegistryError::BadReference { .. }) => {
                    fail(EXIT_BAD_INPUT, format!("--name: {e}"))
                }
                Err(e) => fail(EXIT_FAILURE, e),
            }
        }
        TemplateCommand::List(a) => {
            let list = match a
                .at
                .open()
                .and_then(|r| r.list().map_err(|e| e.to_string()))
            {
                Ok(l) => l,
                Err(e) => return fail(EXIT_FAILURE, e),
            };
            let format = if a.json {
                super::client::Format::Json
            } else {
                a.out.format
            };
            let v = match serde_json::to_value(&list) {
                Ok(v) => v,
                Err(e) => return fail(EXIT_FAILURE, e),
            };
            let table = |_: &serde_json::Value| {
                let mut t = format!(
                    "{:<24} {:<73} {:>8} {:>12}  SOURCE\n{:<24} {:<73} {:>8} {:>12}  built in: the host's /usr\n",
                    "NAME", "DIGEST", "FILES", "BYTES", "host", "host", "-", "-"
                );
                for r in &list {
                    t.push_str(&format!(
                        "{:<24} {:<73} {:>8} {:>12}  {}\n",
                        r.name, r.digest, r.files, r.bytes, r.source
                    ));
                }
                t
            };
            super::client::finish(super::client::show(&v, format, table))
        }
        TemplateCommand::Rm { at, name } => match at
            .open()
            .and_then(|r| r.remove(&name).map_err(|e| e.to_string()))
        {
            Ok(true) => {
                println!("removed {name}");
                0
            }
            Ok(false) => fail(
                EXIT_BAD_INPUT,
                format!("no template {name:?} is registered"),
            ),
            Err(e) => fail(EXIT_FAILURE, e),
        },
        TemplateCommand::Keygen(a) => keygen(&a),
        TemplateCommand::Sign(a) => sign(&a),
        TemplateCommand::Attach(a) => attach(&a),
        TemplateCommand::Manifest { at, name } => {
            match at.open().and_then(|r| {
                let rec = r.record(&name).map_err(|e| e.to_string())?;
                r.manifest(&rec.digest).map_err(|e| e.to_string())
            }) {
                Ok(m) => {
                    use std::io::Write as _;
                    let mut out = std::io::stdout().lock();
                    match out.write_all(&m).and_then(|()| out.flush()) {
                        Ok(()) => 0,
                        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
                        Err(e) => fail(EXIT_FAILURE, e),
                    }
                }
                Err(e) => fail(EXIT_FAILURE, e),
            }
        }
        TemplateCommand::Verify(a) => verify(&a),
        TemplateCommand::Build(a) => {
            #[derive(Serialize)]
            struct Out {
                dir: String,
                source: String,
                manifest_digest: Option<String>,
                layers: Option<usize>,
                bytes: Option<u64>,
                env: Vec<String>,
            }
            let dir = a.dir.display().to_string();
            if let Some(src) = &a.kernel {
                return kernel_template(src, &a.dir, a.json);
            }
            let out = if let Some(layout) = &a.oci {
                let opts = t::OciOptions {
                    reference: a.reference.clone(),
                    ..Default::default()
                };
                eprintln!("unpacking {} into {dir}", layout.display());
                match t::unpack_oci_layout(layout, &a.dir, &opts) {
                    Ok(img) => Out {
                        dir,
                        source: format!("oci:{}", layout.display()),
                        manifest_digest: Some(img.manifest_digest),
                        layers: Some(img.layers),
                        bytes: Some(img.bytes),
                        env: img.env,
                    },
                    Err(e) => return fail(EXIT_FAILURE, e),
                }
            } else if let Some(suite) = &a.debootstrap {
                eprintln!("debootstrap --variant=minbase {suite} {dir} (this downloads packages)");
                match t::debootstrap(suite, &a.dir, a.mirror.as_deref()) {
                    Ok(()) => Out {
                        dir,
                        source: format!("debootstrap:{suite}"),
                        manifest_digest: None,
                        layers: None,
                        bytes: None,
                        env: Vec::new(),
                    },
                    Err(e) => return fail(EXIT_FAILURE, e),
                }
            } else {
                return fail(EXIT_BAD_INPUT, "give --oci LAYOUT or --debootstrap SUITE");
            };
            if a.json {
                return print_json(&out);
            }
            println!("template ready: {}", out.dir);
            println!(
                "use it with: tessera sandbox run --template {} -- CMD",
                out.dir
            );
            if let Err(e) = t::check_dir(&a.dir) {
                eprintln!("note: {e}");
            }
            0
        }
    }
}

/// `tessera template build --kernel SRC DIR`.
fn kernel_template(src: &std::path::Path, dir: &std::path::Path, json: bool) -> i32 {
    eprintln!(
        "building a micro-VM kernel template from {} into {}",
        src.display(),
        dir.display()
    );
    match tessera_sandbox::vm::image::build_kernel_template(src, dir) {
        Ok(k) if json => print_json(&serde_json::json!({
            "dir": k.dir.display().to_string(),
            "source": k.info.source,
            "kernel_version": k.info.version,
            "modules": k.info.modules,
        })),
        Ok(k) => {
            println!(
                "kernel template ready: {} (guest kernel {}, {} modules)",
                k.dir.display(),
                k.info.version,
                k.info.modules.len()
            );
            println!(
                "use it with: tessera up --vm-kernel {0}   or   tessera sandbox run --runtime-class isolated --vm-kernel {0} -- CMD",
                k.dir.display()
            );
            0
        }
        Err(e) => fail(EXIT_FAILURE, e),
    }
}

fn write_new(path: &std::path::Path, data: &[u8], mode: u32) -> Result<(), String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .and_then(|mut f| f.write_all(data))
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn keygen(a: &KeygenArgs) -> i32 {
    use tessera_sandbox::trust::{KeyKind, generate_key};
    let kind = if a.ed25519 {
        KeyKind::Ed25519
    } else {
        KeyKind::P256
    };
    let (private, public) = match generate_key(kind) {
        Ok(k) => k,
        Err(e) => return fail(EXIT_FAILURE, e),
    };
    let with = |ext: &str| {
        let mut p = a.out.clone().into_os_string();
        p.push(ext);
        std::path::PathBuf::from(p)
    };
    let (k, p) = (with(".key"), with(".pub"));
    if let Err(e) = write_new(&k, private.as_bytes(), 0o600) {
        return fail(EXIT_FAILURE, e);
    }
    if let Err(e) = write_new(&p, public.as_bytes(), 0o644) {
        let _ = std::fs::remove_file(&k);
        return fail(EXIT_FAILURE, e);
    }
    println!("private key: {} (keep it secret)", k.display());
    println!("public key:  {} (name it in the trust policy)", p.display());
    0
}

fn sign(a: &SignArgs) -> i32 {
    let text = match std::fs::read_to_string(&a.key) {
        Ok(t) => t,
        Err(e) => return fail(EXIT_BAD_INPUT, format!("--key {}: {e}", a.key.display())),
    };
    let key = match tessera_sandbox::trust::SigningKey::from_pem(&text) {
        Ok(k) => k,
        Err(e) => return fail(EXIT_BAD_INPUT, format!("--key {}: {e}", a.key.display())),
    };
    let reg = match a.at.open() {
        Ok(r) => r,
        Err(e) => return fail(EXIT_FAILURE, e),
    };
    match reg.sign(&a.name, &key) {
        Ok((rec, file, json)) => {
            if let Some(out) = &a.output
                && let Err(e) = std::fs::write(out, json.as_bytes())
            {
                return fail(EXIT_FAILURE, format!("--output {}: {e}", out.display()));
            }
            println!("signed {}@{} ({file})", rec.name, rec.digest);
            0
        }
        Err(e) => fail(EXIT_FAILURE, e),
    }
}

fn attach(a: &AttachArgs) -> i32 {
    let text = match std::fs::read_to_string(&a.bundle) {
        Ok(t) => t,
        Err(e) => return fail(EXIT_BAD_INPUT, format!("{}: {e}", a.bundle.display())),
    };
    let reg = match a.at.open() {
        Ok(r) => r,
        Err(e) => return fail(EXIT_FAILURE, e),
    };
    match reg.attach(&a.name, &text) {
        Ok((rec, file)) => {
            println!(
                "attached {} to {}@{} ({file})",
                a.bundle.display(),
                rec.name,
                rec.digest
            );
            0
        }
        Err(e @ tessera_sandbox::RegistryError::Signature { .. }) => {
            fail(EXIT_BAD_INPUT, format!("{}: {e}", a.bundle.display()))
        }
        Err(e) => fail(EXIT_FAILURE, e),
    }
}

fn verify(a: &VerifyArgs) -> i32 {
    let policy = match tessera_sandbox::trust::TrustPolicy::load(&a.policy) {
        Ok(p) => p,
        Err(e) => return fail(EXIT_BAD_INPUT, e),
    };
    let reg = match a.at.open() {
        Ok(r) => r,
        Err(e) => return fail(EXIT_FAILURE, e),
    };
    let who = tessera_sandbox::trust::Subject::new(&a.tenant, &a.runtime_class);
    #[derive(Serialize)]
    struct Out<'a> {
        name: &'a str,
        digest: &'a str,
        admitted: bool,
        rules: &'a [String],
        signers: &'a [String],
        error: Option<String>,
    }
    match reg.verify(&policy, &a.name, &who) {
        Ok((rec, ok)) => {
            if a.json {
                return print_json(&Out {
                    name: &rec.name,
                    digest: &rec.digest,
                    admitted: true,
                    rules: &ok.rules,
                    signers: &ok.signers,
                    error: None,
                });
            }
            if ok.rules.is_empty() {
                println!(
                    "{}@{}: admitted: no rule of {} applies to tenant {:?} in class {:?}",
                    rec.name,
                    rec.digest,
                    policy.file(),
                    a.tenant,
                    a.runtime_class
                );
            } else {
                println!(
                    "{}@{}: admitted by rules {} (signed by {})",
                    rec.name,
                    rec.digest,
                    ok.rules.join(", "),
                    if ok.signers.is_empty() {
                        "-".to_string()
                    } else {
                        ok.signers.join(", ")
                    }
                );
            }
            0
        }
        Err(tessera_sandbox::RegistryError::Untrusted(t)) => {
            if a.json {
                print_json(&Out {
                    name: &t.name,
                    digest: &t.digest,
                    admitted: false,
                    rules: std::slice::from_ref(&t.rule),
                    signers: &[],
                    error: Some(t.to_string()),
                });
                return EXIT_FAILURE;
            }
            fail(EXIT_FAILURE, t)
        }
        Err(e) => fail(EXIT_FAILURE, e),
    }
}
