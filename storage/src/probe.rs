//! Guard against a glommio 0.9 trap.
//!
//! The first time an executor thread opens a DMA file on a block device, glommio
//! probes whether the device supports polled I/O by reading the first sector of that
//! file through the poll ring, and caches the answer per device for the thread. If that
//! file is empty and opened read-write, the read returns 0 bytes "successfully", glommio
//! concludes polling works, and every later read on the device fails with EOPNOTSUPP
//! (os error 95) on devices that cannot poll. (A write-only file fails the probe with
//! EBADF, which glommio treats as "no polling".)
//!
//! [`prime_device`] makes the first DMA open on each thread a read-only open of a file
//! holding a full page, so the probe performs a real read and gets a true answer.
//! [`crate::Storage::open`] calls it before touching any log file.

use std::path::Path;

use glommio::io::OpenOptions;

use crate::Error;

pub const PROBE_FILE: &str = ".sluice-io-probe";

/// Makes glommio's per-thread poll-support probe for `dir`'s device see a real read.
pub async fn prime_device(dir: &Path) -> Result<(), Error> {
    let path = dir.join(PROBE_FILE);
    let wanted = crate::file::ALIGN as usize;
    let ok = std::fs::metadata(&path)
        .map(|m| m.len() as usize == wanted)
        .unwrap_or(false);
    if !ok {
        // Written with ordinary buffered I/O so that no DMA open precedes the probe.
        std::fs::write(&path, vec![0x5au8; wanted]).map_err(|e| Error::io(&path, e))?;
    }
    let f = OpenOptions::new()
        .read(true)
        .dma_open(&path)
        .await
        .map_err(|e| Error::io(&path, e))?;
    let r = f
        .read_at_aligned(0, wanted)
        .await
        .map_err(|e| Error::io(&path, e))?;
    if r.len() != wanted {
        return Err(Error::Corrupt {
            path: path.display().to_string(),
            position: 0,
            reason: format!("probe read {} of {wanted} bytes", r.len()),
        });
    }
    f.close().await.map_err(|e| Error::io(&path, e))?;
    Ok(())
}
