//! A local client waiting for its safety event to become durable when the queue's store is
//! found damaged and quarantined: its number belonged to the old epoch, so it must not be
//! answered with it (the new epoch gives the same numbers to other records); it gets an error
//! naming the quarantine.
//!
//! In process, with the agent's own spool, flusher and socket, and the packaged flush
//! intervals: the store is damaged on disk while the submission waits for its flush.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::cell::RefCell;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::net::UnixStream;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use edgewatch_agent::config::Ingest;
use edgewatch_agent::ingest::{IngestServer, IngestStats, codec};
use edgewatch_agent::spool::Spool;
use edgewatch_harness::events::custom_event;
use edgewatch_proto::v1::{LocalReply, LocalSubmission, Tier};
use edgewatch_queue::{BatchLimits, Queue, RawQueueConfig};
use prost::Message;
use tokio::sync::watch;

/// How long the client waits for its reply before the test calls the agent hung. The test is
/// about what the reply says, not how soon it comes: natively it comes in under a second, but
/// a debug build emulated on a busy shared machine (the aarch64 run under qemu) took over 30 s
/// to find the damage and quarantine.
const REPLY_WAIT: Duration = Duration::from_secs(300);

/// Sends one safety submission and waits for its reply, on a thread of its own.
fn submit_safety(socket: std::path::PathBuf) -> std::thread::JoinHandle<LocalReply> {
    std::thread::spawn(move || {
        let mut stream = UnixStream::connect(&socket).unwrap();
        stream.set_read_timeout(Some(REPLY_WAIT)).unwrap();
        let mut out = Vec::new();
        codec::encode_frame(
            &LocalSubmission {
                tier: Tier::Safety as i32,
                event: Some(custom_event("safe-to-keep", 1, 10)),
                ..LocalSubmission::default()
            },
            &mut out,
        );
        stream.write_all(&out).unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = stream
                .read(&mut chunk)
                .unwrap_or_else(|error| panic!("no reply within {REPLY_WAIT:?}: {error}"));
            assert!(n > 0, "the agent closed the connection without a reply");
            buf.extend_from_slice(&chunk[..n]);
            if let Ok(codec::Frame::Complete { body, .. }) = codec::next_frame(&buf, 1 << 16) {
                return LocalReply::decode(&buf[body]).unwrap();
            }
        }
    })
}

#[test]
fn a_safety_client_waiting_when_the_store_is_quarantined_gets_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let queue_dir = dir.path().join("queue");
    let mut config = RawQueueConfig::new(&queue_dir);
    // The smallest page cache: most of the backlog is read from the file, not from memory.
    config.cache_bytes = 1024 * 1024;
    {
        let (mut queue, _) = Queue::open(config.clone(), SystemTime::now()).unwrap();
        for i in 0..2_000 {
            queue
                .append(
                    Tier::Slo,
                    &custom_event("backlog", i, 10_000),
                    SystemTime::now(),
                )
                .unwrap();
            if i % 100 == 99 {
                queue.flush(SystemTime::now()).unwrap();
            }
        }
        queue.flush(SystemTime::now()).unwrap();
    }
    let (queue, _) = Queue::open(config, SystemTime::now()).unwrap();
    let old_epoch = queue.epoch();

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    let reply = local.block_on(&runtime, async {
        let (spool, flusher) = Spool::new(queue);
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let settings = Ingest {
            socket: dir.path().join("agent.sock"),
            group: None,
            mode: 0o660,
            max_message_bytes: 64 * 1024,
            rate_per_s: 20_000,
            burst: 20_000,
        };
        let stats = Rc::new(RefCell::new(IngestStats::default()));
        let ingest = IngestServer::bind(&settings, spool.clone(), stats).unwrap();
        tokio::task::spawn_local(ingest.serve(shutdown_rx.clone()));

        // The submission is appended and waits for the flush (the flusher is not running yet).
        let client = submit_safety(settings.socket.clone());
        while spool.queue().pending_records() == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // The disk damages the store under the running queue: everything past the first
        // 64 KiB of each segment (past the first half of a shorter one) reads as zeros. The next read finds it, and the flush that
        // follows quarantines.
        let mut damaged = 0u64;
        for entry in std::fs::read_dir(queue_dir.join("queue.log")).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|ext| ext != "seg") {
                continue;
            }
            let len = std::fs::metadata(&path).unwrap().len();
            // A segment shorter than 64 KiB (another tier's few records) loses its second half.
            let from = (64 * 1024).min(len / 2);
            let mut left = len - from;
            damaged += left;
            let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            file.seek(SeekFrom::Start(from)).unwrap();
            let zeros = vec![0u8; 1 << 20];
            while left > 0 {
                let n = left.min(zeros.len() as u64) as usize;
                file.write_all(&zeros[..n]).unwrap();
                left -= n as u64;
            }
            file.sync_all().unwrap();
        }
        assert!(
            damaged > 1 << 20,
            "the backlog's segments were damaged: {damaged} bytes"
        );
        let read = spool
            .queue_mut()
            .next_batch(BatchLimits::default())
            .map(|b| b.is_some());
        assert!(read.is_err(), "the damaged store was still read: {read:?}");
        let (stop_tx, stop_rx) = watch::channel(false);
        let flusher_task = tokio::task::spawn_local(flusher.run(shutdown_rx.clone(), stop_rx));
        let reply = loop {
            if client.is_finished() {
                break client.join().unwrap();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert_ne!(
            spool.queue().epoch(),
            old_epoch,
            "the store was quarantined"
        );
        let _ = shutdown_tx.send(true);
        let _ = stop_tx.send(true);
        let _ = flusher_task.await;
        reply
    });
    assert!(
        !reply.accepted,
        "answered with a number of the old epoch: {reply:?}"
    );
    assert!(reply.error.contains("quarantined"), "{reply:?}");
}
