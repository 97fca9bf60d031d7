//! Where request log lines go: a thread of its own that writes them to stdout (or any writer),
//! so a slow reader of the pod's log never stalls a shard. Shards hand it whole lines over a
//! bounded queue; a line that finds the queue full is dropped and counted by the shard that made
//! it (`kactivator_shard_request_log_dropped_total`), never waited for. The thread writes what
//! has gathered in one go, so lines from different shards never interleave.

use std::io::{self, Write};
use std::thread::JoinHandle;
use std::time::Duration;

/// Default of the queue between the shards and the writer: 8 192 lines (about 2.5 MiB of
/// Knative's default template). Upstream writes each line before the request's goroutine ends,
/// so a stalled stdout stalls its requests; here it costs lines, counted.
pub const DEFAULT_QUEUE_LINES: usize = 8_192;

/// How much the writer gathers before one write: 64 KiB.
const BATCH_BYTES: usize = 64 * 1024;

enum Message {
    Line(Vec<u8>),
    /// Write what came before, then stop.
    Close,
}

/// The shards' end: cloneable, `Send`.
#[derive(Clone, Debug)]
pub struct Sink {
    lines: flume::Sender<Message>,
}

impl Sink {
    /// Queues one whole line (its newline included). False: the queue was full (or the writer
    /// gone) and the line is dropped.
    pub fn send(&self, line: Vec<u8>) -> bool {
        self.lines.try_send(Message::Line(line)).is_ok()
    }
}

/// The writer thread's handle, kept by whoever stops the process.
#[derive(Debug)]
pub struct Writer {
    thread: JoinHandle<()>,
    lines: flume::Sender<Message>,
    /// Disconnects when the thread has written its last line and returned.
    done: flume::Receiver<()>,
}

/// Starts the writer thread on `out`, with a queue of `capacity` lines.
pub fn start<W: Write + Send + 'static>(out: W, capacity: usize) -> io::Result<(Sink, Writer)> {
    let (lines, queued) = flume::bounded(capacity.max(1));
    let (finished, done) = flume::bounded::<()>(0);
    let thread = std::thread::Builder::new()
        .name("request-log".into())
        .spawn(move || {
            write_lines(out, queued);
            drop(finished);
        })?;
    Ok((
        Sink {
            lines: lines.clone(),
        },
        Writer {
            thread,
            lines,
            done,
        },
    ))
}

impl Writer {
    /// Writes every line queued so far, then stops the thread; waits at most `within` (a
    /// reader that never reads cannot hold the process). True if everything was written.
    pub fn finish(self, within: Duration) -> bool {
        // A full queue takes the close as soon as the writer has made room.
        if self.lines.send_timeout(Message::Close, within).is_err() {
            return false;
        }
        match self.done.recv_timeout(within) {
            Err(flume::RecvTimeoutError::Disconnected) => self.thread.join().is_ok(),
            // Nothing is ever sent: only the thread's end answers.
            Ok(()) | Err(flume::RecvTimeoutError::Timeout) => false,
        }
    }
}

fn write_lines<W: Write>(mut out: W, queued: flume::Receiver<Message>) {
    let mut batch = Vec::with_capacity(BATCH_BYTES);
    let mut warned = false;
    // Blocks for the first line, then takes whatever else is already there.
    while let Ok(first) = queued.recv() {
        let mut closing = false;
        let mut next = Some(first);
        while let Some(message) = next.take() {
            match message {
                Message::Line(line) => batch.extend_from_slice(&line),
                Message::Close => {
                    closing = true;
                    break;
                }
            }
            if batch.len() < BATCH_BYTES {
                next = queued.try_recv().ok();
            }
        }
        if !batch.is_empty() {
            if let Err(error) = out.write_all(&batch).and_then(|()| out.flush()) {
                // Said once: a closed stdout stays closed, and the lines are gone either way.
                if !warned {
                    tracing::warn!("request log: cannot write to stdout: {error}");
                    warned = true;
                }
            }
            batch.clear();
        }
        if closing {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer the test can read back.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn every_line_queued_before_finish_is_written_whole_and_in_order() {
        let out = Shared::default();
        let (sink, writer) = start(out.clone(), 100_000).unwrap();
        let senders: Vec<_> = (0..4)
            .map(|shard| {
                let sink = sink.clone();
                std::thread::spawn(move || {
                    for n in 0..5_000 {
                        assert!(sink.send(format!("shard {shard} line {n}\n").into_bytes()));
                    }
                })
            })
            .collect();
        for sender in senders {
            sender.join().unwrap();
        }
        assert!(writer.finish(Duration::from_secs(10)));
        let written = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = written.lines().collect();
        assert_eq!(lines.len(), 20_000, "no line lost or split");
        for shard in 0..4 {
            let own: Vec<&str> = lines
                .iter()
                .copied()
                .filter(|line| line.starts_with(&format!("shard {shard} ")))
                .collect();
            let expected: Vec<String> = (0..5_000)
                .map(|n| format!("shard {shard} line {n}"))
                .collect();
            assert_eq!(own, expected, "one shard's lines keep their order");
        }
    }

    /// A writer that blocks until told to go on: a pod log nobody reads. `.0`: (entered a
    /// write, may return).
    struct Stalled(Arc<(Mutex<(bool, bool)>, std::sync::Condvar)>);

    impl Write for Stalled {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            let (state, turn) = &*self.0;
            let mut state = state.lock().unwrap();
            state.0 = true;
            turn.notify_all();
            while !state.1 {
                state = turn.wait(state).unwrap();
            }
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_stdout_costs_lines_not_a_waiting_shard_and_finish_gives_up_in_time() {
        let gate = Arc::new((Mutex::new((false, false)), std::sync::Condvar::new()));
        let (sink, writer) = start(Stalled(gate.clone()), 4).unwrap();
        assert!(sink.send(b"first\n".to_vec()));
        {
            let (state, turn) = &*gate;
            let mut state = state.lock().unwrap();
            while !state.0 {
                state = turn.wait(state).unwrap();
            }
        }
        // The writer is stuck in its write: the queue takes four lines, then drops.
        let started = std::time::Instant::now();
        let taken = (0..100)
            .filter(|n| sink.send(format!("{n}\n").into_bytes()))
            .count();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "send never waits"
        );
        assert_eq!(taken, 4);
        assert!(
            !writer.finish(Duration::from_millis(200)),
            "a writer stuck in a write cannot finish"
        );
        let (state, turn) = &*gate;
        state.lock().unwrap().1 = true;
        turn.notify_all();
    }
}
