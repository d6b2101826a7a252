//! The handles this library gave to C, and what becomes of them when destroyed
//! (a C program's misuse must not corrupt memory).
//!
//! # Live handles
//!
//! Every object handed to C is an [`Obj`]: a `#[repr(C)]` pair of the C struct the
//! application reads (`struct ibv_qp`, `struct rdma_cm_id`, ...; the pointer handed out
//! is its address) and our state, in an `Arc`. A process-wide registry maps each live
//! handle's address to its `Arc`; every entry point looks a handle up there
//! ([`Obj::get`]) before touching it, so a pointer that is not a live object of the
//! expected kind (NULL, destroyed, never ours, or another kind: the registry holds the
//! type with the object) is `EINVAL` and is never dereferenced. The `Arc` a call holds
//! keeps the object alive while a destroy on another thread races it.
//!
//! A destroy that cannot be refused (a QP, a CM id, an event's ack) takes the handle
//! out of the registry first ([`Obj::take`]), so of two destroys (or a destroy and a
//! racing call) exactly one finds it. A destroy the object's use can refuse (`EBUSY`: a
//! PD, MR, CQ or completion channel) first marks the object dying
//! ([`Obj::begin_destroy`]) and takes it out of the registry only once it succeeded
//! ([`Destroying::finish`]): while it runs, the object stays live for every other call
//! (a refused destroy leaves no window in which the live object is `EINVAL`), a second
//! destroy gets `EBUSY` (as the kernel's exclusive lock of a uobject being destroyed
//! does), and the creation of a child (a CQ on a channel, a QP on a CQ) fails. Creator
//! and destroyer meet as in Dekker's protocol: the creator counts its child on the
//! parent first and then checks [`Obj::is_dying`]; the destroyer marks the parent dying
//! first and then checks the count (both `SeqCst`), so at least one of them sees the
//! other and never both succeed.
//!
//! # The graveyard
//!
//! rdma-core's header inlines (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`,
//! `ibv_req_notify_cq`) read `qp->context->ops` or `cq->context->ops` in the
//! application before they call us. So a destroyed object's C struct stays readable
//! after the destroy: it goes to a graveyard ([`Obj::bury`]) with its `context` pointer
//! intact (objects hold their context's `Arc`, so the context's struct, and its ops
//! table, outlive them), and the inline reaches our function, which finds the handle
//! dead and returns `EINVAL`. The soft objects behind a destroyed handle are destroyed at
//! once; what stays is the C struct and a small remainder of our state (a few hundred
//! bytes; an `rdma_cm_id` is the largest at about 650).
//!
//! The graveyard holds the last [`GRAVEYARD`] destroyed handles (first in, first out),
//! so its memory is bounded: about 2 MiB at most, counting the ids that buried events
//! keep. The trade-off: a handle used more than [`GRAVEYARD`] destroys after its own
//! has been freed, and its address may then be reused by a new object of ours (the
//! stale handle then names that object, as with rdma-core's freed pointers). Within
//! the window, a stale handle is always `EINVAL`, and its address cannot be reused,
//! because the memory is not freed.
//!
//! # The C view
//!
//! The C struct is in an `UnsafeCell`: the application reads it (and may write the
//! fields its man page lets it, such as `context`), so Rust code never holds a
//! reference to it across calls. [`Obj::with_c`] reads it and [`Obj::update_c`]
//! writes it, each for the duration of a closure. The C structs of PDs, MRs, CQs, QPs,
//! channels and contexts are written only before their handle is published; those of
//! CM ids and events are written afterwards too, under the id's or event's own lock
//! (`crate::objects`), so no two Rust threads touch one C view at once.

#![allow(unsafe_code)]

use std::any::Any;
use std::cell::UnsafeCell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};

/// How many destroyed handles stay readable (see the [module docs](self)).
pub const GRAVEYARD: usize = 2048;

/// An object handed to C: the C view (its address is the handle), then ours. `P` is
/// a C prefix that must lie right before the C view in memory (a context's `struct
/// verbs_context` head, which rdma-core's `verbs_get_ctx` finds there); `()` for every
/// other kind, whose C view is then the first byte of the object.
#[repr(C)]
pub struct Obj<C, S, P = ()> {
    pre: UnsafeCell<P>,
    c: UnsafeCell<C>,
    /// Our side of the object.
    pub s: S,
    /// A destroy that may be refused is in progress, or succeeded
    /// ([`Obj::begin_destroy`]).
    dying: AtomicBool,
}

// SAFETY: `C` and `P` are rdma-core's plain C structs (integers, arrays, raw pointers
// that this library never dereferences through the struct); `C` is only read and
// written through `with_c` / `update_c` under the rules of the module docs (written
// before publication, or under the object's own lock), `P` only before publication, so
// sharing the `Obj` across threads shares no Rust reference to them. `S` brings its
// own `Send`/`Sync`.
unsafe impl<C, S: Send, P> Send for Obj<C, S, P> {}
// SAFETY: as for `Send`.
unsafe impl<C, S: Sync, P> Sync for Obj<C, S, P> {}

type AnyObj = Arc<dyn Any + Send + Sync>;

struct Registry {
    live: RwLock<HashMap<usize, AnyObj>>,
    grave: Mutex<VecDeque<AnyObj>>,
}

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Registry {
        live: RwLock::new(HashMap::new()),
        grave: Mutex::new(VecDeque::new()),
    })
}

impl<C: 'static, S: Send + Sync + 'static> Obj<C, S> {
    /// A new object, not yet published (see [`Obj::publish`]).
    pub fn new(c: C, s: S) -> Arc<Self> {
        Obj::with_prefix((), c, s)
    }

    /// A new object whose state knows its own handle (`f` gets the address).
    pub fn new_cyclic(c: C, f: impl FnOnce(usize) -> S) -> Arc<Self> {
        Arc::new_cyclic(|w: &std::sync::Weak<Self>| Obj {
            pre: UnsafeCell::new(()),
            c: UnsafeCell::new(c),
            // `()` is zero-sized: the C view is the object's first byte.
            s: f(w.as_ptr() as usize),
            dying: AtomicBool::new(false),
        })
    }
}

impl<C: 'static, S: Send + Sync + 'static, P: 'static> Obj<C, S, P> {
    /// A new object with the C prefix `pre` right before its C view, not yet published.
    pub fn with_prefix(pre: P, c: C, s: S) -> Arc<Self> {
        Arc::new(Obj {
            pre: UnsafeCell::new(pre),
            c: UnsafeCell::new(c),
            s,
            dying: AtomicBool::new(false),
        })
    }

    /// Registers `this` as a live handle and returns the pointer to hand out.
    pub fn publish(this: &Arc<Self>) -> *mut C {
        let p = this.ptr();
        let any: AnyObj = this.clone();
        write(&registry().live).insert(p as usize, any);
        p
    }

    /// The handle (the C struct's address).
    pub fn ptr(&self) -> *mut C {
        self.c.get()
    }

    /// The handle as an address.
    pub fn addr(&self) -> usize {
        self.ptr() as usize
    }

    /// The live object of this kind at `p`; `None` for NULL, a destroyed handle, a
    /// pointer that was never ours, or an object of another kind. Never reads `p`.
    pub fn get(p: *const C) -> Option<Arc<Self>> {
        if p.is_null() {
            return None;
        }
        let any = read(&registry().live).get(&(p as usize))?.clone();
        any.downcast::<Self>().ok()
    }

    /// Takes the live object of this kind at `p` out of the registry (a destroy: from
    /// now on the handle is dead); `None` as for [`Obj::get`].
    pub fn take(p: *const C) -> Option<Arc<Self>> {
        if p.is_null() {
            return None;
        }
        let mut live = write(&registry().live);
        let any = live.get(&(p as usize))?;
        if !(**any).is::<Self>() {
            return None;
        }
        live.remove(&(p as usize))?.downcast::<Self>().ok()
    }

    /// Starts a destroy that may be refused: marks the live object at `p` dying (see
    /// the [module docs](self)), leaving it live for other calls until
    /// [`Destroying::finish`]; dropping the [`Destroying`] instead (the destroy was
    /// refused) makes it an ordinary live object again. `Err(EINVAL)` if not live,
    /// `Err(EBUSY)` while another destroy of it runs.
    pub fn begin_destroy(p: *const C) -> Result<Destroying<C, S, P>, i32> {
        let o = Self::get(p).ok_or(libc::EINVAL)?;
        if o.dying
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            // Another destroy runs, or has just succeeded.
            return Err(if Self::get(p).is_some() {
                libc::EBUSY
            } else {
                libc::EINVAL
            });
        }
        Ok(Destroying {
            obj: o,
            finished: false,
        })
    }

    /// Destroys the live object at `p` with `f`, which may refuse (`Err(errno)`): as
    /// [`Obj::begin_destroy`], then buried if `f` succeeds, live again if it refuses.
    pub fn destroy_with(p: *const C, f: impl FnOnce(&Self) -> Result<(), i32>) -> Result<(), i32> {
        let d = Self::begin_destroy(p)?;
        f(d.obj())?;
        d.finish();
        Ok(())
    }

    /// True while a destroy of the object that may be refused runs, and once one
    /// succeeded: a creator that counted a child on the object checks this afterwards
    /// and undoes its count if true (`SeqCst`, see the [module docs](self)).
    pub fn is_dying(&self) -> bool {
        self.dying.load(Ordering::SeqCst)
    }

    /// Keeps a destroyed object's memory readable for the next [`GRAVEYARD`] destroys.
    pub fn bury(this: Arc<Self>) {
        let evicted = {
            let mut g = registry()
                .grave
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            g.push_back(this);
            if g.len() > GRAVEYARD {
                g.pop_front()
            } else {
                None
            }
        };
        // Freed outside the lock (its drop may destroy soft objects).
        drop(evicted);
    }

    /// Runs `f` on the C view (reading it).
    pub fn with_c<R>(&self, f: impl FnOnce(&C) -> R) -> R {
        // SAFETY: the C view is plain data, allocated as long as `self`; no Rust
        // reference to it outlives a `with_c`/`update_c` closure, and no Rust thread
        // writes it concurrently (module docs: written before publication, or under
        // the object's own lock, which callers of `update_c` hold).
        f(unsafe { &*self.c.get() })
    }

    /// Runs `f` on the C view, writing it.
    ///
    /// Callers hold the object's own lock (CM ids, events) or call it before the handle
    /// is published.
    pub fn update_c(&self, f: impl FnOnce(&mut C)) {
        // SAFETY: as in `with_c`; the caller's lock (or the object being unpublished)
        // makes this the only Rust access to the C view for the closure.
        f(unsafe { &mut *self.c.get() })
    }
}

/// A destroy in progress ([`Obj::begin_destroy`]): the object is live and dying.
pub struct Destroying<C: 'static, S: Send + Sync + 'static, P: 'static = ()> {
    obj: Arc<Obj<C, S, P>>,
    finished: bool,
}

impl<C: 'static, S: Send + Sync + 'static, P: 'static> Destroying<C, S, P> {
    /// The object being destroyed.
    pub fn obj(&self) -> &Arc<Obj<C, S, P>> {
        &self.obj
    }

    /// The destroy succeeded: the handle is dead from now on (out of the registry, so
    /// every later call finds nothing; it stays dying) and its memory goes to the
    /// graveyard.
    pub fn finish(mut self) {
        self.finished = true;
        write(&registry().live).remove(&self.obj.addr());
        Obj::bury(self.obj.clone());
    }
}

impl<C: 'static, S: Send + Sync + 'static, P: 'static> Drop for Destroying<C, S, P> {
    /// Not finished: the destroy was refused, and the object is an ordinary live one.
    fn drop(&mut self) {
        if !self.finished {
            self.obj.dying.store(false, Ordering::SeqCst);
        }
    }
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C)]
    struct CA(u64);
    #[repr(C)]
    struct CB(u64);

    #[test]
    fn a_handle_is_live_until_taken_and_of_one_kind() {
        let a = Obj::new(CA(1), 10u32);
        let p = Obj::publish(&a);
        assert_eq!(Obj::<CA, u32>::get(p).map(|o| o.s), Some(10));
        // The same address as another kind, or with other state: not found.
        assert!(Obj::<CB, u32>::get(p.cast()).is_none());
        assert!(Obj::<CA, u64>::get(p).is_none());
        assert!(Obj::<CB, u32>::take(p.cast()).is_none());
        assert!(Obj::<CA, u32>::get(std::ptr::null()).is_none());
        // Never ours: a stack address.
        let x = CA(5);
        assert!(Obj::<CA, u32>::get(&x).is_none());
        let t = Obj::<CA, u32>::take(p).expect("live");
        assert!(
            Obj::<CA, u32>::take(p).is_none(),
            "a second destroy finds nothing"
        );
        assert!(Obj::<CA, u32>::get(p).is_none());
        Obj::publish(&t);
        let t = Obj::<CA, u32>::take(p).expect("published again");
        t.with_c(|c| assert_eq!(c.0, 1));
        Obj::bury(t);
        drop(a);
        assert!(Obj::<CA, u32>::get(p).is_none());
    }

    #[test]
    fn a_dying_object_stays_live_until_its_destroy_succeeds() {
        let a = Obj::new(CA(2), 20u32);
        let p = Obj::publish(&a);
        let d = Obj::<CA, u32>::begin_destroy(p).expect("live");
        assert!(a.is_dying());
        // Other calls still find it; a second destroy is refused while this one runs.
        assert!(Obj::<CA, u32>::get(p).is_some());
        assert_eq!(Obj::<CA, u32>::begin_destroy(p).err(), Some(libc::EBUSY));
        // Refused: an ordinary live object again.
        drop(d);
        assert!(!a.is_dying());
        assert_eq!(
            Obj::<CA, u32>::destroy_with(p, |_| Err(libc::EBUSY)),
            Err(libc::EBUSY)
        );
        assert!(!a.is_dying() && Obj::<CA, u32>::get(p).is_some());
        // Succeeded: dead, and it stays dying (a creator that raced it sees that).
        assert_eq!(Obj::<CA, u32>::destroy_with(p, |_| Ok(())), Ok(()));
        assert!(a.is_dying());
        assert!(Obj::<CA, u32>::get(p).is_none());
        assert_eq!(Obj::<CA, u32>::begin_destroy(p).err(), Some(libc::EINVAL));
    }

    #[test]
    fn the_graveyard_is_bounded_and_keeps_the_newest() {
        let mut kept = Vec::new();
        for i in 0..GRAVEYARD + 10 {
            let o = Obj::new(CB(i as u64), ());
            kept.push(Arc::downgrade(&o));
            Obj::bury(o);
        }
        // Other tests bury too; these are the newest of this test's own.
        assert!(kept[GRAVEYARD + 9].upgrade().is_some());
        assert!(kept[0].upgrade().is_none());
        let g = registry().grave.lock().unwrap();
        assert!(g.len() <= GRAVEYARD);
    }

    #[test]
    fn an_object_knows_its_handle() {
        let o = Obj::new_cyclic(CA(3), |addr| addr);
        assert_eq!(o.s, o.addr());
        assert_eq!(Obj::publish(&o) as usize, o.s);
        assert!(Obj::<CA, usize>::take(o.ptr()).is_some());
    }
}
