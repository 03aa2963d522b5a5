//! Metering: usage records (model tokens, GPU seconds, sandbox CPU seconds and
//! memory GB-seconds, tool fees), priced against a price table and aggregated
//! per session, runtime and tenant; budgets per session and per tenant.
//!
//! Layout (store kinds, tenant-scoped):
//! - `usage`, name = `source_id`: one [`UsageRecord`] plus its `cost`. The
//!   source id makes recording idempotent: recording the same source twice
//!   counts once.
//! - `usage_total`, names `session/<id>`, `runtime/<name>/<shard>` and
//!   `tenant/<shard>`: running totals ([`Totals`]) written in the same commit
//!   as the record, so totals always equal the sum of the records. Runtime and
//!   tenant totals are split into [`SHARDS`] objects (by session) so that
//!   concurrent sessions do not all fight over one object.
//! - `price_table`, name `current`: the tenant's prices (else [`PriceTable::default`]).
//! - `budget`, name `tenant`: `{"max_cost": X}` for the whole tenant. A
//!   session's budget is the `budget.max_cost` field of its `session` object.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tessera_store::{Key, Op, Store, StoreError};

use crate::error::{AgentError, check_token};

pub const KIND_USAGE: &str = "usage";
pub const KIND_TOTAL: &str = "usage_total";
pub const KIND_PRICES: &str = "price_table";
pub const KIND_BUDGET: &str = "budget";
/// Runtime and tenant totals are split over this many objects.
pub const SHARDS: u64 = 16;

/// What was used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageKind {
    TokensIn,
    TokensOut,
    TokensCached,
    GpuSeconds,
    CpuSeconds,
    MemoryGbSeconds,
    /// A tool's fee, in the price table's currency per call (quantity = fee units).
    ToolFee,
}

impl UsageKind {
    pub const ALL: [UsageKind; 7] = [
        UsageKind::TokensIn,
        UsageKind::TokensOut,
        UsageKind::TokensCached,
        UsageKind::GpuSeconds,
        UsageKind::CpuSeconds,
        UsageKind::MemoryGbSeconds,
        UsageKind::ToolFee,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            UsageKind::TokensIn => "tokens_in",
            UsageKind::TokensOut => "tokens_out",
            UsageKind::TokensCached => "tokens_cached",
            UsageKind::GpuSeconds => "gpu_seconds",
            UsageKind::CpuSeconds => "cpu_seconds",
            UsageKind::MemoryGbSeconds => "memory_gb_seconds",
            UsageKind::ToolFee => "tool_fee",
        }
    }
}

/// One usage record, as producers send it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageRecord {
    pub tenant: String,
    pub session: String,
    pub runtime: String,
    pub kind: UsageKind,
    pub quantity: f64,
    pub at_ms: u64,
    /// Unique per real-world usage event (e.g. `<session>/<invocation>/tokens_in`).
    pub source_id: String,
}

/// Price per unit of each kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceTable {
    pub currency: String,
    pub prices: BTreeMap<UsageKind, f64>,
}

impl Default for PriceTable {
    fn default() -> Self {
        let prices = [
            (UsageKind::TokensIn, 3e-6),
            (UsageKind::TokensOut, 15e-6),
            (UsageKind::TokensCached, 0.3e-6),
            (UsageKind::GpuSeconds, 8e-4),
            (UsageKind::CpuSeconds, 2e-5),
            (UsageKind::MemoryGbSeconds, 3e-6),
            (UsageKind::ToolFee, 1.0),
        ]
        .into_iter()
        .collect();
        PriceTable {
            currency: "USD".into(),
            prices,
        }
    }
}

impl PriceTable {
    pub fn price(&self, k: UsageKind) -> f64 {
        self.prices.get(&k).copied().unwrap_or(0.0)
    }

    /// Checks every price is finite and not negative.
    pub fn validate(&self) -> Result<(), AgentError> {
        for (k, p) in &self.prices {
            if !p.is_finite() || *p < 0.0 {
                return Err(AgentError::invalid(
                    format!("prices.{}", k.as_str()),
                    format!("{p} is not a price: use a finite number >= 0"),
                ));
            }
        }
        Ok(())
    }
}

/// Running totals of one scope.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Totals {
    pub quantities: BTreeMap<UsageKind, f64>,
    pub cost: f64,
    pub records: u64,
}

impl Totals {
    fn add(&mut self, kind: UsageKind, quantity: f64, cost: f64) {
        *self.quantities.entry(kind).or_insert(0.0) += quantity;
        self.cost += cost;
        self.records += 1;
    }
    pub fn merge(&mut self, o: &Totals) {
        for (k, q) in &o.quantities {
            *self.quantities.entry(*k).or_insert(0.0) += q;
        }
        self.cost += o.cost;
        self.records += o.records;
    }
}

/// What [`record`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// False when this source id was recorded before (nothing counted twice).
    pub counted: bool,
    pub cost: f64,
    /// The session's totals after this record.
    pub session: Totals,
    /// Why the session must stop, when a budget is now spent.
    pub over_budget: Option<String>,
}

fn shard(session: &str) -> u64 {
    // FNV-1a: stable across processes and versions (unlike std's hasher).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in session.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h % SHARDS
}

fn totals_of(body: &Value) -> Totals {
    serde_json::from_value(body.clone()).unwrap_or_default()
}

/// The tenant's price table.
pub async fn prices<S: Store>(store: &S, tenant: &str) -> Result<PriceTable, AgentError> {
    match store.get(&Key::new(KIND_PRICES, tenant, "current")).await? {
        Some(o) => serde_json::from_value(o.body).map_err(|e| {
            AgentError::Store(StoreError::Backend(format!("price table of {tenant}: {e}")))
        }),
        None => Ok(PriceTable::default()),
    }
}

/// Replaces the tenant's price table (applies to records from now on).
pub async fn set_prices<S: Store>(
    store: &S,
    tenant: &str,
    t: &PriceTable,
) -> Result<(), AgentError> {
    t.validate()?;
    let key = Key::new(KIND_PRICES, tenant, "current");
    let body = serde_json::to_value(t).map_err(|e| AgentError::invalid("prices", e.to_string()))?;
    match store.get(&key).await? {
        Some(o) => store.update(key, Some(o.version), body).await?,
        None => store.create(key, body).await?,
    };
    Ok(())
}

/// Sets (or with `None` removes) the tenant's budget.
pub async fn set_tenant_budget<S: Store>(
    store: &S,
    tenant: &str,
    max_cost: Option<f64>,
) -> Result<(), AgentError> {
    if let Some(m) = max_cost {
        if !m.is_finite() || m < 0.0 {
            return Err(AgentError::invalid(
                "max_cost",
                format!("{m} is not a budget: use a number >= 0"),
            ));
        }
    }
    let key = Key::new(KIND_BUDGET, tenant, "tenant");
    let cur = store.get(&key).await?;
    match (cur, max_cost) {
        (Some(o), Some(m)) => drop(
            store
                .update(key, Some(o.version), json!({"max_cost": m}))
                .await?,
        ),
        (None, Some(m)) => drop(store.create(key, json!({"max_cost": m})).await?),
        (Some(o), None) => drop(store.delete(key, Some(o.version)).await?),
        (None, None) => {}
    }
    Ok(())
}

fn check_record(r: &UsageRecord) -> Result<(), AgentError> {
    check_token("tenant", &r.tenant, 128)?;
    check_token("session", &r.session, 128)?;
    check_token("runtime", &r.runtime, 128)?;
    if r.source_id.is_empty()
        || r.source_id.len() > 256
        || r.source_id.chars().any(char::is_control)
    {
        return Err(AgentError::invalid(
            "source_id",
            "must be 1 to 256 printable characters, unique per usage event",
        ));
    }
    if !r.quantity.is_finite() || r.quantity < 0.0 {
        return Err(AgentError::invalid(
            "quantity",
            format!("{} is not a quantity: use a finite number >= 0", r.quantity),
        ));
    }
    Ok(())
}

/// Records one usage event, once per `source_id`, and updates the session,
/// runtime and tenant totals in the same commit.
pub async fn record<S: Store>(store: &S, rec: UsageRecord) -> Result<Recorded, AgentError> {
    check_record(&rec)?;
    let prices = prices(store, &rec.tenant).await?;
    let cost = rec.quantity * prices.price(rec.kind);
    let t = rec.tenant.as_str();
    let ukey = Key::new(KIND_USAGE, t, rec.source_id.as_str());
    let sh = shard(&rec.session);
    let tkeys = [
        Key::new(KIND_TOTAL, t, format!("session/{}", rec.session)),
        Key::new(KIND_TOTAL, t, format!("runtime/{}/{sh:02}", rec.runtime)),
        Key::new(KIND_TOTAL, t, format!("tenant/{sh:02}")),
    ];
    let mut body =
        serde_json::to_value(&rec).map_err(|e| AgentError::invalid("usage", e.to_string()))?;
    body["cost"] = json!(cost);
    body["currency"] = json!(prices.currency);
    for attempt in 0..400u32 {
        if let Some(o) = store.get(&ukey).await? {
            // Already counted: report the session's totals, count nothing.
            let _ = o;
            let session = session_totals(store, t, &rec.session).await?;
            return Ok(Recorded {
                counted: false,
                cost,
                over_budget: None,
                session,
            });
        }
        let mut ops = vec![Op::Create {
            key: ukey.clone(),
            body: body.clone(),
        }];
        let mut session_after = Totals::default();
        for (i, k) in tkeys.iter().enumerate() {
            let cur = store.get(k).await?;
            let mut tot = cur.as_ref().map(|o| totals_of(&o.body)).unwrap_or_default();
            tot.add(rec.kind, rec.quantity, cost);
            if i == 0 {
                session_after = tot.clone();
            }
            let b = serde_json::to_value(&tot)
                .map_err(|e| AgentError::invalid("usage", e.to_string()))?;
            ops.push(match cur {
                Some(o) => Op::Update {
                    key: k.clone(),
                    expected: Some(o.version),
                    body: b,
                },
                None => Op::Create {
                    key: k.clone(),
                    body: b,
                },
            });
        }
        match store.commit(ops).await {
            Ok(_) => {
                let over_budget = budget_reason(store, t, &rec.session, &session_after).await?;
                return Ok(Recorded {
                    counted: true,
                    cost,
                    session: session_after,
                    over_budget,
                });
            }
            Err(StoreError::Conflict { .. } | StoreError::AlreadyExists(_)) => {
                let us = 100u64 * u64::from(attempt.min(50) + 1);
                tokio::time::sleep(std::time::Duration::from_micros(us)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(AgentError::Conflict(format!(
        "usage {:?}: too much contention on the totals; retry (recording is idempotent)",
        rec.source_id
    )))
}

/// The session's totals.
pub async fn session_totals<S: Store>(
    store: &S,
    tenant: &str,
    session: &str,
) -> Result<Totals, AgentError> {
    Ok(store
        .get(&Key::new(KIND_TOTAL, tenant, format!("session/{session}")))
        .await?
        .map(|o| totals_of(&o.body))
        .unwrap_or_default())
}

/// The runtime's totals (sum of its shards).
pub async fn runtime_totals<S: Store>(
    store: &S,
    tenant: &str,
    runtime: &str,
) -> Result<Totals, AgentError> {
    let mut t = Totals::default();
    for sh in 0..SHARDS {
        if let Some(o) = store
            .get(&Key::new(
                KIND_TOTAL,
                tenant,
                format!("runtime/{runtime}/{sh:02}"),
            ))
            .await?
        {
            t.merge(&totals_of(&o.body));
        }
    }
    Ok(t)
}

/// The tenant's totals (sum of its shards).
pub async fn tenant_totals<S: Store>(store: &S, tenant: &str) -> Result<Totals, AgentError> {
    let mut t = Totals::default();
    for sh in 0..SHARDS {
        if let Some(o) = store
            .get(&Key::new(KIND_TOTAL, tenant, format!("tenant/{sh:02}")))
            .await?
        {
            t.merge(&totals_of(&o.body));
        }
    }
    Ok(t)
}

/// Every usage record of the tenant (optionally of one session), oldest first.
/// This scans the tenant's records: for reports and audits, not hot paths.
pub async fn records<S: Store>(
    store: &S,
    tenant: &str,
    session: Option<&str>,
) -> Result<Vec<Value>, AgentError> {
    let mut v: Vec<Value> = store
        .list(KIND_USAGE, Some(tenant))
        .await?
        .objects
        .into_iter()
        .map(|o| o.body)
        .filter(|b| session.is_none_or(|s| b.get("session").and_then(Value::as_str) == Some(s)))
        .collect();
    v.sort_by_key(|b| b.get("at_ms").and_then(Value::as_u64).unwrap_or(0));
    Ok(v)
}

async fn budget_reason<S: Store>(
    store: &S,
    tenant: &str,
    session: &str,
    st: &Totals,
) -> Result<Option<String>, AgentError> {
    if let Some(o) = store.get(&Key::new("session", tenant, session)).await? {
        if let Some(max) = o.body.pointer("/budget/max_cost").and_then(Value::as_f64) {
            if st.cost > max {
                return Ok(Some(format!(
                    "session {session} spent {:.6} of its budget {max:.6}",
                    st.cost
                )));
            }
        }
    }
    if let Some(o) = store.get(&Key::new(KIND_BUDGET, tenant, "tenant")).await? {
        if let Some(max) = o.body.get("max_cost").and_then(Value::as_f64) {
            let tt = tenant_totals(store, tenant).await?;
            if tt.cost > max {
                return Ok(Some(format!(
                    "tenant {tenant} spent {:.6} of its budget {max:.6}",
                    tt.cost
                )));
            }
        }
    }
    Ok(None)
}

/// `Err(Budget)` when the session's or the tenant's budget is spent: checked
/// before every invocation and tool call.
pub async fn check_budget<S: Store>(
    store: &S,
    tenant: &str,
    session: &str,
) -> Result<(), AgentError> {
    let st = session_totals(store, tenant, session).await?;
    match budget_reason(store, tenant, session, &st).await? {
        Some(r) => Err(AgentError::Budget(r)),
        None => Ok(()),
    }
}
