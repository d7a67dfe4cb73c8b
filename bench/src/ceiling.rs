//! The machine's own ceilings, measured in the same run as the results they judge:
//! raw O_DIRECT sequential write bandwidth and loopback TCP bandwidth.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};

pub struct Ceilings {
    pub odirect_write_mb_per_sec: f64,
    pub loopback_mb_per_sec: f64,
}

/// One sender, one receiver on 127.0.0.1, 1 MiB writes, for `seconds`.
async fn loopback_mb_per_sec(seconds: f64) -> f64 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    let receiver = glommio::spawn_local(async move {
        let mut s = listener.accept().await.expect("accept");
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n as u64,
            }
        }
        total
    });
    let mut s = TcpStream::connect(addr).await.expect("connect loopback");
    let chunk = vec![0x5au8; 1 << 20];
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs_f64(seconds) {
        s.write_all(&chunk).await.expect("loopback write");
    }
    s.close().await.ok();
    drop(s);
    let total = receiver.await;
    total as f64 / start.elapsed().as_secs_f64() / 1e6
}

pub async fn measure(dir: PathBuf, seconds: f64) -> Ceilings {
    std::fs::create_dir_all(&dir).expect("ceiling dir");
    // Prime glommio's per-device poll probe before the raw DMA file (see storage::probe).
    sluice_storage::probe::prime_device(&std::fs::canonicalize(&dir).expect("dir"))
        .await
        .expect("probe");
    let odirect = crate::storage_bench::raw_write_mb_per_sec(&dir, seconds).await;
    let loopback = loopback_mb_per_sec(seconds).await;
    Ceilings {
        odirect_write_mb_per_sec: odirect,
        loopback_mb_per_sec: loopback,
    }
}
