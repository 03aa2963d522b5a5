//! Leader election on a `coordination.k8s.io/v1` Lease.
//!
//! One replica holds the lease and renews it every `retry_period`. It counts
//! itself leader only until `renew_deadline` after the *start* of its last
//! successful renewal, and every write it makes carries a timeout of
//! `lease_duration - renew_deadline`. Another replica takes the lease only after
//! it has seen the same lease record, unchanged, for a full `lease_duration` on
//! its own clock, which starts after that renewal was written. So a replica that
//! loses the lease has stopped writing before another starts (clock *rates*
//! must agree to within the margin, as in client-go's leader election).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;

/// Where the lease lives and how it is timed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This replica's identity (pod name, or host name and process id).
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        LeaseConfig {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// The longest a write may take (it must land before another replica can lead).
    pub fn write_timeout(&self) -> Duration {
        self.lease_duration
            .saturating_sub(self.renew_deadline)
            .max(Duration::from_millis(100))
    }
}

/// Whether this replica may write now. Cheap to clone and check.
#[derive(Debug, Clone)]
pub struct Leadership {
    valid_until: Arc<Mutex<Option<Instant>>>,
}

impl Leadership {
    /// A leadership that never expires (single replica, no election).
    pub fn always() -> Self {
        Leadership {
            valid_until: Arc::new(Mutex::new(Some(
                Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600),
            ))),
        }
    }

    fn new() -> Self {
        Leadership {
            valid_until: Arc::new(Mutex::new(None)),
        }
    }

    pub fn is_leader(&self) -> bool {
        let g = self.valid_until.lock().unwrap_or_else(|p| p.into_inner());
        g.is_some_and(|t| Instant::now() < t)
    }

    fn extend(&self, until: Instant) {
        let mut g = self.valid_until.lock().unwrap_or_else(|p| p.into_inner());
        *g = Some(until);
    }

    fn revoke(&self) {
        let mut g = self.valid_until.lock().unwrap_or_else(|p| p.into_inner());
        *g = None;
    }
}

/// The lease record last seen held by another replica, and when it was first seen.
#[derive(Debug, Default)]
struct Observed {
    record: Option<(String, String, String)>,
    since: Option<Instant>,
}

fn now_micro() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// One attempt to take or renew the lease. `Ok(true)`: held now.
async fn try_once(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
    observed: &mut Observed,
) -> Result<bool, kube::Error> {
    let secs = cfg.lease_duration.as_secs().max(1) as i32;
    let Some(mut lease) = api.get_opt(&cfg.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(cfg.name.clone()),
                namespace: Some(cfg.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(cfg.identity.clone()),
                lease_duration_seconds: Some(secs),
                acquire_time: Some(now_micro()),
                renew_time: Some(now_micro()),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder != cfg.identity && !holder.is_empty() {
        let record = (
            holder.clone(),
            spec.renew_time
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default(),
            lease.metadata.resource_version.clone().unwrap_or_default(),
        );
        let now = Instant::now();
        if observed.record.as_ref() != Some(&record) {
            observed.record = Some(record);
            observed.since = Some(now);
            return Ok(false);
        }
        let duration = spec
            .lease_duration_seconds
            .map(|s| Duration::from_secs(s.max(1) as u64))
            .unwrap_or(cfg.lease_duration)
            .max(cfg.lease_duration);
        if observed
            .since
            .is_some_and(|s| now.duration_since(s) < duration)
        {
            return Ok(false);
        }
    }
    let taking = holder != cfg.identity;
    let mut spec = spec;
    if taking {
        spec.acquire_time = Some(now_micro());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.holder_identity = Some(cfg.identity.clone());
    spec.lease_duration_seconds = Some(secs);
    spec.renew_time = Some(now_micro());
    lease.spec = Some(spec);
    // `replace` carries the resourceVersion read above: a concurrent change conflicts.
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Waits until this replica holds the lease, then keeps renewing it in a
/// background task. The returned [`Leadership`] turns false for good once a
/// renewal deadline passes without a renewal.
pub async fn acquire(
    client: kube::Client,
    cfg: LeaseConfig,
) -> (Leadership, tokio::task::JoinHandle<()>) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let leadership = Leadership::new();
    let mut observed = Observed::default();
    loop {
        let start = Instant::now();
        match tokio::time::timeout(cfg.write_timeout(), try_once(&api, &cfg, &mut observed)).await {
            Ok(Ok(true)) => {
                leadership.extend(start + cfg.renew_deadline);
                break;
            }
            Ok(Ok(false)) => {}
            Ok(Err(e)) => eprintln!("tessera-k8s: lease {}: {e}", cfg.name),
            Err(_) => {}
        }
        tokio::time::sleep(cfg.retry_period).await;
    }
    let l = leadership.clone();
    let renew = tokio::spawn(async move {
        let mut observed = Observed::default();
        loop {
            tokio::time::sleep(cfg.retry_period).await;
            if !l.is_leader() {
                l.revoke();
                eprintln!(
                    "tessera-k8s: {} lost the lease {}; stopped writing",
                    cfg.identity, cfg.name
                );
                return;
            }
            let start = Instant::now();
            if let Ok(Ok(true)) =
                tokio::time::timeout(cfg.write_timeout(), try_once(&api, &cfg, &mut observed)).await
            {
                l.extend(start + cfg.renew_deadline);
            }
        }
    });
    (leadership, renew)
}

/// Gives the lease up (holder cleared) so that another replica takes over at
/// once instead of after the lease duration.
pub async fn release(client: kube::Client, cfg: &LeaseConfig) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    if let Ok(Some(mut lease)) = api.get_opt(&cfg.name).await
        && let Some(spec) = lease.spec.as_mut()
        && spec.holder_identity.as_deref() == Some(cfg.identity.as_str())
    {
        spec.holder_identity = None;
        let _ = api.replace(&cfg.name, &PostParams::default(), &lease).await;
    }
}
