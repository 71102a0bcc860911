//! The bus's wire timing: one command on the wire at a time, a write
//! timeout and the reply's inter-byte gap.

use super::*;

/// The bus's speed and the reader's reply timeout, for [`exchange`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wire {
    pub baud: u32,
    pub reply_timeout: Duration,
}

impl Wire {
    /// One character on the wire (8N1: ten bits).
    pub(super) fn char_time(self) -> Duration {
        Duration::from_micros(10_000_000 / u64::from(self.baud.max(1)))
    }
}

/// A command that has not reached the port's buffer by then (the longest
/// packet takes 0.3 s at 9600 baud) means a wedged adapter.
pub(super) const WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// Quiet on the line, after the last byte of a reply that is under way,
/// before the reply counts as cut short.
pub(super) const INTER_BYTE_GAP: Duration = Duration::from_millis(20);

/// One exchange with one reader: puts `bytes` on the wire and feeds what
/// comes back to `reader` until it has its reply or the reply timeout
/// passes. Packets from other addresses (or our own command, echoed by an
/// RS-485 adapter) are not part of it. Times are ms since `epoch`.
///
/// The 200 ms are the reader's to start answering (osdp.md): they run from
/// when the command has left the wire (the write only fills the tty's
/// buffer: at 9600 baud a 30-byte command takes 31 ms more), and a reply
/// that is arriving gets its bytes' own wire time, up to a packet's worth.
pub(crate) async fn exchange(
    port: &mut tokio_serial::SerialStream,
    reader: &mut Reader,
    addr: u8,
    deframer: &mut Deframer,
    bytes: &[u8],
    epoch: Instant,
    wire: Wire,
) -> Result<Vec<Event>, std::io::Error> {
    let ms = || epoch.elapsed().as_millis() as u64;
    let mut buf = [0u8; READ_CHUNK];
    let mut events = Vec::new();
    // A new exchange: whatever is half-received is noise.
    deframer.clear();
    // A wedged adapter must not wedge the bus: the session ends, readers
    // go offline on their own clocks, the port is opened again.
    tokio::time::timeout(WRITE_TIMEOUT, port.write_all(bytes))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "write timed out"))??;
    let sent = tokio::time::Instant::now()
        + wire.char_time() * u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    let mut deadline = sent + wire.reply_timeout;
    let latest = deadline + wire.char_time() * packet::MAX_PACKET as u32;
    loop {
        match tokio::time::timeout_at(deadline, port.read(&mut buf)).await {
            Err(_) => {
                events.extend(reader.on_timeout(ms()));
                return Ok(events);
            }
            Ok(Err(e)) => return Err(e),
            Ok(Ok(0)) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the port reads end-of-file",
                ));
            }
            Ok(Ok(got)) => {
                for pkt in deframer.push(&buf[..got]) {
                    if pkt.is_reply() && pkt.addr() == addr {
                        events.extend(reader.on_reply(&pkt, ms()));
                    }
                }
                if !reader.awaiting_reply() {
                    return Ok(events);
                }
                // Bytes keep coming: let them finish, within a packet's time.
                let more = tokio::time::Instant::now() + INTER_BYTE_GAP + wire.char_time() * 4;
                deadline = deadline.max(more.min(latest));
            }
        }
    }
}
