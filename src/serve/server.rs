//! The Kafka listener of one shard and its connections.
//!
//! Every shard binds the listen address (SO_REUSEPORT; the kernel spreads connections
//! over the shards). A connection is two tasks on its shard:
//!
//! - the reader takes frames off the socket (size-checked against
//!   `socket.request.max.bytes`), admits each against the shard's request-byte budget,
//!   decodes it, starts its handler as a task, and queues that task;
//! - the writer awaits the queued tasks in order and writes each response.
//!
//! Both tasks share the connection's one socket descriptor ([`Half`]): a connection
//! costs the process one file descriptor, so 10,000 connections fit a 20,000-descriptor
//! limit beside the logs' files (a `dup` per connection used to exhaust it, and the
//! failed `dup` reset the client's connection).
//!
//! So requests pipeline (handlers run concurrently) while responses leave in request
//! order. Produce requests also issue their appends in request order, as Kafka's
//! one-request-at-a-time handling does: each takes a turn of the connection's
//! [`Sequencer`] when read, and lets the next one issue its appends once its own are
//! queued on their shards (not once they are done). The queue is bounded (`connection_inflight_max`): when it is full the reader
//! stops reading and TCP pushes back on the client. A frame that cannot be decoded
//! closes this connection only.

use std::cell::RefCell;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use glommio::channels::local_channel;
use glommio::net::{Preallocated, TcpListener, TcpStream};
use glommio::sync::{Semaphore, StaticPermit};
use glommio::Task;
use kafka_protocol::messages::ApiKey;
use sluice_storage::DescriptorPool;

use crate::base::util::Sequencer;
use crate::observe::metrics::ShardMetrics;
use crate::partition::broker::Broker;
use crate::serve::api::{self, Outcome};
use crate::serve::authz::Caller;

pub use crate::base::util::bind;

/// A connection's descriptor: from the shard's own share, or from the process's pool.
enum Slot {
    Own(#[allow(dead_code)] StaticPermit),
    Shared(Arc<DescriptorPool>),
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Slot::Shared(pool) = self {
            pool.give_back();
        }
    }
}

/// The next connection's descriptor: the shard's own share first, then the shared pool;
/// with both used up, waits for one of the shard's own connections to close.
async fn next_slot(own: &Rc<Semaphore>, pool: Option<&Arc<DescriptorPool>>) -> Option<Slot> {
    if let Ok(permit) = own.clone().try_acquire_static_permit(1) {
        return Some(Slot::Own(permit));
    }
    if let Some(p) = pool.filter(|p| p.try_take()) {
        return Some(Slot::Shared(p.clone()));
    }
    own.clone()
        .acquire_static_permit(1)
        .await
        .ok()
        .map(Slot::Own)
}

/// One Kafka listener of a shard: its name (what Metadata answers are chosen by), its
/// security protocol, and for SSL and SASL_SSL the TLS configuration.
pub struct ListenerCtx {
    pub name: Rc<str>,
    pub protocol: crate::base::config::SecurityProtocol,
    pub tls: Option<Arc<sluice_client::tls::ListenerTls>>,
}

/// The connection slots of a shard, shared by its listeners.
pub fn connection_slots(broker: &Broker) -> Rc<Semaphore> {
    Rc::new(Semaphore::new(broker.limits.connections_max))
}

/// Accepts connections until the listener fails (or the shard stops); on a TLS
/// listener each connection is TLS, with the configuration current when it is accepted
/// (the files may be reloaded meanwhile); on a SASL one it authenticates first.
pub async fn serve(
    broker: Rc<Broker>,
    listener: TcpListener,
    ctx: Rc<ListenerCtx>,
    slots: Rc<Semaphore>,
) {
    let pool = broker.storage.shared_descriptors();
    loop {
        // At the limit, stop accepting: new clients wait in the listen backlog.
        let Some(slot) = next_slot(&slots, pool.as_ref()).await else {
            return;
        };
        match listener.accept().await {
            Ok(stream) => {
                let b = broker.clone();
                let acceptor = ctx
                    .tls
                    .as_ref()
                    .filter(|_| ctx.protocol.tls())
                    .map(|t| futures_rustls::TlsAcceptor::from(t.current()));
                let ctx = ctx.clone();
                glommio::spawn_local(async move {
                    let _slot = slot;
                    let peer = stream.peer_addr().ok();
                    tracing::debug!(shard = b.shard.0, ?peer, "connection accepted");
                    let m = b.shard_metrics();
                    ShardMetrics::add(&m.connections_accepted, 1);
                    if let Err(e) = connection(b.clone(), stream, &ctx, acceptor).await {
                        tracing::debug!(?peer, error = %e, "connection closed");
                    }
                    ShardMetrics::add(&b.shard_metrics().connections_closed, 1);
                })
                .detach();
            }
            Err(e) => {
                // EMFILE and friends: back off briefly rather than spin.
                tracing::warn!(error = %e, "accept failed");
                glommio::timer::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// A request's share of the connection and shard byte budgets.
struct Permits(
    #[allow(dead_code)] StaticPermit,
    #[allow(dead_code)] StaticPermit,
);

#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame size {0} is outside [8, {1}]")]
    FrameSize(i64, usize),
    #[error(transparent)]
    Decode(#[from] api::DecodeError),
    #[error("TLS handshake: {0}")]
    Tls(std::io::Error),
    #[error("SASL: {0}")]
    Sasl(#[from] crate::serve::sasl::Refused),
}

/// One direction of a connection's socket: the reader task and the writer task each
/// hold one over the same stream (glommio polls reads and writes on separate sources,
/// so a pending read and a pending write do not disturb each other). The stream is
/// borrowed only inside a poll, never across an await. `S`: the buffered socket, or TLS
/// over it (whose state lives here, on the connection's shard); `fd`: the socket's
/// descriptor, open while the stream is.
struct Half<S> {
    stream: Rc<RefCell<S>>,
    fd: std::os::fd::RawFd,
}

/// A connection's receive buffer. A small request (a produce at linger 0, a fetch, a
/// heartbeat) arrives whole in one `recv` into it, where an unbuffered read took one
/// for its 4-byte size, one for its body and one more that found nothing; frames at
/// least this large are read past it, straight into their own buffer.
const RECEIVE_BUFFER_BYTES: usize = 16 << 10;

impl<S> Half<S> {
    /// Shuts both directions of the socket down now (wakes a pending read or write).
    fn shutdown(&self) {
        // SAFETY: shutdown(2) on the descriptor the shared stream owns, which is open
        // while `self` holds the stream.
        unsafe { libc::shutdown(self.fd, libc::SHUT_RDWR) };
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Half<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.stream.borrow_mut()).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Half<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.stream.borrow_mut()).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.stream.borrow_mut()).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.stream.borrow_mut()).poll_close(cx)
    }
}

/// How long a client has to complete its TLS handshake.
const TLS_HANDSHAKE_MAX: std::time::Duration = std::time::Duration::from_secs(10);

async fn connection(
    broker: Rc<Broker>,
    stream: TcpStream,
    ctx: &ListenerCtx,
    tls: Option<futures_rustls::TlsAcceptor>,
) -> Result<(), ConnError> {
    stream
        .set_nodelay(true)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    // The client's address, as group members report it (DescribeGroups' client host).
    let peer = stream.peer_addr().ok().map(|a| a.ip());
    let fd = stream.as_raw_fd();
    let stream = stream.buffered_with(Preallocated::new(RECEIVE_BUFFER_BYTES));
    let Some(acceptor) = tls else {
        return talk(broker, ctx, stream, fd, peer, None).await;
    };
    let handshake = futures_lite::future::or(acceptor.accept(stream), async {
        glommio::timer::sleep(TLS_HANDSHAKE_MAX).await;
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no TLS handshake within 10 s",
        ))
    });
    match handshake.await {
        Ok(tls) => {
            let subject = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|leaf| sluice_client::tls::subject_of(leaf));
            talk(broker, ctx, tls, fd, peer, subject).await
        }
        Err(e) => {
            // The audit trail of refused clients (an unknown or missing certificate,
            // plaintext on a TLS port). A connection closed before it said anything
            // (a load balancer's TCP probe) is not one.
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                tracing::debug!(target: "sluice::audit", ?peer, error = %e, "connection closed before its TLS handshake");
            } else {
                tracing::info!(target: "sluice::audit", ?peer, error = %e, "TLS handshake failed: connection refused");
            }
            Err(ConnError::Tls(e))
        }
    }
}

/// Serves requests on an accepted (and, for TLS, handshaken) connection; on a SASL
/// listener once the client has authenticated ([`crate::serve::sasl`]). `subject`: the
/// TLS client certificate's, when one was presented.
async fn talk<S: AsyncRead + AsyncWrite + Unpin + 'static>(
    broker: Rc<Broker>,
    ctx: &ListenerCtx,
    mut stream: S,
    fd: std::os::fd::RawFd,
    peer: Option<std::net::IpAddr>,
    subject: Option<String>,
) -> Result<(), ConnError> {
    let sasl = ctx.protocol.sasl();
    let caller = if sasl {
        let user = crate::serve::sasl::authenticate(&broker, &mut stream, peer).await?;
        Caller::user(&user, peer)
    } else if let Some(subject) = subject {
        Caller::user(&subject, peer)
    } else {
        Caller::anonymous(peer)
    }
    .on_listener(ctx.name.clone(), sasl);
    let stream = Rc::new(RefCell::new(stream));
    let mut reader = Half {
        stream: stream.clone(),
        fd,
    };
    let writer = Half { stream, fd };
    let (tx, rx) = local_channel::new_bounded::<Task<(Outcome, Permits)>>(
        broker.limits.connection_inflight_max,
    );
    let writer_task = glommio::spawn_local(write_responses(broker.clone(), writer, rx));
    let result = read_requests(&broker, &mut reader, Rc::new(caller), &tx).await;
    drop(tx);
    if result.is_err() {
        // Bad input: stop now; the writer's pending responses are dropped with it.
        reader.shutdown();
        drop(writer_task);
    } else {
        writer_task.await;
    }
    result
}

async fn read_requests<S: AsyncRead + Unpin>(
    broker: &Rc<Broker>,
    reader: &mut Half<S>,
    caller: Rc<Caller>,
    tx: &local_channel::LocalSender<Task<(Outcome, Permits)>>,
) -> Result<(), ConnError> {
    let max = broker.config.socket_request_max_bytes;
    let conn_bytes = Rc::new(Semaphore::new(broker.limits.connection_request_bytes_max));
    let produce_order = Sequencer::default();
    loop {
        // A quota's throttle: nothing more is read from the client until it ends.
        if let Some(until) = caller.muted_until() {
            glommio::timer::sleep(until - std::time::Instant::now()).await;
        }
        let mut size_buf = [0u8; 4];
        match reader.read_exact(&mut size_buf).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let size = i32::from_be_bytes(size_buf);
        if size < 8 || size as usize > max {
            return Err(ConnError::FrameSize(i64::from(size), max));
        }
        let size = size as usize;
        // Backpressure: wait for the connection's and then the shard's byte budget
        // before reading the frame body. Both are held until the response is written.
        let to_io = |e: glommio::GlommioError<()>| std::io::Error::other(e.to_string());
        let conn_permit = conn_bytes
            .clone()
            .acquire_static_permit(size as u64)
            .await
            .map_err(to_io)?;
        let shard_permit = broker
            .request_bytes
            .clone()
            .acquire_static_permit(size as u64)
            .await
            .map_err(to_io)?;
        let permits = Permits(conn_permit, shard_permit);
        let mut frame = BytesMut::zeroed(size);
        reader.read_exact(&mut frame).await?;
        ShardMetrics::add(&broker.shard_metrics().bytes_in, size as u64 + 4);
        let parsed = api::parse(frame.freeze())?;
        let api_key = match &parsed {
            api::Parsed::Request(r) => r.api_key as i16,
            api::Parsed::Unsupported { api_key, .. } => *api_key,
        };
        // A produce request takes its turn now, in request order (see `Sequencer`),
        // and is counted against a producer_byte_rate quota now, before the next
        // request is read (requests pipeline: counted at the answer, a fast producer
        // would be many requests past its quota before the first pause).
        let mut produce_throttle_ms = 0;
        let turn = match &parsed {
            api::Parsed::Request(r) if r.api_key == ApiKey::Produce => {
                let client_id = r.header.client_id.as_deref().unwrap_or("");
                produce_throttle_ms = crate::serve::quota::record(
                    broker,
                    &caller,
                    client_id,
                    crate::serve::quota::PRODUCER_BYTE_RATE,
                    size,
                );
                caller.mute_for(produce_throttle_ms);
                Some(produce_order.turn())
            }
            _ => None,
        };
        let b = broker.clone();
        let caller = caller.clone();
        let task = glommio::spawn_local(async move {
            let started = std::time::Instant::now();
            let out = Timed {
                inner: std::pin::pin!(api::handle(&b, parsed, &caller, turn, produce_throttle_ms)),
                caller: &caller,
            }
            .await;
            b.shard_metrics().request(api_key, started.elapsed());
            (out, permits)
        });
        if tx.send(task).await.is_err() {
            // The writer is gone (socket error): stop reading.
            return Ok(());
        }
    }
}

/// A request handler whose polls are timed, the time added to its caller's busy time
/// (what a `request_percentage` quota counts: the shard's own work, not the waits).
struct Timed<'a, F> {
    inner: Pin<&'a mut F>,
    caller: &'a Caller,
}

impl<F: std::future::Future> std::future::Future for Timed<'_, F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let started = std::time::Instant::now();
        let out = self.inner.as_mut().poll(cx);
        self.caller.add_busy(started.elapsed());
        out
    }
}

async fn write_responses<S: AsyncWrite + Unpin>(
    broker: Rc<Broker>,
    mut writer: Half<S>,
    rx: local_channel::LocalReceiver<Task<(Outcome, Permits)>>,
) {
    while let Some(task) = rx.recv().await {
        let (outcome, _permits) = task.await;
        let bytes: Bytes = match outcome {
            Outcome::Respond(b) => b,
            Outcome::Silent => continue,
            Outcome::Close => break,
        };
        // The flush matters for TLS only (a plain socket's is a no-op): a write that
        // met a full socket leaves encrypted records in the TLS session, sent by the
        // next write or a flush, so without it a response's tail could wait for the
        // next response.
        let written = match writer.write_all(&bytes).await {
            Ok(()) => writer.flush().await,
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            tracing::debug!(error = %e, "write failed");
            break;
        }
        ShardMetrics::add(&broker.shard_metrics().bytes_out, bytes.len() as u64);
    }
    writer.shutdown();
}
