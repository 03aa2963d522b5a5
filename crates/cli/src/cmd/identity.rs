//! `tessera tenant …` (system admins), `tessera user …`, `tessera serviceaccount …`
//! and `tessera apikey …`: tenants, the subjects of your tenant, their roles and
//! their keys.

use clap::Subcommand;
use reqwest::Method;
use serde_json::{Value, json};

use super::client::{
    Client, Failure, Out, cell, finish, items, json_body, show, table, tokio_runtime,
};

#[derive(Debug, Subcommand)]
pub enum TenantCommand {
    /// Create a tenant and its first admin key, printed once (system admins only).
    Create {
        name: String,
        #[command(flatten)]
        out: Out,
    },
    /// List tenants: every tenant for a system admin, else your own.
    List {
        #[command(flatten)]
        out: Out,
    },
    /// Show one tenant.
    Get {
        name: String,
        #[command(flatten)]
        out: Out,
    },
}

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Create a user (its name is the subject its keys and tokens act as).
    Create {
        name: String,
        /// Bind this role too: viewer, developer, operator or admin.
        #[arg(long)]
        role: Option<String>,
        #[arg(long)]
        display_name: Option<String>,
        #[command(flatten)]
        out: Out,
    },
    /// List users with their roles.
    List {
        #[command(flatten)]
        out: Out,
    },
    /// Show a user with its role and keys.
    Get {
        name: String,
        #[command(flatten)]
        out: Out,
    },
    /// Delete a user: its role binding goes and its keys are revoked.
    Delete {
        name: String,
        #[command(flatten)]
        out: Out,
    },
}

#[derive(Debug, Subcommand)]
pub enum ServiceAccountCommand {
    /// Create a service account (it acts as the subject sa:NAME).
    Create {
        name: String,
        /// Bind this role too: viewer, developer, operator or admin.
        #[arg(long)]
        role: Option<String>,
        #[arg(long)]
        description: Option<String>,
        #[command(flatten)]
        out: Out,
    },
    /// List service accounts with their roles.
    List {
        #[command(flatten)]
        out: Out,
    },
    /// Show a service account with its role and keys.
    Get {
        name: String,
        #[command(flatten)]
        out: Out,
    },
    /// Delete a service account: its role binding goes and its keys are revoked.
    Delete {
        name: String,
        #[command(flatten)]
        out: Out,
    },
}

#[derive(Debug, Subcommand)]
pub enum ApiKeyCommand {
    /// Create a key for a subject (a user, or sa:NAME for a service account);
    /// the key is printed once.
    Create {
        subject: String,
        /// Bind this role to the subject too.
        #[arg(long)]
        role: Option<String>,
        /// Seconds until the key stops working.
        #[arg(long, value_name = "SECONDS")]
        expires_in: Option<u64>,
        #[command(flatten)]
        out: Out,
    },
    /// List the tenant's keys (never their secrets).
    List {
        #[command(flatten)]
        out: Out,
    },
    /// Revoke a key by its id.
    Revoke {
        id: String,
        #[command(flatten)]
        out: Out,
    },
}

fn subject_table(v: &Value) -> String {
    let rows = items(v)
        .iter()
        .map(|s| {
            let keys = s["keys"]
                .as_array()
                .map_or("-".to_string(), |k| k.len().to_string());
            vec![
                cell(&s["name"]),
                cell(&s["subject"]),
                cell(&s["role"]),
                keys,
                cell(&s["created_by"]),
            ]
        })
        .collect();
    table(&["NAME", "SUBJECT", "ROLE", "KEYS", "CREATED BY"], rows)
}

fn key_table(v: &Value) -> String {
    let rows = items(v)
        .iter()
        .map(|k| {
            vec![
                cell(&k["id"]),
                cell(&k["subject"]),
                if k["revoked"] == true {
                    "revoked".into()
                } else {
                    "active".into()
                },
                crate::output::time_cell(&k["expires_at"], 1),
            ]
        })
        .collect();
    let mut out = table(&["ID", "SUBJECT", "STATE", "EXPIRES"], rows);
    if let Some(key) = v["key"].as_str() {
        out.push_str(&format!("\nKEY (shown only now): {key}\n"));
    }
    out
}

fn tenant_table(v: &Value) -> String {
    let rows = items(v)
        .iter()
        .map(|t| {
            vec![
                cell(&t["name"]),
                if t["system"] == true { "system" } else { "-" }.into(),
                crate::output::time_cell(&t["created_at"], 1000),
            ]
        })
        .collect();
    let mut out = table(&["NAME", "SYSTEM", "CREATED"], rows);
    if let Some(key) = v["admin_key"].as_str() {
        out.push_str(&format!(
            "\nADMIN KEY of {} (shown only now): {key}\n",
            cell(&v["name"])
        ));
    }
    out
}

fn run(f: impl AsyncFnOnce(Client) -> Result<i32, Failure>) -> i32 {
    finish((|| {
        let client = Client::from_env()?;
        tokio_runtime()?.block_on(f(client))
    })())
}

pub fn tenant(c: TenantCommand) -> i32 {
    run(async move |client: Client| match c {
        TenantCommand::Create { name, out } => {
            let b = json_body(json!({ "name": name }));
            let v = client.call(Method::POST, "/v1/tenants", b).await?;
            show(&v, out.format, tenant_table)
        }
        TenantCommand::List { out } => {
            let v = client.call(Method::GET, "/v1/tenants", None).await?;
            show(&v, out.format, tenant_table)
        }
        TenantCommand::Get { name, out } => {
            let v = client
                .call(Method::GET, &format!("/v1/tenants/{name}"), None)
                .await?;
            show(&v, out.format, tenant_table)
        }
    })
}

pub fn user(c: UserCommand) -> i32 {
    run(async move |client: Client| match c {
        UserCommand::Create {
            name,
            role,
            display_name,
            out,
        } => {
            let b = json_body(json!({"name": name, "role": role, "display_name": display_name}));
            let v = client.call(Method::POST, "/v1/users", b).await?;
            show(&v, out.format, subject_table)
        }
        UserCommand::List { out } => {
            let v = client.call(Method::GET, "/v1/users", None).await?;
            show(&v, out.format, subject_table)
        }
        UserCommand::Get { name, out } => {
            let v = client
                .call(Method::GET, &format!("/v1/users/{name}"), None)
                .await?;
            show(&v, out.format, subject_table)
        }
        UserCommand::Delete { name, out } => {
            let v = client
                .call(Method::DELETE, &format!("/v1/users/{name}"), None)
                .await?;
            show(&v, out.format, subject_table)
        }
    })
}

pub fn service_account(c: ServiceAccountCommand) -> i32 {
    run(async move |client: Client| match c {
        ServiceAccountCommand::Create {
            name,
            role,
            description,
            out,
        } => {
            let b = json_body(json!({"name": name, "role": role, "description": description}));
            let v = client.call(Method::POST, "/v1/serviceaccounts", b).await?;
            show(&v, out.format, subject_table)
        }
        ServiceAccountCommand::List { out } => {
            let v = client
                .call(Method::GET, "/v1/serviceaccounts", None)
                .await?;
            show(&v, out.format, subject_table)
        }
        ServiceAccountCommand::Get { name, out } => {
            let v = client
                .call(Method::GET, &format!("/v1/serviceaccounts/{name}"), None)
                .await?;
            show(&v, out.format, subject_table)
        }
        ServiceAccountCommand::Delete { name, out } => {
            let v = client
                .call(Method::DELETE, &format!("/v1/serviceaccounts/{name}"), None)
                .await?;
            show(&v, out.format, subject_table)
        }
    })
}

pub fn api_key(c: ApiKeyCommand) -> i32 {
    run(async move |client: Client| match c {
        ApiKeyCommand::Create {
            subject,
            role,
            expires_in,
            out,
        } => {
            let b = json_body(
                json!({"subject": subject, "role": role, "expires_in_seconds": expires_in}),
            );
            let v = client.call(Method::POST, "/v1/apikeys", b).await?;
            show(&v, out.format, key_table)
        }
        ApiKeyCommand::List { out } => {
            let v = client.call(Method::GET, "/v1/apikeys", None).await?;
            show(&v, out.format, key_table)
        }
        ApiKeyCommand::Revoke { id, out } => {
            let v = client
                .call(Method::DELETE, &format!("/v1/apikeys/{id}"), None)
                .await?;
            show(&v, out.format, key_table)
        }
    })
}
