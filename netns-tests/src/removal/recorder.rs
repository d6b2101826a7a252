//! The recording handler: every callback of every id, checked for overlap and order,
//! noted for the peer's main thread ([`Recorder`], [`RecHandler`]).

use super::*;

/// An event as the callback hands it to the thread that owns the id.
pub struct Note {
    /// The id's serial (for a `ConnectRequest`: the new id's).
    pub serial: u64,
    /// What.
    pub kind: EventKind,
    /// Its status.
    pub status: i32,
    /// The peer's private data.
    pub private_data: Vec<u8>,
    /// For a `ConnectRequest`: the new id.
    pub new_id: Option<CmId<SoftDevice>>,
    /// The callback returned Destroy (the id is gone).
    pub returned_destroy: bool,
    /// When the callback started (ns).
    pub t_ns: u64,
}

#[derive(Default)]
pub(super) struct IdRec {
    pub(super) purpose: String,
    pub(super) kinds: Vec<EventKind>,
    pub(super) removals: u32,
    pub(super) in_cb: bool,
    pub(super) destroy_asked: bool,
    pub(super) destroy_done: bool,
    pub(super) returned_destroy: bool,
}

/// A callback to hold (seed and destroy-blocked scenarios).
pub(super) struct Hold {
    pub(super) serial: u64,
    pub(super) on: EventKind,
    pub(super) ms: u64,
    pub(super) dispo: Disposition,
    pub(super) announce: &'static str,
}

/// The state every callback records into; see the module docs for the checks.
pub struct Recorder {
    pub(super) seed: u64,
    pub(super) recs: Mutex<HashMap<u64, IdRec>>,
    pub(super) routes: Mutex<HashMap<u64, Sender<Note>>>,
    pub(super) default: Mutex<Sender<Note>>,
    pub(super) live: Mutex<HashMap<u64, CmIdRef<SoftDevice>>>,
    pub(super) violations: Mutex<Vec<String>>,
    pub(super) first_notice: Mutex<Option<(u64, String, Option<String>)>>,
    pub(super) first_removal: Mutex<Option<u64>>,
    pub(super) phase: Mutex<String>,
    pub(super) hold: Mutex<Option<Hold>>,
    pub(super) hold_returned: Mutex<Option<u64>>,
    pub(super) removals: AtomicUsize,
}

/// The [`Handler`] of every id: records, checks, routes the event to its owner.
pub struct RecHandler(pub Arc<Recorder>);

impl Recorder {
    pub(super) fn new(seed: u64) -> (Arc<Recorder>, Receiver<Note>) {
        let (tx, rx) = mpsc::channel();
        let r = Recorder {
            seed,
            recs: Mutex::new(HashMap::new()),
            routes: Mutex::new(HashMap::new()),
            default: Mutex::new(tx),
            live: Mutex::new(HashMap::new()),
            violations: Mutex::new(Vec::new()),
            first_notice: Mutex::new(None),
            first_removal: Mutex::new(None),
            phase: Mutex::new("start".to_owned()),
            hold: Mutex::new(None),
            hold_returned: Mutex::new(None),
            removals: AtomicUsize::new(0),
        };
        (Arc::new(r), rx)
    }

    pub(super) fn violation(&self, v: String) {
        eprintln!("VIOLATION {v}");
        lock(&self.violations).push(v);
    }

    /// The first sign of the removal (ns).
    pub(super) fn notice(&self, t: u64, what: impl FnOnce() -> String) {
        let mut n = lock(&self.first_notice);
        if n.is_none() {
            let what = what();
            println!("NOTICE {t} {what}");
            *n = Some((t, what, Some(lock(&self.phase).clone())));
        }
    }

    pub(super) fn set_phase(&self, p: &str) {
        *lock(&self.phase) = p.to_owned();
        println!("PHASE {p} {}", now_ns());
    }

    /// Tracks a new id of ours; its events go to the returned receiver.
    pub(super) fn track(&self, id: &CmId<SoftDevice>, purpose: &str) -> Receiver<Note> {
        let (tx, rx) = mpsc::channel();
        lock(&self.routes).insert(id.serial(), tx);
        self.track_ref(id, purpose);
        rx
    }

    pub(super) fn track_ref(&self, id: &CmIdRef<SoftDevice>, purpose: &str) {
        lock(&self.recs).entry(id.serial()).or_default().purpose = purpose.to_owned();
        lock(&self.live).insert(id.serial(), id.clone());
    }

    /// Destroys `id` (unless a callback's return did), recording it; a destroy that
    /// takes more than 2 s is a violation (a blocked thread).
    pub(super) fn destroy(&self, id: CmId<SoftDevice>) {
        let serial = id.serial();
        let returned = {
            let mut recs = lock(&self.recs);
            let r = recs.entry(serial).or_default();
            r.destroy_asked = true;
            r.returned_destroy
        };
        let t = Instant::now();
        if returned {
            drop(id);
        } else if let Err(e) = id.destroy() {
            self.violation(format!("destroy of id #{serial} refused: {}", e.error));
        }
        if t.elapsed() > Duration::from_secs(2) {
            self.violation(format!("destroy of id #{serial} took {:?}", t.elapsed()));
        }
        if let Some(r) = lock(&self.recs).get_mut(&serial) {
            r.destroy_done = true;
        }
        lock(&self.live).remove(&serial);
        lock(&self.routes).remove(&serial);
    }

    /// Rule 3 after a removal was processed: every id of ours still alive, bound to
    /// `device` and whose destroy was not asked got exactly one `DeviceRemoval`.
    pub(super) fn check_exactly_one(&self, device: &str) {
        let live: Vec<CmIdRef<SoftDevice>> = lock(&self.live).values().cloned().collect();
        for id in live {
            let (asked, removals, purpose) = match lock(&self.recs).get(&id.serial()) {
                Some(r) => (r.destroy_asked, r.removals, r.purpose.clone()),
                None => (false, 0, String::new()),
            };
            if asked || id.state() == IdState::Destroying {
                continue;
            }
            if id.device_name().as_deref() == Some(device) && removals != 1 {
                self.violation(format!(
                    "id #{} ({purpose}, state {}) bound to removed {device} got {removals} DeviceRemoval",
                    id.serial(),
                    id.state()
                ));
            }
        }
    }

    pub(super) fn report_ids(&self) -> (Vec<IdReport>, usize, usize) {
        let recs = lock(&self.recs);
        let mut ids: Vec<IdReport> = recs
            .iter()
            .map(|(serial, r)| IdReport {
                serial: *serial,
                purpose: r.purpose.clone(),
                events: r.kinds.iter().map(|k| format!("{k:?}")).collect(),
                removals: r.removals,
                destroyed: if r.returned_destroy {
                    "return".into()
                } else if r.destroy_done {
                    "user".into()
                } else {
                    String::new()
                },
            })
            .collect();
        ids.sort_by_key(|i| i.serial);
        let by_return = recs.values().filter(|r| r.returned_destroy).count();
        let by_user = recs
            .values()
            .filter(|r| r.destroy_done && !r.returned_destroy)
            .count();
        (ids, by_user, by_return)
    }
}

pub(super) fn long_lived(purpose: &str) -> bool {
    matches!(purpose, "load" | "held" | "listener")
}

impl Handler<SoftDevice> for RecHandler {
    fn on_event(&self, id: &CmIdRef<SoftDevice>, mut ev: CmEvent<SoftDevice>) -> Disposition {
        let r = &self.0;
        let t = now_ns();
        let serial = id.serial();
        let new_id = ev.take_new_id();
        println!("EVENT {t} {serial} {:?} {}", ev.kind, ev.status);
        let purpose = {
            let mut recs = lock(&r.recs);
            let rec = recs.entry(serial).or_default();
            if rec.in_cb {
                drop(recs);
                r.violation(format!("callbacks of id #{serial} overlap ({:?})", ev.kind));
                recs = lock(&r.recs);
            }
            let rec = recs.entry(serial).or_default();
            let mut bad = Vec::new();
            if rec.destroy_done || rec.returned_destroy {
                bad.push(format!(
                    "{:?} delivered to id #{serial} after its destroy",
                    ev.kind
                ));
            }
            if rec.removals > 0 {
                bad.push(format!(
                    "{:?} delivered to id #{serial} after DeviceRemoval",
                    ev.kind
                ));
            }
            rec.in_cb = true;
            rec.kinds.push(ev.kind);
            if ev.kind == EventKind::DeviceRemoval {
                rec.removals += 1;
            }
            let p = rec.purpose.clone();
            drop(recs);
            for b in bad {
                r.violation(b);
            }
            p
        };
        if let Some(n) = &new_id {
            // The new id of a request: its purpose from the private data.
            let p = match ev.private_data.first() {
                Some(b'L') => "load",
                Some(b'C') => "churn",
                Some(b'A') => "after",
                _ => "passive",
            };
            r.track_ref(n, p);
        }
        match ev.kind {
            EventKind::DeviceRemoval => {
                r.removals.fetch_add(1, Ordering::Relaxed);
                lock(&r.first_removal).get_or_insert(t);
                r.notice(t, || format!("DeviceRemoval on id #{serial} ({purpose})"));
            }
            EventKind::Disconnected
            | EventKind::ConnectError
            | EventKind::Rejected
            | EventKind::Unreachable
                if long_lived(&purpose) =>
            {
                r.notice(t, || format!("{:?} on id #{serial} ({purpose})", ev.kind));
            }
            _ => {}
        }
        // Seeded: half of the ids are destroyed by the DeviceRemoval callback's return.
        let mut dispo = if ev.kind == EventKind::DeviceRemoval
            && (serial ^ r.seed).is_multiple_of(2)
            && purpose != "listener"
        {
            Disposition::Destroy
        } else {
            Disposition::Keep
        };
        let hold = {
            let h = lock(&r.hold);
            h.as_ref()
                .filter(|h| h.serial == serial && h.on == ev.kind)
                .map(|h| (h.ms, h.dispo, h.announce))
        };
        let note = Note {
            serial: new_id.as_ref().map_or(serial, |n| n.serial()),
            kind: ev.kind,
            status: ev.status,
            private_data: std::mem::take(&mut ev.private_data),
            new_id,
            returned_destroy: dispo == Disposition::Destroy,
            t_ns: t,
        };
        let route = lock(&r.routes).get(&serial).cloned();
        let _ = match route {
            Some(tx) => tx.send(note),
            None => lock(&r.default).send(note),
        };
        if let Some((ms, d, announce)) = hold {
            println!("{announce} {serial} {}", now_ns());
            std::thread::sleep(Duration::from_millis(ms));
            dispo = d;
            *lock(&r.hold_returned) = Some(now_ns());
            println!("HOLD_RETURNED {serial} {}", now_ns());
        }
        let mut recs = lock(&r.recs);
        if let Some(rec) = recs.get_mut(&serial) {
            rec.in_cb = false;
            if dispo == Disposition::Destroy {
                rec.returned_destroy = true;
                rec.destroy_asked = true;
            }
        }
        drop(recs);
        if dispo == Disposition::Destroy {
            lock(&r.live).remove(&serial);
        }
        dispo
    }
}

/// Waits for a note of one of `kinds` (or any ending kind); `None` on timeout or when
/// `stop` is set.
pub(super) fn wait_note(
    rx: &Receiver<Note>,
    timeout: Duration,
    stop: Option<&AtomicBool>,
) -> Option<Note> {
    let deadline = Instant::now() + timeout;
    loop {
        if stop.is_some_and(|s| s.load(Ordering::Acquire)) {
            return None;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        match rx.recv_timeout(left.min(Duration::from_millis(20))) {
            Ok(n) => return Some(n),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return None,
        }
    }
}

pub(super) fn is_end(kind: EventKind) -> bool {
    matches!(
        kind,
        EventKind::Disconnected
            | EventKind::DeviceRemoval
            | EventKind::ConnectError
            | EventKind::Rejected
            | EventKind::Unreachable
            | EventKind::AddrError
            | EventKind::RouteError
    )
}
