//! The public calls of an id: [`CmIdRef`] (`rdma_bind_addr`, `rdma_resolve_addr`,
//! `rdma_resolve_route`, `rdma_create_qp`, `rdma_connect`, `rdma_listen`, `rdma_accept`,
//! `rdma_reject`, `rdma_disconnect`, the getters) and [`CmId`] (`rdma_destroy_id`).
//! Each takes the id's `ops` lock, checks and writes the state through the machine,
//! and calls the device or the iWARP CM outside `st`.

use super::{CmId, CmIdRef, IdInner, IdSt, Job};
use crate::device::{CmDevice, NeighborDone, NeighborRequest, QpOf, ResolveError};
use crate::error::CmError;
use crate::machine::{step, IdState, Input, Refused};
use crate::route::RouteError;
use crate::sync::{lock, Arc};
use core::fmt;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

/// Whether the machine accepts `input` in the id's state (a user call's check, made
/// before the work that precedes its write).
fn check<D: CmDevice>(st: &IdSt<D>, input: Input) -> Result<(), CmError> {
    step(st.state.get(), input).map(drop).map_err(CmError::from)
}

fn v4(addr: SocketAddr) -> Result<SocketAddrV4, CmError> {
    match addr {
        SocketAddr::V4(a) => Ok(a),
        SocketAddr::V6(_) => Err(CmError::AddressFamily(addr)),
    }
}

/// The parameters of [`CmIdRef::connect`] and [`CmIdRef::accept`] (librdmacm's
/// `struct rdma_conn_param`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data for the MPA Request / Reply (at most
    /// [`iw_cm::MAX_PRIVATE_DATA`] bytes).
    pub private_data: Vec<u8>,
    /// The RDMA Reads we accept from the peer at once: our IRD (iWARP maps
    /// `responder_resources` to IRD).
    pub responder_resources: u16,
    /// The RDMA Reads we issue at once: our ORD (`initiator_depth` -> ORD).
    pub initiator_depth: u16,
    /// Transport retries (a 3-bit field, 0..=7). iWARP runs over TCP, which retries on
    /// its own: checked, then ignored, as the kernel's iWARP path does.
    pub retry_count: u8,
    /// RNR retries (3-bit, 0..=7). Ignored by iWARP, checked.
    pub rnr_retry_count: u8,
}

impl ConnParam {
    /// Parameters with our IRD (`responder_resources`: the RDMA Reads we accept at
    /// once) and ORD (`initiator_depth`: the RDMA Reads we issue at once), no private
    /// data, retry counts 0.
    ///
    /// ```
    /// let p = rdma_cm::ConnParam::new(4, 4).with_private_data(b"hello".to_vec());
    /// assert_eq!((p.responder_resources, p.initiator_depth), (4, 4));
    /// assert_eq!(p.private_data, b"hello");
    /// ```
    pub fn new(responder_resources: u16, initiator_depth: u16) -> ConnParam {
        ConnParam {
            responder_resources,
            initiator_depth,
            ..ConnParam::default()
        }
    }

    /// The same, with `private_data` for the MPA Request / Reply (at most
    /// [`iw_cm::MAX_PRIVATE_DATA`] bytes; checked by `connect`/`accept`).
    pub fn with_private_data(self, private_data: impl Into<Vec<u8>>) -> ConnParam {
        ConnParam {
            private_data: private_data.into(),
            ..self
        }
    }

    /// The same, with `retry_count` (0..=7; checked by `connect`/`accept`, then
    /// ignored by iWARP).
    pub fn with_retry_count(self, retry_count: u8) -> ConnParam {
        ConnParam {
            retry_count,
            ..self
        }
    }

    fn check(&self) -> Result<(), CmError> {
        if self.retry_count > 7 {
            return Err(CmError::InvalidArgument {
                what: "retry_count (0..=7)",
            });
        }
        if self.rnr_retry_count > 7 {
            return Err(CmError::InvalidArgument {
                what: "rnr_retry_count (0..=7)",
            });
        }
        if self.private_data.len() > iw_cm::MAX_PRIVATE_DATA {
            return Err(CmError::InvalidArgument {
                what: "private_data (at most 512 bytes)",
            });
        }
        Ok(())
    }
}

impl<D: CmDevice> Clone for CmIdRef<D> {
    fn clone(&self) -> Self {
        CmIdRef {
            inner: self.inner.clone(),
        }
    }
}

impl<D: CmDevice> fmt::Debug for CmIdRef<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmIdRef")
            .field("serial", &self.inner.serial)
            .field("state", &self.state())
            .finish()
    }
}

impl<D: CmDevice> CmIdRef<D> {
    /// The id's serial number, unique within its [`crate::RdmaCm`] (tracing spans:
    /// `rdma_cm_id{id=N}`).
    pub fn serial(&self) -> u64 {
        self.inner.serial
    }

    /// The id's state.
    pub fn state(&self) -> IdState {
        self.inner.state()
    }

    /// The name of the device the id is bound to, if any (librdmacm's `id->verbs`).
    pub fn device_name(&self) -> Option<String> {
        lock(&self.inner.st).device.as_ref().map(|d| d.name.clone())
    }

    /// The device the id is bound to, if any (librdmacm's `id->verbs`): e.g. to
    /// allocate the PD and CQs of a `ConnectRequest`'s new id on the device the request
    /// came in on. `None` before the id is bound, after it was destroyed, and once the
    /// device was released.
    pub fn device(&self) -> Option<std::sync::Arc<D>> {
        let entry = lock(&self.inner.st).device.clone();
        entry.and_then(|e| e.device())
    }

    /// The local address (`rdma_get_local_addr`): the bound address, the source
    /// chosen by `resolve_addr` (port 0 unless bound: the device picks the TCP port at
    /// connect), or our end of an incoming connection.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        lock(&self.inner.st).local.map(SocketAddr::V4)
    }

    /// The peer's address (`rdma_get_peer_addr`): `resolve_addr`'s destination, or the
    /// initiator of an incoming connection.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        lock(&self.inner.st).peer.map(SocketAddr::V4)
    }

    /// The next hop `resolve_addr` resolved (the destination or a gateway).
    pub fn next_hop(&self) -> Option<Ipv4Addr> {
        lock(&self.inner.st).next_hop
    }

    /// Bind to a local address and port (`rdma_bind_addr`): IDLE -> ADDR_BOUND. A
    /// specific address binds the id to the device that owns it; the wildcard
    /// `0.0.0.0` binds no device (a later `listen` listens on every device). Port 0
    /// picks a free ephemeral port.
    ///
    /// # Errors
    /// [`CmError::AddressFamily`] for IPv6; [`CmError::InvalidState`] unless IDLE;
    /// [`CmError::AddressNotAvailable`] if no device has the address;
    /// [`CmError::AddressInUse`] / [`CmError::NoPorts`];
    /// [`CmError::DeviceRemoved`] if the device is being removed.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<(), CmError> {
        let a = v4(addr)?;
        let inner = &self.inner;
        let _span = inner.span.enter();
        let _ops = lock(&inner.ops);
        let ip = *a.ip();
        let entry = if ip.is_unspecified() {
            None
        } else {
            Some(
                inner
                    .shared
                    .device_owning(ip)
                    .ok_or(CmError::AddressNotAvailable(ip.into()))?,
            )
        };
        let mut st = lock(&inner.st);
        check(&st, Input::BindAddr)?;
        let port = inner.shared.reserve_port(ip, a.port(), inner.serial)?;
        if let Some(e) = &entry {
            if let Err(err) = e.attach(inner) {
                inner.shared.release_port(ip, port, inner.serial);
                return Err(err);
            }
        }
        let _ = inner.exch(&mut st, Input::BindAddr);
        st.local = Some(SocketAddrV4::new(ip, port));
        st.port = Some((ip, port));
        st.device = entry;
        tracing::debug!(local = ?st.local, device = ?st.device.as_ref().map(|d| d.name.clone()), "bound");
        Ok(())
    }

    /// Resolve a destination (`rdma_resolve_addr`): IDLE/ADDR_BOUND -> ADDR_QUERY. Picks
    /// the device and source address whose subnet or gateway reaches `dst` (see
    /// [`crate::route`]), then resolves the next hop through the device's
    /// [`CmDevice::resolve_neighbor`]. The outcome arrives as `AddrResolved` (the id is
    /// now bound to that device) or `AddrError` (`-ENETUNREACH` when no device reaches
    /// it, `-ETIMEDOUT` after `timeout`, the device's error otherwise; the id goes to
    /// ADDR_BOUND). `src` (only its address is used) or a bound address restricts the
    /// choice to the device that owns it.
    ///
    /// # Errors
    /// [`CmError::AddressFamily`]; [`CmError::InvalidState`] unless IDLE or ADDR_BOUND;
    /// [`CmError::AddressNotAvailable`] if `src` belongs to no device;
    /// [`CmError::InvalidArgument`] if `dst` is not unicast or `src` differs from the
    /// bound address.
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<(), CmError> {
        let dst = v4(dst)?;
        let src = src.map(v4).transpose()?.map(|s| *s.ip());
        let inner = &self.inner;
        let _span = inner.span.enter();
        let _ops = lock(&inner.ops);
        let (gen, prev, src) = {
            let mut st = lock(&inner.st);
            check(&st, Input::ResolveAddr)?;
            let bound = st.local.map(|l| *l.ip()).filter(|ip| !ip.is_unspecified());
            let src = match (src, bound) {
                (Some(s), Some(b)) if s != b => {
                    return Err(CmError::InvalidArgument {
                        what: "src (differs from the bound address)",
                    })
                }
                (s, b) => s.or(b),
            };
            let prev = inner.exch(&mut st, Input::ResolveAddr)?;
            st.query_gen += 1;
            st.peer = Some(dst);
            (st.query_gen, prev, src)
        };
        let (entries, routes) = inner.shared.route_snapshot(Some(*dst.ip()));
        let route = match crate::route::select_route(&routes, *dst.ip(), src) {
            Ok(r) => r,
            Err(e @ (RouteError::SourceNotLocal(_) | RouteError::NotUnicast(_))) => {
                let mut st = lock(&inner.st);
                if inner.exch(&mut st, Input::ResolveAddrUndo(prev)).is_ok() {
                    st.peer = None;
                }
                return Err(match e {
                    RouteError::SourceNotLocal(s) => CmError::AddressNotAvailable(s.into()),
                    _ => CmError::InvalidArgument {
                        what: "dst (not a unicast address)",
                    },
                });
            }
            Err(RouteError::Unreachable(_)) => {
                tracing::debug!(%dst, "no device reaches the destination");
                inner.shared.push_job(Job::AddrDone {
                    id: inner.clone(),
                    gen,
                    entry: None,
                    src: Ipv4Addr::UNSPECIFIED,
                    next_hop: *dst.ip(),
                    result: Err(ResolveError::NetUnreachable),
                });
                return Ok(());
            }
        };
        let entry = entries[route.device].clone();
        tracing::debug!(%dst, device = %entry.name, src = %route.src, next_hop = %route.next_hop, kind = ?route.kind, "route chosen; resolving the next hop");
        inner.shared.add_timer(inner, gen, timeout);
        let done = {
            let (shared, id, e) = (inner.shared.clone(), inner.clone(), entry.clone());
            let (src, next_hop) = (route.src, route.next_hop);
            NeighborDone::new(inner.serial, entry.name.clone(), next_hop, move |result| {
                shared.push_job(Job::AddrDone {
                    id,
                    gen,
                    entry: Some(e),
                    src,
                    next_hop,
                    result,
                });
            })
        };
        match entry.device() {
            Some(dev) => dev.resolve_neighbor(
                NeighborRequest {
                    dst: *dst.ip(),
                    src: route.src,
                    next_hop: route.next_hop,
                    timeout,
                },
                done,
            ),
            None => done.complete(Err(ResolveError::DeviceGone)),
        }
        Ok(())
    }

    /// Resolve the route (`rdma_resolve_route`): ADDR_RESOLVED -> ROUTE_QUERY. For
    /// iWARP the route is the resolved address (cma.c's `cma_resolve_iw_route`): the
    /// worker delivers `RouteResolved`, or `RouteError` if the device is going away.
    /// `timeout` is accepted for the API's sake.
    ///
    /// # Errors
    /// [`CmError::InvalidState`] unless ADDR_RESOLVED; [`CmError::DeviceRemoved`].
    pub fn resolve_route(&self, timeout: Duration) -> Result<(), CmError> {
        let _ = timeout;
        let inner = &self.inner;
        let _span = inner.span.enter();
        let _ops = lock(&inner.ops);
        let gen = {
            let mut st = lock(&inner.st);
            inner.exch(&mut st, Input::ResolveRoute)?;
            st.query_gen += 1;
            st.query_gen
        };
        inner.shared.push_job(Job::RouteDone {
            id: inner.clone(),
            gen,
        });
        Ok(())
    }

    /// Create a QP on the id's device (`rdma_create_qp`), through
    /// [`CmDevice::create_qp`]; the id keeps a handle (used by `connect`/`accept`, and
    /// moved to ERROR if the device is removed). Returns the QP. `attr` is the device's
    /// QP attributes, or anything that converts into them (a soft device takes its
    /// `QpInitAttr` alone or with an SRQ).
    ///
    /// # Errors
    /// [`CmError::NoDevice`] if the id is not bound to a device; [`CmError::QpExists`];
    /// [`CmError::DeviceRemoved`]; [`CmError::InvalidState`] on a destroyed id or a
    /// listener; [`CmError::Verbs`] from the device.
    pub fn create_qp<'a>(
        &self,
        pd: &D::Pd,
        attr: impl Into<D::QpInitAttr<'a>>,
    ) -> Result<QpOf<D>, CmError> {
        let attr = attr.into();
        let inner = &self.inner;
        let _span = inner.span.enter();
        let _ops = lock(&inner.ops);
        let entry = {
            let st = lock(&inner.st);
            check(&st, Input::CreateQp)?;
            if st.qp.is_some() {
                return Err(CmError::QpExists);
            }
            st.device
                .clone()
                .ok_or(CmError::NoDevice { op: "create_qp" })?
        };
        let dev = entry
            .device()
            .ok_or(CmError::DeviceRemoved { op: "create_qp" })?;
        let qp = dev.create_qp(pd, attr)?;
        let mut st = lock(&inner.st);
        if matches!(st.state.get(), IdState::Destroying | IdState::DeviceRemoval) {
            let err = CmError::from(Refused {
                state: st.state.get(),
                input: Input::CreateQp,
            });
            drop(st);
            dev.destroy_qp(qp);
            return Err(err);
        }
        st.qp = Some(qp.clone());
        Ok(qp)
    }

    /// The id's QP, if any (`id->qp`).
    pub fn qp(&self) -> Option<QpOf<D>> {
        lock(&self.inner.st).qp.clone()
    }

    /// The QP the id's connection uses: its own, else the one named at
    /// [`CmIdRef::connect_with_qp`] / [`CmIdRef::accept_with_qp`].
    pub fn conn_qp(&self) -> Option<QpOf<D>> {
        let st = lock(&self.inner.st);
        st.qp.clone().or_else(|| st.user_qp.clone())
    }

    /// Whether the id has an iWARP CM id (the kernel's `id_priv->cm_id.iw`): from a
    /// `connect` or a `listen` on one device until destroy, and for the new id of a
    /// connect request (a wildcard listener has none of its own). `rdma_init_qp_attr`
    /// answers from it.
    pub fn has_iw_id(&self) -> bool {
        lock(&self.inner.ops).is_some()
    }

    /// Move the id to `channel` (`rdma_migrate_id`; librdmacm's synchronous endpoints
    /// move the new id of a connect request to a channel of its own): its events not
    /// yet taken (its own, and a listener's connect requests) move there in order, and
    /// later ones are queued there. Events already handed out stay counted against the
    /// id until acked (librdmacm's `rdma_migrate_id` waits for those acks; a caller
    /// that wants that waits before). Done under the id's handler lock, so no event of
    /// the id is queued meanwhile.
    ///
    /// # Errors
    /// [`CmError::InvalidState`] on a destroyed id; [`CmError::InvalidArgument`] for an
    /// id that delivers to a callback (it has no channel to leave).
    pub fn migrate(&self, channel: &crate::EventChannel<D>) -> Result<(), CmError> {
        let inner = &self.inner;
        let _span = inner.span.enter();
        let _guard = inner.lock_handler();
        let mut st = lock(&inner.st);
        if matches!(st.state.get(), IdState::Destroying) {
            return Err(CmError::InvalidState {
                op: "migrate",
                state: st.state.get(),
            });
        }
        let super::Delivery::Channel(old) = &st.delivery else {
            return Err(CmError::InvalidArgument {
                what: "migrate: the id delivers to a callback",
            });
        };
        let new: std::sync::Arc<dyn super::ChannelQueue<D>> = channel.inner.clone();
        for item in old.take_owned(inner.serial) {
            new.push(item);
        }
        st.delivery = super::Delivery::Channel(new);
        tracing::debug!("migrated to another event channel");
        Ok(())
    }

    /// Destroy the id's QP (`rdma_destroy_qp`), through [`CmDevice::destroy_qp`]. Safe
    /// at any time, including after the device was removed; a no-op without a QP.
    pub fn destroy_qp(&self) {
        let inner = &self.inner;
        let _ops = lock(&inner.ops);
        let (qp, entry) = {
            let mut st = lock(&inner.st);
            (st.qp.take(), st.device.clone())
        };
        if let Some(qp) = qp {
            match entry {
                Some(e) => e.destroy_qp(qp),
                None => drop(qp),
            }
        }
    }

    /// Connect (`rdma_connect`): ROUTE_RESOLVED -> CONNECT, through the device's iWARP
    /// CM (`iw_cm_connect` with `ird` = `responder_resources`, `ord` =
    /// `initiator_depth`). The outcome arrives as `Established`, `Rejected`,
    /// `Unreachable` or `ConnectError` (cma.c's `cma_iw_handler` mapping).
    ///
    /// # Errors
    /// [`CmError::InvalidArgument`] (`param`); [`CmError::InvalidState`] unless
    /// ROUTE_RESOLVED; [`CmError::NoQp`]; [`CmError::DeviceRemoved`]; [`CmError::Iw`]
    /// if the iWARP CM or the provider refuses (the id is back to ROUTE_RESOLVED).
    pub fn connect(&self, param: &ConnParam) -> Result<(), CmError> {
        self.connect_inner(param, None)
    }

    /// [`CmIdRef::connect`] with `qp`, a QP of the id's device that the id does not own
    /// (librdmacm's `rdma_connect` with `conn_param->qp_num` on an id without a QP: the
    /// kernel's `cma_connect_iw` passes that number to `iw_cm_connect`). The id's own
    /// QP, if it has one, is used instead (`qp_num` is then ignored, as in cma.c). The
    /// iWARP CM holds `qp` for the connection; the id never destroys it, and moves it
    /// to ERROR on device removal as its own.
    ///
    /// # Errors
    /// As [`CmIdRef::connect`] (never [`CmError::NoQp`]).
    pub fn connect_with_qp(&self, param: &ConnParam, qp: QpOf<D>) -> Result<(), CmError> {
        self.connect_inner(param, Some(qp))
    }

    /// `connect` with the id's own QP, else `user_qp`.
    fn connect_inner(&self, param: &ConnParam, user_qp: Option<QpOf<D>>) -> Result<(), CmError> {
        param.check()?;
        let inner = &self.inner;
        let _span = inner.span.enter();
        let mut ops = lock(&inner.ops);
        let (entry, qp, local, peer) = {
            let mut st = lock(&inner.st);
            check(&st, Input::Connect)?;
            let qp = st
                .qp
                .clone()
                .or_else(|| user_qp.clone())
                .ok_or(CmError::NoQp { op: "connect" })?;
            let entry = st
                .device
                .clone()
                .ok_or(CmError::NoDevice { op: "connect" })?;
            let (Some(local), Some(peer)) = (st.local, st.peer) else {
                return Err(CmError::InvalidState {
                    op: "connect",
                    state: st.state.get(),
                });
            };
            let _ = inner.exch(&mut st, Input::Connect);
            (entry, qp, local, peer)
        };
        let rollback = |inner: &IdInner<D>| {
            let _ = inner.exch(&mut lock(&inner.st), Input::ConnectUndo);
        };
        let Some(iw) = entry.create_iw_id(IdInner::conn_iw_handler(inner)) else {
            rollback(inner);
            return Err(CmError::DeviceRemoved { op: "connect" });
        };
        let params = iw_cm::ConnectParams {
            qp,
            local_addr: Some(SocketAddr::V4(local)),
            remote_addr: SocketAddr::V4(peer),
            private_data: param.private_data.clone(),
            ird: param.responder_resources,
            ord: param.initiator_depth,
        };
        let iw = ops.insert(iw);
        match iw.connect(params) {
            Ok(()) => {
                tracing::debug!(%peer, "connecting");
                let mut st = lock(&inner.st);
                if st.qp.is_none() {
                    st.user_qp = user_qp;
                }
                Ok(())
            }
            Err(e) => {
                if let Some(iw) = ops.take() {
                    let _ = iw.destroy();
                }
                rollback(inner);
                Err(e.into())
            }
        }
    }

    /// Listen (`rdma_listen`): ADDR_BOUND (or IDLE, which binds `0.0.0.0` and an
    /// ephemeral port) -> LISTEN. Bound to a device's address: listens on that device.
    /// Bound to the wildcard: one internal listener per registered device, and one on
    /// every device added later (cma.c's `cma_listen_on_all` / `cma_add_one`); a
    /// device's removal silently ends only its internal listener. `backlog` 0 uses the
    /// configured default. Connection requests arrive as `ConnectRequest` events.
    ///
    /// # Errors
    /// [`CmError::InvalidState`]; [`CmError::DeviceRemoved`]; [`CmError::NoPorts`];
    /// [`CmError::Iw`] if the device's listen fails, for a wildcard listen any
    /// registered device's (e.g. its port taken; the id is back to ADDR_BOUND, no
    /// device listens).
    pub fn listen(&self, backlog: u32) -> Result<(), CmError> {
        let inner = &self.inner;
        let _span = inner.span.enter();
        let mut ops = lock(&inner.ops);
        let backlog = if backlog == 0 {
            inner.shared.config.default_backlog
        } else {
            backlog
        };
        let (local, entry) = {
            let mut st = lock(&inner.st);
            check(&st, Input::Listen)?;
            if st.state.get() == IdState::Idle {
                // Binds the wildcard address; the machine goes IDLE -> LISTEN at once
                // (nothing can fail in between, and `st` stays locked).
                let port = inner
                    .shared
                    .reserve_port(Ipv4Addr::UNSPECIFIED, 0, inner.serial)?;
                st.local = Some(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port));
                st.port = Some((Ipv4Addr::UNSPECIFIED, port));
            }
            let Some(local) = st.local else {
                return Err(CmError::InvalidState {
                    op: "listen",
                    state: st.state.get(),
                });
            };
            let _ = inner.exch(&mut st, Input::Listen);
            st.backlog = backlog;
            st.wildcard = st.device.is_none();
            (local, st.device.clone())
        };
        match entry {
            Some(entry) => {
                let rollback = |inner: &IdInner<D>| {
                    let _ = inner.exch(&mut lock(&inner.st), Input::ListenUndo);
                };
                let Some(iw) = entry.create_iw_id(IdInner::listen_iw_handler(inner, &entry)) else {
                    rollback(inner);
                    return Err(CmError::DeviceRemoved { op: "listen" });
                };
                if let Err(e) = iw.listen(SocketAddr::V4(local), backlog) {
                    let _ = iw.destroy();
                    rollback(inner);
                    return Err(e.into());
                }
                *ops = Some(iw);
                tracing::debug!(%local, device = %entry.name, "listening");
            }
            None => {
                tracing::debug!(%local, "listening on every device");
                if let Err(e) = inner.shared.listen_any(inner) {
                    // As cma.c's `cma_listen_on_all`: one device's failure fails the
                    // listen; the devices already listening stop.
                    let made = core::mem::take(&mut lock(&inner.st).internal);
                    for (_, int) in made {
                        IdInner::internal_teardown(&int);
                    }
                    let _ = inner.exch(&mut lock(&inner.st), Input::ListenUndo);
                    tracing::debug!(%local, error = %e, "wildcard listen failed");
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Accept the connection request this new id was made for (`rdma_accept`), with
    /// the id's QP (`iw_cm_accept`, `ird` = `responder_resources`, `ord` =
    /// `initiator_depth`). `Established` follows (or `Disconnected` if the connection
    /// fails first).
    ///
    /// # Errors
    /// [`CmError::InvalidArgument`]; [`CmError::InvalidState`] unless a new id in
    /// CONNECT not accepted yet; [`CmError::NoQp`]; [`CmError::DeviceRemoved`];
    /// [`CmError::Iw`].
    pub fn accept(&self, param: &ConnParam) -> Result<(), CmError> {
        self.accept_inner(param, None)
    }

    /// [`CmIdRef::accept`] with `qp`, a QP of the id's device that the id does not own
    /// (librdmacm's `rdma_accept` with `conn_param->qp_num` on an id without a QP:
    /// cma.c's `cma_accept_iw`). The id's own QP, if it has one, is used instead; the
    /// id never destroys `qp` (see [`CmIdRef::connect_with_qp`]).
    ///
    /// # Errors
    /// As [`CmIdRef::accept`] (never [`CmError::NoQp`]).
    pub fn accept_with_qp(&self, param: &ConnParam, qp: QpOf<D>) -> Result<(), CmError> {
        self.accept_inner(param, Some(qp))
    }

    /// `accept` with the id's own QP, else `user_qp`.
    fn accept_inner(&self, param: &ConnParam, user_qp: Option<QpOf<D>>) -> Result<(), CmError> {
        param.check()?;
        let inner = &self.inner;
        let _span = inner.span.enter();
        let ops = lock(&inner.ops);
        let qp = {
            let mut st = lock(&inner.st);
            check(&st, Input::Accept)?;
            if !st.passive || st.accepted {
                return Err(CmError::InvalidState {
                    op: "accept",
                    state: st.state.get(),
                });
            }
            let qp = st
                .qp
                .clone()
                .or_else(|| user_qp.clone())
                .ok_or(CmError::NoQp { op: "accept" })?;
            st.accepted = true;
            qp
        };
        let result = match ops.as_ref() {
            Some(iw) => iw
                .accept(iw_cm::AcceptParams {
                    qp,
                    private_data: param.private_data.clone(),
                    ird: param.responder_resources,
                    ord: param.initiator_depth,
                })
                .map_err(CmError::from),
            None => Err(CmError::InvalidState {
                op: "accept",
                state: IdState::Connect,
            }),
        };
        let mut st = lock(&inner.st);
        match &result {
            Err(_) => st.accepted = false,
            Ok(()) if st.qp.is_none() => st.user_qp = user_qp,
            Ok(()) => {}
        }
        result
    }

    /// Reject the connection request this new id was made for (`rdma_reject`), with
    /// `private_data` for the peer's `Rejected` event. The id goes to DISCONNECT;
    /// destroy it.
    ///
    /// # Errors
    /// [`CmError::InvalidArgument`]; [`CmError::InvalidState`] unless a new id in
    /// CONNECT not accepted; [`CmError::DeviceRemoved`]; [`CmError::Iw`].
    pub fn reject(&self, private_data: &[u8]) -> Result<(), CmError> {
        if private_data.len() > iw_cm::MAX_PRIVATE_DATA {
            return Err(CmError::InvalidArgument {
                what: "private_data (at most 512 bytes)",
            });
        }
        let inner = &self.inner;
        let _span = inner.span.enter();
        let ops = lock(&inner.ops);
        {
            let st = lock(&inner.st);
            check(&st, Input::Reject)?;
            if !st.passive || st.accepted {
                return Err(CmError::InvalidState {
                    op: "reject",
                    state: st.state.get(),
                });
            }
        }
        if let Some(iw) = ops.as_ref() {
            iw.reject(private_data)?;
        }
        let _ = inner.exch(&mut lock(&inner.st), Input::Reject);
        Ok(())
    }

    /// Disconnect (`rdma_disconnect`; for iWARP a graceful `iw_cm_disconnect`):
    /// CONNECT/ESTABLISHED -> DISCONNECT. `Disconnected` follows when the connection is
    /// closed.
    ///
    /// # Errors
    /// [`CmError::InvalidState`] unless CONNECT or ESTABLISHED;
    /// [`CmError::DeviceRemoved`]; [`CmError::Iw`] (e.g. `Busy` while a connect is
    /// still in flight: wait for its outcome or destroy the id).
    pub fn disconnect(&self) -> Result<(), CmError> {
        let inner = &self.inner;
        let _span = inner.span.enter();
        let ops = lock(&inner.ops);
        check(&lock(&inner.st), Input::Disconnect)?;
        if let Some(iw) = ops.as_ref() {
            iw.disconnect(iw_cm::DisconnectMode::Graceful)?;
        }
        let _ = inner.exch(&mut lock(&inner.st), Input::Disconnect);
        Ok(())
    }
}

impl<D: CmDevice> fmt::Debug for CmId<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmId")
            .field("serial", &self.r.inner.serial)
            .field("state", &self.r.state())
            .finish()
    }
}

impl<D: CmDevice> core::ops::Deref for CmId<D> {
    type Target = CmIdRef<D>;
    fn deref(&self) -> &CmIdRef<D> {
        &self.r
    }
}

impl<D: CmDevice> CmId<D> {
    pub(crate) fn from_inner(inner: Arc<IdInner<D>>) -> CmId<D> {
        CmId {
            r: CmIdRef { inner },
            destroyed: false,
        }
    }

    /// A non-owning reference to the id.
    pub fn as_ref(&self) -> CmIdRef<D> {
        self.r.clone()
    }

    /// Destroy the id (`rdma_destroy_id`):
    ///
    /// 1. mark it DESTROYING (from then on no callback starts, device removal delivers
    ///    nothing to it);
    /// 2. wait for a callback of the id in progress on another thread (cma.c takes and
    ///    releases `handler_mutex`);
    /// 3. tear down: the iWARP CM id (a connection is aborted, its QP moved to ERROR; a
    ///    pending request rejected; a listener stops, on every device), the QP handle,
    ///    the port, the device binding (the last id of a device being removed lets the
    ///    device be released), queued channel events;
    /// 4. for an id on an event channel, wait until every event of it that was handed
    ///    out has been acked (librdmacm).
    ///
    /// After it returns, no callback of the id runs and none will.
    ///
    /// # Errors
    /// Refused, with the id given back undestroyed, in the two cases where librdmacm
    /// and the kernel would wait forever:
    /// [`CmError::DestroyInOwnCallback`] from inside a callback of this id (return
    /// [`crate::Disposition::Destroy`] instead, or drop the `CmId`: dropping it there
    /// destroys it as the callback returns); [`CmError::UnackedEvents`] while the
    /// calling thread holds un-acked channel events of it (dropping the `CmId` then
    /// destroys it without waiting for those acks).
    pub fn destroy(mut self) -> Result<(), DestroyRefused<D>> {
        match IdInner::destroy(&self.r.inner, true) {
            Ok(()) => {
                self.destroyed = true;
                Ok(())
            }
            Err(error) => Err(DestroyRefused { id: self, error }),
        }
    }
}

impl<D: CmDevice> Drop for CmId<D> {
    fn drop(&mut self) {
        if !self.destroyed {
            self.destroyed = true;
            let _ = IdInner::destroy(&self.r.inner, false);
        }
    }
}

/// [`CmId::destroy`] refused: the id, undestroyed, and why.
pub struct DestroyRefused<D: CmDevice> {
    /// The id, still alive.
    pub id: CmId<D>,
    /// Why.
    pub error: CmError,
}

impl<D: CmDevice> fmt::Debug for DestroyRefused<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DestroyRefused")
            .field("id", &self.id.serial())
            .field("error", &self.error)
            .finish()
    }
}

impl<D: CmDevice> fmt::Display for DestroyRefused<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<D: CmDevice> std::error::Error for DestroyRefused<D> {}
