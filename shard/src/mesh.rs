//! Cross-shard request/reply over glommio's channel mesh.
//!
//! Two full meshes are built at start-up: one carries requests, one carries replies.
//! Every channel is bounded ([`MeshLimits::channel_capacity`]); a sender waits when the
//! receiver falls behind, which is the backpressure between cores. A request carries a
//! correlation id chosen by the caller's shard; the reply comes back on the reply mesh
//! with that id and completes the caller's pending slot. No lock anywhere: each shard
//! only touches its own pending map, and payloads (e.g. `Bytes` of record batches)
//! move through the channel without being copied.
//!
//! A request to the calling shard itself does not touch the mesh: the handler runs in
//! place. The handler of remote requests runs as its own task, so a slow request (a
//! long-poll fetch) does not hold up the ones behind it; at most
//! [`MeshLimits::inflight_max`] remote requests run on a shard at once.

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

use glommio::channels::channel_mesh::{Full, MeshBuilder, Receivers, Senders};
use glommio::channels::local_channel::{self, LocalSender};
use glommio::sync::Semaphore;

use crate::ShardId;

/// Why a cross-shard call failed. Both mean the target shard is shutting down.
#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    #[error("channel to {0} is closed")]
    Closed(ShardId),
    #[error("{0} dropped the request without replying")]
    NoReply(ShardId),
}

/// Bounds of the mesh, fixed at start-up.
#[derive(Debug, Clone, Copy)]
pub struct MeshLimits {
    /// Messages buffered per (sender shard, receiver shard) channel.
    pub channel_capacity: usize,
    /// Remote requests a shard handles concurrently; more wait in the channel.
    pub inflight_max: u64,
}

impl Default for MeshLimits {
    fn default() -> Self {
        MeshLimits {
            channel_capacity: 1024,
            inflight_max: 4096,
        }
    }
}

/// A request on the wire between shards.
pub struct Envelope<Req> {
    correlation: u64,
    req: Req,
}

/// A reply on the wire between shards.
pub struct Reply<Resp> {
    correlation: u64,
    resp: Resp,
}

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T>>>;
pub type Handler<Req, Resp> = Rc<dyn Fn(ShardId, Req) -> BoxFuture<Resp>>;

/// The builders every shard joins; create once, clone into each executor.
pub struct MeshBuilders<Req: Send + 'static, Resp: Send + 'static> {
    requests: MeshBuilder<Envelope<Req>, Full>,
    replies: MeshBuilder<Reply<Resp>, Full>,
}

impl<Req: Send + 'static, Resp: Send + 'static> Clone for MeshBuilders<Req, Resp> {
    fn clone(&self) -> Self {
        MeshBuilders {
            requests: self.requests.clone(),
            replies: self.replies.clone(),
        }
    }
}

impl<Req: Send + 'static, Resp: Send + 'static> MeshBuilders<Req, Resp> {
    pub fn new(shard_count: usize, limits: MeshLimits) -> Self {
        MeshBuilders {
            requests: MeshBuilder::full(shard_count, limits.channel_capacity),
            replies: MeshBuilder::full(shard_count, limits.channel_capacity),
        }
    }
}

/// One shard's end of the mesh.
pub struct Mesh<Req: Send + 'static, Resp: Send + 'static> {
    id: ShardId,
    shard_count: usize,
    requests: Option<Senders<Envelope<Req>>>,
    replies: Option<Rc<Senders<Reply<Resp>>>>,
    /// Calls waiting for their reply: the shard each was sent to, and where its reply goes.
    pending: RefCell<HashMap<u64, (ShardId, LocalSender<Resp>)>>,
    next_correlation: Cell<u64>,
    /// Replies that arrived after their call was dropped (see [`Mesh::abandoned_replies`]).
    abandoned: Cell<u64>,
    handler: OnceCell<Handler<Req, Resp>>,
    inflight: Rc<Semaphore>,
}

impl<Req: Send + 'static, Resp: Send + 'static> Mesh<Req, Resp> {
    /// Joins the mesh on the current executor. Every shard must call this (it waits
    /// for all of them). `id` must be this shard's index. Call [`Mesh::serve`] next.
    pub async fn join(
        id: ShardId,
        shard_count: usize,
        builders: MeshBuilders<Req, Resp>,
        limits: MeshLimits,
    ) -> Result<(Rc<Self>, MeshReceivers<Req, Resp>), MeshError> {
        let (req_tx, req_rx, rep_tx, rep_rx) = if shard_count > 1 {
            let (req_tx, req_rx) = builders
                .requests
                .join()
                .await
                .map_err(|_| MeshError::Closed(id))?;
            let (rep_tx, rep_rx) = builders
                .replies
                .join()
                .await
                .map_err(|_| MeshError::Closed(id))?;
            assert_eq!(
                req_tx.peer_id(),
                rep_tx.peer_id(),
                "both meshes agree on shard ids"
            );
            (
                Some(req_tx),
                Some(req_rx),
                Some(Rc::new(rep_tx)),
                Some(rep_rx),
            )
        } else {
            (None, None, None, None)
        };
        // glommio numbers peers by executor id, and executors get ids in the order they
        // are spawned: `spawn_shards` spawns them in shard order, so the numbers agree.
        // Routing depends on it, hence the hard check.
        if let Some(tx) = &req_tx {
            assert_eq!(
                tx.peer_id(),
                id.0,
                "mesh peer id must equal the shard index"
            );
        }
        let mesh = Rc::new(Mesh {
            id,
            shard_count,
            requests: req_tx,
            replies: rep_tx,
            pending: RefCell::new(HashMap::new()),
            next_correlation: Cell::new(1),
            abandoned: Cell::new(0),
            handler: OnceCell::new(),
            inflight: Rc::new(Semaphore::new(limits.inflight_max)),
        });
        Ok((
            mesh,
            MeshReceivers {
                requests: req_rx,
                replies: rep_rx,
            },
        ))
    }

    /// This shard's id (its index in the mesh).
    pub fn id(&self) -> ShardId {
        self.id
    }

    pub fn shard_count(&self) -> usize {
        self.shard_count
    }

    /// Installs the handler of requests and starts the tasks that receive requests and
    /// replies from the other shards.
    pub fn serve(
        self: &Rc<Self>,
        mut receivers: MeshReceivers<Req, Resp>,
        handler: Handler<Req, Resp>,
    ) {
        if self.handler.set(handler).is_err() {
            panic!("Mesh::serve called twice on {}", self.id);
        }
        if let Some(mut rx) = receivers.replies.take() {
            for (from, stream) in rx.streams() {
                let me = Rc::downgrade(self);
                glommio::spawn_local(async move {
                    while let Some(reply) = stream.recv().await {
                        let Some(me) = me.upgrade() else { break };
                        me.complete(ShardId(from), reply);
                    }
                })
                .detach();
            }
        }
        if let Some(mut rx) = receivers.requests.take() {
            for (from, stream) in rx.streams() {
                let me = Rc::downgrade(self);
                glommio::spawn_local(async move {
                    while let Some(env) = stream.recv().await {
                        let Some(me) = me.upgrade() else { break };
                        me.accept(ShardId(from), env).await;
                    }
                })
                .detach();
            }
        }
    }

    fn complete(&self, from: ShardId, reply: Reply<Resp>) {
        let mut pending = self.pending.borrow_mut();
        let slot = pending.remove(&reply.correlation);
        match slot {
            // The caller may have gone away (its connection closed): drop the reply.
            Some((to, tx)) if to == from => {
                let _ = tx.try_send(reply.resp);
            }
            // A reply from a shard the call was not sent to: a routing bug. The call
            // keeps waiting for its own reply.
            Some((to, tx)) => {
                pending.insert(reply.correlation, (to, tx));
                tracing::error!(%from, %to, correlation = reply.correlation, "reply from a shard the call was not sent to")
            }
            // A call issued here and dropped before its reply (a long poll whose
            // sibling answered first, a connection that closed): the reply has no one
            // to go to, which is expected. Counted, not logged above debug.
            None if reply.correlation < self.next_correlation.get() => {
                self.abandoned.set(self.abandoned.get() + 1);
                tracing::debug!(%from, correlation = reply.correlation, "reply for a call dropped before it came")
            }
            // A correlation this shard never issued: a routing bug.
            None => {
                tracing::error!(%from, correlation = reply.correlation, "reply for a request this shard never sent")
            }
        }
    }

    async fn accept(self: &Rc<Self>, from: ShardId, env: Envelope<Req>) {
        let Ok(permit) = self.inflight.clone().acquire_static_permit(1).await else {
            return;
        };
        let handler = self
            .handler
            .get()
            .expect("serve installs the handler")
            .clone();
        let replies = self
            .replies
            .clone()
            .expect("remote request implies a reply mesh");
        glommio::spawn_local(async move {
            let resp = handler(from, env.req).await;
            drop(permit);
            let reply = Reply {
                correlation: env.correlation,
                resp,
            };
            if replies.send_to(from.0, reply).await.is_err() {
                tracing::debug!(%from, "reply channel closed");
            }
        })
        .detach();
    }

    /// How many replies came for calls dropped before them (cancelled waits).
    pub fn abandoned_replies(&self) -> u64 {
        self.abandoned.get()
    }

    /// Sends `req` to shard `to` and waits for its reply. A call to this shard itself
    /// runs the handler in place.
    pub async fn call(&self, to: ShardId, req: Req) -> Result<Resp, MeshError> {
        self.call_then(to, req, || {}).await
    }

    /// Like [`Self::call`]; `sent` runs once the request has its place in the order
    /// `to` starts requests in: for another shard once it is in the channel (FIFO per
    /// shard pair, whose receiver starts handlers in arrival order), for this shard
    /// once the handler has been polled the first time (it ran up to its first wait).
    /// It also runs if the send fails; it is dropped, not run, if this future is.
    pub async fn call_then(
        &self,
        to: ShardId,
        req: Req,
        sent: impl FnOnce(),
    ) -> Result<Resp, MeshError> {
        if to == self.id {
            let handler = self
                .handler
                .get()
                .expect("serve installs the handler")
                .clone();
            let mut running = handler(self.id, req);
            let mut sent = Some(sent);
            return Ok(std::future::poll_fn(|cx| {
                let polled = running.as_mut().poll(cx);
                if let Some(f) = sent.take() {
                    f();
                }
                polled
            })
            .await);
        }
        let Some(requests) = self.requests.as_ref() else {
            sent();
            return Err(MeshError::Closed(to));
        };
        let correlation = self.next_correlation.get();
        self.next_correlation.set(correlation + 1);
        let (tx, rx) = local_channel::new_bounded(1);
        self.pending.borrow_mut().insert(correlation, (to, tx));
        // Remove the slot however this future ends (reply, error, or cancellation).
        type Pending<Resp> = RefCell<HashMap<u64, (ShardId, LocalSender<Resp>)>>;
        struct Forget<'a, Resp>(&'a Pending<Resp>, u64);
        impl<Resp> Drop for Forget<'_, Resp> {
            fn drop(&mut self) {
                self.0.borrow_mut().remove(&self.1);
            }
        }
        let _forget = Forget(&self.pending, correlation);
        let queued = requests.send_to(to.0, Envelope { correlation, req }).await;
        sent();
        if queued.is_err() {
            return Err(MeshError::Closed(to));
        }
        rx.recv().await.ok_or(MeshError::NoReply(to))
    }

    /// Closes this shard's outgoing channels (at shutdown).
    pub fn close(&self) {
        if let Some(r) = &self.requests {
            r.close();
        }
        if let Some(r) = &self.replies {
            r.close();
        }
    }
}

/// The receiving ends, handed to [`Mesh::serve`].
pub struct MeshReceivers<Req: Send + 'static, Resp: Send + 'static> {
    requests: Option<Receivers<Envelope<Req>>>,
    replies: Option<Receivers<Reply<Resp>>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{spawn_shards, RuntimeConfig};

    /// Two real executors: each calls the other and itself; replies match requests,
    /// even with many calls in flight at once.
    /// A call dropped before its reply (raced against a timer, as a long poll's
    /// sibling wait is) leaves nothing pending, and its late reply is counted as
    /// abandoned rather than taken for a stray.
    #[test]
    fn a_reply_to_a_dropped_call_is_counted_not_misrouted() {
        let n = 2;
        let limits = MeshLimits {
            channel_capacity: 4,
            inflight_max: 8,
        };
        let builders: MeshBuilders<u64, u64> = MeshBuilders::new(n, limits);
        let mut config = RuntimeConfig::new(n);
        config.pin = false;
        let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let shards = (0..n)
            .map(|i| {
                let b = builders.clone();
                let done = done.clone();
                move || async move {
                    use std::sync::atomic::Ordering;
                    let (mesh, rx) = Mesh::join(ShardId(i), n, b, limits).await.unwrap();
                    // Shard 1 answers after 50 ms.
                    mesh.serve(
                        rx,
                        Rc::new(|_from, x: u64| {
                            Box::pin(async move {
                                glommio::timer::sleep(std::time::Duration::from_millis(50)).await;
                                x
                            })
                        }),
                    );
                    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
                    let mut abandoned = 0;
                    if i == 0 {
                        // Dropped after 1 ms: the reply comes 49 ms later.
                        let raced = futures_lite::future::or(
                            async { Some(mesh.call(ShardId(1), 7).await) },
                            async {
                                glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
                                None
                            },
                        )
                        .await;
                        assert!(raced.is_none(), "the timer wins");
                        assert!(mesh.pending.borrow().is_empty());
                        // A later call still gets its own answer, not the stray one.
                        assert_eq!(mesh.call(ShardId(1), 9).await.unwrap(), 9);
                        while mesh.abandoned_replies() < 1 {
                            assert!(
                                std::time::Instant::now() < deadline,
                                "the late reply never came"
                            );
                            glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
                        }
                        abandoned = mesh.abandoned_replies();
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                    while done.load(Ordering::SeqCst) < n {
                        assert!(std::time::Instant::now() < deadline, "peers never finished");
                        glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
                    }
                    abandoned
                }
            })
            .collect();
        let results = spawn_shards(&config, shards);
        let abandoned: Vec<u64> = results.into_iter().map(|r| r.unwrap()).collect();
        assert_eq!(abandoned, vec![1, 0]);
    }

    #[test]
    fn calls_cross_shards_and_replies_come_back() {
        let n = 2;
        let builders: MeshBuilders<u64, (usize, u64)> = MeshBuilders::new(
            n,
            MeshLimits {
                channel_capacity: 4,
                inflight_max: 8,
            },
        );
        let mut config = RuntimeConfig::new(n);
        config.pin = false;
        let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let shards = (0..n)
            .map(|i| {
                let b = builders.clone();
                let done = done.clone();
                move || async move {
                    use std::sync::atomic::Ordering;
                    let limits = MeshLimits {
                        channel_capacity: 4,
                        inflight_max: 8,
                    };
                    let (mesh, rx) = Mesh::join(ShardId(i), n, b, limits).await.unwrap();
                    let me = mesh.id().0;
                    mesh.serve(
                        rx,
                        Rc::new(move |_from, x: u64| Box::pin(async move { (me, x * 2) })),
                    );
                    let mut calls = Vec::new();
                    for k in 0..100u64 {
                        calls.push(mesh.call(ShardId((i + k as usize) % n), k));
                    }
                    let mut out = Vec::new();
                    for c in calls {
                        out.push(c.await.unwrap());
                    }
                    // Keep serving until every shard has its answers (a counter the
                    // shards share; bounded wait, no sleep as synchronisation).
                    done.fetch_add(1, Ordering::SeqCst);
                    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
                    while done.load(Ordering::SeqCst) < n {
                        assert!(std::time::Instant::now() < deadline, "peers never finished");
                        glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
                    }
                    out
                }
            })
            .collect();
        let results = spawn_shards(&config, shards);
        for (i, r) in results.into_iter().enumerate() {
            let out = r.unwrap();
            for (k, (shard, v)) in out.into_iter().enumerate() {
                assert_eq!(v, 2 * k as u64);
                assert_eq!(shard, (i + k) % n);
            }
        }
    }
}
