//! The events that reach an id, as cma.c's handlers deliver them: address and route
//! completion (`addr_handler`, `cma_work_handler`), iWARP CM events (`cma_iw_handler`),
//! connection requests (`iw_conn_req_handler`), and the internal listeners of a
//! wildcard listen (`cma_listen_on_dev`).

use super::{
    call_handler, CmEvent, CmId, CmIdRef, Delivery, DevEntry, IdInner, IwHandler, Queued, Role,
};
use crate::device::{CmDevice, NeighborResult, ResolveError};
use crate::event::{map_iw_event, Disposition, EventKind, IwEventKind};
use crate::machine::{IdState, Input, IwInput};
use crate::stats::{bump, sub};
use crate::sync::{lock, Arc};
use crate::CmError;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

impl<D: CmDevice> IdInner<D> {
    // ------------------------------------------------------ address and route

    /// The end of an address query (cma.c's `addr_handler`), on the worker.
    pub(crate) fn addr_done(
        this: &Arc<Self>,
        gen: u64,
        entry: Option<Arc<DevEntry<D>>>,
        src: Ipv4Addr,
        next_hop: Ipv4Addr,
        result: NeighborResult,
    ) {
        let _span = this.span.enter();
        this.shared.cancel_timer(this.serial, Some(gen));
        let guard = this.lock_handler();
        let (delivery, event) = {
            let mut st = lock(&this.st);
            if st.state.get() != IdState::AddrQuery || st.query_gen != gen {
                tracing::trace!(state = %st.state.get(), "stale address resolution dropped");
                return;
            }
            st.query_gen += 1;
            let outcome = match (result, entry) {
                (Ok(_), Some(entry)) => {
                    let attached = match &st.device {
                        Some(cur) if cur.serial == entry.serial => Ok(()),
                        Some(_) => Err(ResolveError::NetUnreachable),
                        None => entry.attach(this).map_err(|_| ResolveError::DeviceGone),
                    };
                    attached.map(|()| entry)
                }
                (Ok(_), None) => Err(ResolveError::NetUnreachable),
                (Err(e), _) => Err(e),
            };
            let ev = match outcome {
                Ok(entry) => {
                    let port = st.local.map_or(0, |l| l.port());
                    st.local = Some(SocketAddrV4::new(src, port));
                    st.next_hop = Some(next_hop);
                    st.device = Some(entry);
                    let _ = this.exch(&mut st, Input::AddrResolved);
                    CmEvent::new(EventKind::AddrResolved, 0)
                }
                Err(e) => {
                    tracing::debug!(error = %e, "address resolution failed");
                    let _ = this.exch(&mut st, Input::AddrError);
                    CmEvent::new(EventKind::AddrError, -e.errno())
                }
            };
            (st.delivery.clone(), ev)
        };
        Self::deliver(this, Some(guard), delivery, event);
    }

    /// The end of a route query (cma.c's `cma_work_handler` for iWARP: the route is
    /// the address), on the worker.
    pub(crate) fn route_done(this: &Arc<Self>, gen: u64) {
        let _span = this.span.enter();
        let guard = this.lock_handler();
        let (delivery, event) = {
            let mut st = lock(&this.st);
            if st.state.get() != IdState::RouteQuery || st.query_gen != gen {
                return;
            }
            let alive = st.device.as_ref().is_some_and(|d| !d.is_removing());
            let ev = if alive {
                let _ = this.exch(&mut st, Input::RouteResolved);
                CmEvent::new(EventKind::RouteResolved, 0)
            } else {
                let _ = this.exch(&mut st, Input::RouteError);
                CmEvent::new(EventKind::RouteError, -19)
            };
            (st.delivery.clone(), ev)
        };
        Self::deliver(this, Some(guard), delivery, event);
    }

    // --------------------------------------------------------- iWARP events

    pub(super) fn conn_iw_handler(this: &Arc<Self>) -> IwHandler<D> {
        let me = this.clone();
        std::sync::Arc::new(
            move |_: &iw_cm::CmIdRef<D::Provider>, ev: iw_cm::CmEvent<D::Provider>| {
                IdInner::iw_event(&me, ev);
                iw_cm::Disposition::Keep
            },
        )
    }

    pub(super) fn listen_iw_handler(
        listener: &Arc<Self>,
        entry: &Arc<DevEntry<D>>,
    ) -> IwHandler<D> {
        let (l, e) = (listener.clone(), entry.clone());
        std::sync::Arc::new(
            move |_: &iw_cm::CmIdRef<D::Provider>, ev: iw_cm::CmEvent<D::Provider>| {
                if let iw_cm::CmEvent::ConnectRequest(req) = ev {
                    IdInner::conn_request(&l, &e, req);
                }
                iw_cm::Disposition::Keep
            },
        )
    }

    /// cma.c's `cma_iw_handler`: map the event and deliver it, under the handler
    /// lock, if the id is connecting or connected.
    fn iw_event(this: &Arc<Self>, ev: iw_cm::CmEvent<D::Provider>) {
        let _span = this.span.enter();
        let kind = IwEventKind::of(&ev);
        let guard = this.lock_handler();
        let (delivery, event) = {
            let mut st = lock(&this.st);
            let input = Input::IwEvent(match &ev {
                iw_cm::CmEvent::ConnectRequest(_) => IwInput::ConnectRequest,
                iw_cm::CmEvent::ConnectReply(r) => IwInput::ConnectReply {
                    ok: r.status.is_ok(),
                },
                iw_cm::CmEvent::Established => IwInput::Established,
                iw_cm::CmEvent::Close => IwInput::Close,
            });
            if let Err(r) = this.exch(&mut st, input) {
                tracing::debug!(state = %r.state, ?kind, "iWARP event dropped");
                bump(&this.shared.counters.events_dropped);
                return;
            }
            let (k, status) = map_iw_event(kind);
            let mut e = CmEvent::new(k, status);
            match ev {
                iw_cm::CmEvent::ConnectReply(r) => {
                    e.private_data = r.private_data;
                    if r.status.is_ok() {
                        e.initiator_depth = r.ird;
                        e.responder_resources = r.ord;
                    }
                }
                iw_cm::CmEvent::Established | iw_cm::CmEvent::Close => {}
                iw_cm::CmEvent::ConnectRequest(req) => {
                    drop(st);
                    drop(req);
                    return;
                }
            }
            (st.delivery.clone(), e)
        };
        Self::deliver(this, Some(guard), delivery, event);
    }

    /// cma.c's `iw_conn_req_handler`: a connection request on `listener` (the user's
    /// listener, for its own device or through an internal per-device listener) from
    /// `entry`. Under the listener's handler lock: make the new id, lock it before
    /// anyone can see it, bind it to the device (refused if the device is being
    /// removed: the request is then rejected), and deliver `ConnectRequest`.
    fn conn_request(
        listener: &Arc<Self>,
        entry: &Arc<DevEntry<D>>,
        req: iw_cm::ConnectRequest<D::Provider>,
    ) {
        let _span = listener.span.enter();
        let lguard = listener.lock_handler();
        let delivery = {
            let st = lock(&listener.st);
            if st.state.get() != IdState::Listen {
                tracing::debug!(state = %st.state.get(), "connect request on a listener that stopped; rejected");
                bump(&listener.shared.counters.events_dropped);
                return;
            }
            st.delivery.clone()
        };
        let (SocketAddr::V4(local), SocketAddr::V4(peer)) = (req.local_addr, req.remote_addr)
        else {
            return;
        };
        let child = IdInner::new(
            &listener.shared,
            Role::User,
            delivery.clone(),
            IdState::Connect,
        );
        let cguard = child.lock_handler();
        {
            let mut cst = lock(&child.st);
            cst.passive = true;
            cst.local = Some(local);
            cst.peer = Some(peer);
            if entry.attach(&child).is_err() {
                let _ = child.exch(&mut cst, Input::Destroy);
                drop(cst);
                drop(cguard);
                tracing::debug!(device = %entry.name, "connect request during device removal; rejected");
                return;
            }
            cst.device = Some(entry.clone());
        }
        req.id.set_handler(Self::conn_iw_handler(&child));
        let iw_cm::ConnectRequest {
            id: iw_child,
            private_data,
            ird,
            ord,
            ..
        } = req;
        *lock(&child.ops) = Some(iw_child);
        let mut event = CmEvent::new(EventKind::ConnectRequest, 0);
        event.private_data = private_data;
        event.initiator_depth = ird;
        event.responder_resources = ord;
        event.new_id = Some(CmId::from_inner(child.clone()));
        event.listen_id = Some(listener.serial);
        tracing::debug!(child = child.serial, %peer, "connect request");
        let c = &listener.shared.counters;
        match delivery {
            Delivery::Callback(h) => {
                bump(&c.callbacks);
                let r = CmIdRef {
                    inner: child.clone(),
                };
                let d = call_handler(&*h, &r, event, &listener.shared);
                drop(h);
                drop(r);
                if (d == Disposition::Destroy || child.take_destroy_on_return())
                    && child.mark_destroying()
                {
                    drop(cguard);
                    Self::teardown(&child);
                } else {
                    drop(cguard);
                }
                if listener.take_destroy_on_return() && listener.mark_destroying() {
                    drop(lguard);
                    Self::teardown(listener);
                }
            }
            Delivery::Channel(ch) => {
                ch.push(Queued {
                    id: child.clone(),
                    owner: listener.clone(),
                    event,
                });
                drop(cguard);
                drop(lguard);
            }
            Delivery::Inert => {
                drop(cguard);
                drop(lguard);
                bump(&c.events_dropped);
                drop(event);
            }
        }
    }

    /// Create the internal listener of wildcard listener `parent` on `entry` (cma.c's
    /// `cma_listen_on_dev`). Called with the registry's listen lock held. Errors: the
    /// device's listen failed ([`CmError::Iw`], e.g. its port taken); a device being
    /// removed, or a parent no longer listening, is no error.
    pub(crate) fn create_internal(
        parent: &Arc<Self>,
        entry: &Arc<DevEntry<D>>,
    ) -> Result<(), CmError> {
        let (port, backlog) = {
            let pst = lock(&parent.st);
            if pst.state.get() != IdState::Listen
                || !pst.wildcard
                || pst.internal.iter().any(|(d, _)| *d == entry.serial)
            {
                return Ok(());
            }
            (pst.local.map_or(0, |l| l.port()), pst.backlog)
        };
        let int = IdInner::new(
            &parent.shared,
            Role::Internal {
                parent: parent.clone(),
            },
            Delivery::Inert,
            IdState::Listen,
        );
        bump(&parent.shared.counters.internal_listeners);
        if entry.attach(&int).is_err() {
            let _ = int.exch(&mut lock(&int.st), Input::Destroy);
            sub(&parent.shared.counters.internal_listeners, 1);
            return Ok(());
        }
        lock(&int.st).device = Some(entry.clone());
        let Some(iw) = entry.create_iw_id(Self::listen_iw_handler(parent, entry)) else {
            Self::internal_teardown(&int);
            return Ok(());
        };
        let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port));
        if let Err(e) = iw.listen(addr, backlog) {
            tracing::warn!(parent: &parent.span, device = %entry.name, error = %e, "wildcard listen on a device failed");
            bump(&parent.shared.counters.internal_listen_failures);
            let _ = iw.destroy();
            Self::internal_teardown(&int);
            return Err(e.into());
        }
        *lock(&int.ops) = Some(iw);
        let kept = {
            let mut pst = lock(&parent.st);
            if pst.state.get() == IdState::Listen && pst.wildcard {
                pst.internal.push((entry.serial, int.clone()));
                true
            } else {
                false
            }
        };
        if kept {
            tracing::debug!(parent: &parent.span, device = %entry.name, internal = int.serial, "listening on a device");
        } else {
            Self::internal_teardown(&int);
        }
        Ok(())
    }
}
