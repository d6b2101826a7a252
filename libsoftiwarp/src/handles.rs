//! The handles this library gave to C, and what becomes of them when destroyed
//! (issue 28: a C program's misuse must not corrupt memory).
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
//! Destroying takes the handle out of the registry first ([`Obj::take`]), so of two
//! destroys (or a destroy and a racing call) exactly one finds it; a destroy refused
//! because the object is in use (`EBUSY`) puts it back ([`Obj::restore`]).
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
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};

/// How many destroyed handles stay readable (see the [module docs](self)).
pub const GRAVEYARD: usize = 2048;

/// An object handed to C: the C view first (its address is the handle), then ours.
#[repr(C)]
pub struct Obj<C, S> {
    c: UnsafeCell<C>,
    /// Our side of the object.
    pub s: S,
}

// SAFETY: `C` is one of rdma-core's plain C structs (integers, arrays, raw pointers
// that this library never dereferences through the struct); it is only read and written
// through `with_c` / `update_c` under the rules of the module docs (written before
// publication, or under the object's own lock), so sharing the `Obj` across threads
// shares no Rust reference to it. `S` brings its own `Send`/`Sync`.
unsafe impl<C, S: Send> Send for Obj<C, S> {}
// SAFETY: as for `Send`.
unsafe impl<C, S: Sync> Sync for Obj<C, S> {}

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
        Arc::new(Obj {
            c: UnsafeCell::new(c),
            s,
        })
    }

    /// A new object whose state knows its own handle (`f` gets the address).
    pub fn new_cyclic(c: C, f: impl FnOnce(usize) -> S) -> Arc<Self> {
        Arc::new_cyclic(|w| Obj {
            c: UnsafeCell::new(c),
            s: f(w.as_ptr() as usize),
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

    /// Takes the live object at `p` out of the registry for a destroy unless `busy`
    /// says it is in use: `Err(EINVAL)` if not live, `Err(EBUSY)` if busy (checked
    /// before and again after the take, so a use that raced in keeps it live).
    pub fn take_idle(p: *const C, busy: impl Fn(&Self) -> bool) -> Result<Arc<Self>, i32> {
        match Self::get(p) {
            None => return Err(libc::EINVAL),
            Some(o) if busy(&o) => return Err(libc::EBUSY),
            Some(_) => {}
        }
        let o = Self::take(p).ok_or(libc::EINVAL)?;
        if busy(&o) {
            Self::restore(o);
            return Err(libc::EBUSY);
        }
        Ok(o)
    }

    /// Destroys the live object at `p`: takes it, runs `f`, buries it if `f` succeeds,
    /// puts it back if `f` refuses (`Err(errno)`). `Err(EINVAL)` if not live.
    pub fn destroy_with(p: *const C, f: impl FnOnce(&Self) -> Result<(), i32>) -> Result<(), i32> {
        let o = Self::take(p).ok_or(libc::EINVAL)?;
        match f(&o) {
            Ok(()) => {
                Self::bury(o);
                Ok(())
            }
            Err(e) => {
                Self::restore(o);
                Err(e)
            }
        }
    }

    /// Puts a taken object back (its destroy was refused).
    pub fn restore(this: Arc<Self>) {
        let any: AnyObj = this.clone();
        write(&registry().live).insert(this.addr(), any);
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
        Obj::restore(t);
        let t = Obj::<CA, u32>::take(p).expect("restored");
        t.with_c(|c| assert_eq!(c.0, 1));
        Obj::bury(t);
        drop(a);
        assert!(Obj::<CA, u32>::get(p).is_none());
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
