//! A model of the ledger's protocol, checked with loom over every
//! interleaving of two gateway replicas racing on one idempotency key.
//!
//! The replicas run the gateway's steps (`ToolGateway::run` and `lead`: read the
//! entry, [`ledger::decide`], write `dispatched` with compare-and-swap, send,
//! record the outcome) against a model store that has the real store's
//! semantics for one key (create fails if it exists; update and delete
//! compare the version). The decisions are the real, pure
//! [`ledger::decide`]. Replica A may crash at each crash point of the
//! gateway; replica B's clock may be before or after A's lease (a lease that
//! ran out while A still works, as after a long pause, included). The tool
//! either honours idempotency keys (a re-send with the same key returns the
//! first reply) or does not.
//!
//! Checked in every interleaving: a tool that does not honour keys executes
//! at most once; one that does has at most one effect; every replica that
//! reports `completed` reports the same result, and it is the effect's;
//! without a crash and within the lease nothing ends in doubt; a stored
//! `completed` entry holds the effect's result.

use loom::sync::atomic::{AtomicU32, Ordering};
use loom::sync::{Arc, Mutex};
use serde_json::{Value, json};
use tessera_agent::tools::ledger::{self, Action, Entry, Here, State, Traits};

const NOW: u64 = 1_000;
const LEASE: u64 = 100;
const HASH: &str = "h";

/// The model store: one ledger key.
#[derive(Default)]
struct World {
    /// The entry and its version.
    ledger: Mutex<Option<(Entry, u64)>>,
    versions: AtomicU32,
    /// Sends that reached the tool, and effects it performed.
    sends: AtomicU32,
    effects: AtomicU32,
    /// A key-honouring tool's recorded reply.
    reply: Mutex<Option<Value>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Crash {
    None,
    /// After `dispatched` is durable, before the send.
    AfterIntent,
    /// After the send, before its outcome is recorded (the reply is lost too).
    AfterSend,
    /// After the reply, before the outcome write lands (background write lost).
    LoseOutcome,
}

#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Completed(Value),
    InDoubt,
    /// Gave up waiting for the other sender (the API answers `in_progress`).
    InProgress,
    Crashed,
}

impl World {
    fn read(&self) -> (Option<Entry>, Option<u64>) {
        match &*self.ledger.lock().unwrap() {
            Some((e, v)) => (Some(e.clone()), Some(*v)),
            None => (None, None),
        }
    }

    /// Create (`expected == None`) or compare-and-swap.
    fn write(&self, expected: Option<u64>, e: &Entry) -> Option<u64> {
        let mut g = self.ledger.lock().unwrap();
        let ok = match (&*g, expected) {
            (None, None) => true,
            (Some((_, v)), Some(x)) => *v == x,
            _ => false,
        };
        if !ok {
            return None;
        }
        let v = u64::from(self.versions.fetch_add(1, Ordering::SeqCst)) + 1;
        *g = Some((e.clone(), v));
        Some(v)
    }

    fn send(&self, honours_keys: bool, by: &str) -> Value {
        self.sends.fetch_add(1, Ordering::SeqCst);
        if honours_keys {
            let mut r = self.reply.lock().unwrap();
            if let Some(v) = &*r {
                return v.clone();
            }
            self.effects.fetch_add(1, Ordering::SeqCst);
            let v = json!({"charge": format!("ch-by-{by}")});
            *r = Some(v.clone());
            v
        } else {
            self.effects.fetch_add(1, Ordering::SeqCst);
            json!({"charge": format!("ch-by-{by}")})
        }
    }
}

fn new_entry(owner: &str) -> Entry {
    Entry {
        id: "l-1".into(),
        session_id: "s".into(),
        tool_call_id: "c".into(),
        idempotency_key: "k".into(),
        tool: "charge".into(),
        runtime: None,
        args_hash: HASH.into(),
        arguments: json!({}),
        state: State::Dispatched,
        attempts: 0,
        owner: owner.into(),
        lease_until_ms: 0,
        created_at_ms: NOW,
        updated_at_ms: NOW,
        result: None,
        error: None,
        approval: None,
        note: None,
    }
}

/// One replica's call, following `ToolGateway::run` / `lead`.
fn replica(
    w: &World,
    me: &str,
    now: u64,
    honours_keys: bool,
    crash: Crash,
    broken: bool,
) -> Outcome {
    let traits = Traits {
        resend_safe: honours_keys,
        needs_approval: false,
    };
    for _round in 0..4 {
        let (entry, version) = w.read();
        let here = Here {
            owner: me,
            exclusive: false,
            in_flight: false,
            now_ms: now,
        };
        match ledger::decide(entry.as_ref(), "charge", HASH, traits, here) {
            Action::Replay => {
                let e = entry.unwrap();
                return match e.state {
                    State::Completed => Outcome::Completed(e.result.unwrap()),
                    State::InDoubt => Outcome::InDoubt,
                    s => panic!("replayed a {s:?} entry"),
                };
            }
            Action::Wait => {
                loom::thread::yield_now();
                continue;
            }
            Action::MarkInDoubt => {
                let mut e = entry.unwrap();
                e.state = State::InDoubt;
                if w.write(version, &e).is_some() {
                    return Outcome::InDoubt;
                }
                continue;
            }
            Action::Dispatch {
                write_first,
                takeover,
            } => {
                let mut e = entry.unwrap_or_else(|| new_entry(me));
                e.state = State::Dispatched;
                e.owner = me.into();
                e.lease_until_ms = now + LEASE;
                e.attempts += 1;
                let mut version = version;
                // `broken`: a protocol that sends before its durable record.
                let write_first = write_first && !broken;
                if write_first {
                    let expected = if takeover { version } else { None };
                    match w.write(expected, &e) {
                        Some(v) => version = Some(v),
                        None => continue,
                    }
                }
                if crash == Crash::AfterIntent {
                    return Outcome::Crashed;
                }
                let result = w.send(honours_keys, me);
                if crash == Crash::AfterSend {
                    return Outcome::Crashed;
                }
                e.state = State::Completed;
                e.result = Some(result.clone());
                if crash != Crash::LoseOutcome {
                    // A lost race here means another replica recorded: its
                    // record stands (the gateway logs nothing and replies).
                    let _ = w.write(if write_first { version } else { None }, &e);
                }
                return Outcome::Completed(result);
            }
            a => panic!("unexpected action {a:?} without approvals"),
        }
    }
    Outcome::InProgress
}

fn check(honours_keys: bool, crash: Crash, b_after_lease: bool, broken: bool) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(move || {
        let w = Arc::new(World::default());
        let wa = w.clone();
        let a = loom::thread::spawn(move || replica(&wa, "A", NOW, honours_keys, crash, broken));
        let b_now = if b_after_lease { NOW + LEASE + 1 } else { NOW };
        let rb = replica(&w, "B", b_now, honours_keys, Crash::None, broken);
        let ra = a.join().unwrap();
        let effects = w.effects.load(Ordering::SeqCst);
        let ctx = format!(
            "keys {honours_keys}, A crash {crash:?}, B after lease {b_after_lease}: A {ra:?}, B {rb:?}, sends {}, effects {effects}, ledger {:?}",
            w.sends.load(Ordering::SeqCst),
            w.read().0.map(|e| e.state)
        );
        assert!(effects <= 1, "more than one effect: {ctx}");
        let effect = w.reply.lock().unwrap().clone();
        let completed: Vec<&Value> = [&ra, &rb]
            .into_iter()
            .filter_map(|o| match o {
                Outcome::Completed(v) => Some(v),
                _ => None,
            })
            .collect();
        if completed.len() == 2 {
            assert_eq!(completed[0], completed[1], "two results: {ctx}");
        }
        if honours_keys {
            for v in &completed {
                assert_eq!(Some(*v), effect.as_ref(), "not the effect's result: {ctx}");
            }
        }
        if crash == Crash::None && !b_after_lease {
            assert!(
                ![&ra, &rb].contains(&&Outcome::InDoubt),
                "in doubt without a crash: {ctx}"
            );
            assert!(
                !completed.is_empty(),
                "no replica completed without a crash: {ctx}"
            );
        }
        if let (Some(e), _) = w.read() {
            if e.state == State::Completed {
                if honours_keys {
                    assert_eq!(e.result, effect, "stored result: {ctx}");
                } else {
                    assert_eq!(effects, 1, "completed without an effect: {ctx}");
                }
            }
        }
    });
}

#[test]
fn two_replicas_race_on_one_key_with_a_tool_that_honours_keys() {
    for crash in [
        Crash::None,
        Crash::AfterIntent,
        Crash::AfterSend,
        Crash::LoseOutcome,
    ] {
        for after in [false, true] {
            check(true, crash, after, false);
        }
    }
}

#[test]
fn two_replicas_race_on_one_key_with_a_tool_that_does_not() {
    for crash in [
        Crash::None,
        Crash::AfterIntent,
        Crash::AfterSend,
        Crash::LoseOutcome,
    ] {
        for after in [false, true] {
            check(false, crash, after, false);
        }
    }
}

/// The model can fail: a protocol that sends a side effect before its durable
/// `dispatched` record executes it twice in some interleaving.
#[test]
#[should_panic(expected = "more than one effect")]
fn sending_before_the_durable_record_is_caught() {
    check(false, Crash::None, false, true);
}
