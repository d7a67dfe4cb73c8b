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
//! So requests pipeline (handlers run concurrently) while responses leave in request
//! order. The queue is bounded (`connection_inflight_max`): when it is full the reader
//! stops reading and TCP pushes back on the client. A frame that cannot be decoded
//! closes this connection only.

use std::os::fd::{AsRawFd, FromRawFd};
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::channels::local_channel;
use glommio::net::{TcpListener, TcpStream};
use glommio::sync::{Semaphore, StaticPermit};
use glommio::Task;

use crate::api::{self, Outcome};
use crate::broker::Broker;
use crate::metrics::ShardMetrics;

pub use crate::util::bind;

/// Accepts connections until the listener fails (or the shard stops).
pub async fn serve(broker: Rc<Broker>, listener: TcpListener) {
    let slots = Rc::new(Semaphore::new(broker.limits.connections_max));
    loop {
        // At the limit, stop accepting: new clients wait in the listen backlog.
        let Ok(slot) = slots.clone().acquire_static_permit(1).await else {
            return;
        };
        match listener.accept().await {
            Ok(stream) => {
                let b = broker.clone();
                glommio::spawn_local(async move {
                    let _slot = slot;
                    let peer = stream.peer_addr().ok();
                    tracing::debug!(shard = b.shard.0, ?peer, "connection accepted");
                    let m = b.shard_metrics();
                    ShardMetrics::add(&m.connections_accepted, 1);
                    if let Err(e) = connection(b.clone(), stream).await {
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
}

async fn connection(broker: Rc<Broker>, mut reader: TcpStream) -> Result<(), ConnError> {
    reader
        .set_nodelay(true)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    // A second handle on the same socket for the writer task: reads and writes then
    // proceed independently without sharing (or locking) one stream object.
    let fd = unsafe { libc::dup(reader.as_raw_fd()) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: `fd` is a fresh descriptor we own, referring to a connected TCP socket.
    let writer = unsafe { TcpStream::from_raw_fd(fd) };
    let (tx, rx) = local_channel::new_bounded::<Task<(Outcome, Permits)>>(
        broker.limits.connection_inflight_max,
    );
    let writer_task = glommio::spawn_local(write_responses(broker.clone(), writer, rx));
    let result = read_requests(&broker, &mut reader, &tx).await;
    drop(tx);
    if result.is_err() {
        // Bad input: stop now; the writer's pending responses are dropped with it.
        let _ = reader.shutdown(std::net::Shutdown::Both).await;
        drop(writer_task);
    } else {
        writer_task.await;
    }
    result
}

async fn read_requests(
    broker: &Rc<Broker>,
    reader: &mut TcpStream,
    tx: &local_channel::LocalSender<Task<(Outcome, Permits)>>,
) -> Result<(), ConnError> {
    let max = broker.config.socket_request_max_bytes;
    let conn_bytes = Rc::new(Semaphore::new(broker.limits.connection_request_bytes_max));
    // The client's address, as group members report it (DescribeGroups' client host).
    let peer = reader.peer_addr().ok().map(|a| a.ip());
    loop {
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
        let b = broker.clone();
        let task = glommio::spawn_local(async move {
            let api_key = match &parsed {
                api::Parsed::Request(r) => r.api_key as i16,
                api::Parsed::Unsupported { api_key, .. } => *api_key,
            };
            let started = std::time::Instant::now();
            let out = api::handle(&b, parsed, peer).await;
            b.shard_metrics().request(api_key, started.elapsed());
            (out, permits)
        });
        if tx.send(task).await.is_err() {
            // The writer is gone (socket error): stop reading.
            return Ok(());
        }
    }
}

async fn write_responses(
    broker: Rc<Broker>,
    mut writer: TcpStream,
    rx: local_channel::LocalReceiver<Task<(Outcome, Permits)>>,
) {
    while let Some(task) = rx.recv().await {
        let (outcome, _permits) = task.await;
        let bytes: Bytes = match outcome {
            Outcome::Respond(b) => b,
            Outcome::Silent => continue,
            Outcome::Close => break,
        };
        if let Err(e) = writer.write_all(&bytes).await {
            tracing::debug!(error = %e, "write failed");
            break;
        }
        ShardMetrics::add(&broker.shard_metrics().bytes_out, bytes.len() as u64);
    }
    let _ = writer.shutdown(std::net::Shutdown::Both).await;
}
