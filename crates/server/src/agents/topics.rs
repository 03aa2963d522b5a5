//! Event topics over HTTP: publish, read (JSON or server-sent events, from an offset
//! or a consumer's committed one), and consumers' offsets.

use super::*;

// ---- events ----

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReadQuery {
    #[serde(default)]
    after: Option<u64>,
    #[serde(default)]
    limit: Option<usize>,
    /// Wait this long for an event when none is there yet.
    #[serde(default)]
    wait_ms: Option<u64>,
    /// Start after this consumer's committed offset (when `after` is absent).
    #[serde(default)]
    consumer: Option<String>,
}
pub(super) async fn publish(
    State(a): State<App>,
    c: Caller,
    Path(t): Path<String>,
    Body(b): Body<Value>,
) -> R {
    c.require(Role::Developer)?;
    let off = events::publish(a.plane.store(), &c.tenant, &t, b, now_ms()).await?;
    created(json!({"topic": t, "offset": off}))
}
pub(super) async fn read_events(
    State(a): State<App>,
    c: Caller,
    Path(t): Path<String>,
    Q(q): Q<ReadQuery>,
    headers: HeaderMap,
) -> R {
    c.require(Role::Viewer)?;
    let st = a.plane.store().clone();
    let after = match (q.after, &q.consumer) {
        (Some(x), _) => x,
        (None, Some(cons)) => events::committed(&st, &c.tenant, &t, cons).await?,
        (None, None) => 0,
    };
    let limit = q.limit.unwrap_or(100);
    let sse = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    if sse {
        // Validate the name before streaming.
        events::last_offset(&st, &c.tenant, &t).await?;
        let tenant = c.tenant.clone();
        let plane = a.plane.clone();
        let s = stream::unfold((st, after), move |(st, after)| {
            let (tenant, t, plane) = (tenant.clone(), t.clone(), plane.clone());
            async move {
                loop {
                    match events::read_wait(
                        &st,
                        &tenant,
                        &t,
                        after,
                        limit,
                        std::time::Duration::from_secs(15),
                    )
                    .await
                    {
                        Ok(evs) if evs.is_empty() => continue,
                        Ok(evs) => {
                            let next = evs.last().map(|e| e.offset).unwrap_or(after);
                            let out: Vec<Result<Event, Infallible>> = evs
                                .iter()
                                .map(|e| {
                                    let v = plane.redact_value(
                                        &tenant,
                                        &format!("topic {t} event {}", e.offset),
                                        serde_json::to_value(e).unwrap_or_default(),
                                    );
                                    Ok(Event::default()
                                        .event("event")
                                        .id(e.offset.to_string())
                                        .data(v.to_string()))
                                })
                                .collect();
                            return Some((stream::iter(out), (st, next)));
                        }
                        Err(_) => return None,
                    }
                }
            }
        });
        use futures_util::StreamExt;
        return Ok(Sse::new(s.flatten())
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    let wait = std::time::Duration::from_millis(q.wait_ms.unwrap_or(0).min(60_000));
    let evs = events::read_wait(&st, &c.tenant, &t, after, limit, wait).await?;
    let at = format!("topic {t} events");
    items(
        evs.iter()
            .map(|x| Ok(a.plane.redact_value(&c.tenant, &at, to_v(x)?)))
            .collect::<Result<_, ApiError>>()?,
    )
}
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct OffsetBody {
    offset: u64,
}
pub(super) async fn commit_offset(
    State(a): State<App>,
    c: Caller,
    Path((t, cons)): Path<(String, String)>,
    Body(b): Body<OffsetBody>,
) -> R {
    c.require(Role::Developer)?;
    let o = events::commit_offset(a.plane.store(), &c.tenant, &t, &cons, b.offset).await?;
    ok(json!({"topic": t, "consumer": cons, "offset": o}))
}
pub(super) async fn get_offset(
    State(a): State<App>,
    c: Caller,
    Path((t, cons)): Path<(String, String)>,
) -> R {
    c.require(Role::Viewer)?;
    let o = events::committed(a.plane.store(), &c.tenant, &t, &cons).await?;
    ok(json!({"topic": t, "consumer": cons, "offset": o}))
}
