//! Framing: `wire = COBS(payload || crc32_le(payload)) || 0x00`.
//!
//! The encoder turns one message into one frame. The [`FrameDecoder`] eats a
//! serial byte stream one byte at a time in a fixed buffer, and reports each
//! frame either as a message or as a [`FrameError`] saying why it was dropped.
//! It never panics and never allocates: whatever the line carries, the next
//! `0x00` starts a fresh frame (resynchronisation).

use core::fmt;
use core::marker::PhantomData;

use cobs::{DecodeResult, DecoderState};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Largest postcard payload the contract allows (`serial.md`, "Frame").
pub const MAX_PAYLOAD: usize = 64;
/// Length of the little-endian CRC-32 trailer.
pub const CRC_LEN: usize = 4;
/// Largest COBS-decoded frame body: payload plus CRC.
pub const MAX_BODY: usize = MAX_PAYLOAD + CRC_LEN;
/// Largest frame on the wire: COBS adds one byte per started 254-byte block,
/// plus the `0x00` delimiter.
pub const MAX_FRAME: usize = MAX_BODY + MAX_BODY / 254 + 1 + 1;

/// One encoded frame, delimiter included; owned and bounded so a board can
/// queue it without an allocator.
pub type Frame = heapless::Vec<u8, MAX_FRAME>;

/// Largest payload of a sealed link (`serial.md`: "a sealed payload at most
/// 85"): `0xA5`, a 4-byte counter, a message of at most [`MAX_PAYLOAD`]
/// bytes and a 16-byte tag.
pub const MAX_SEALED_PAYLOAD: usize = 1 + 4 + MAX_PAYLOAD + 16;
/// Largest COBS-decoded body on a sealed link.
pub const MAX_SEALED_BODY: usize = MAX_SEALED_PAYLOAD + CRC_LEN;
/// Largest frame on a sealed link, delimiter included.
pub const MAX_SEALED_FRAME: usize = MAX_SEALED_BODY + MAX_SEALED_BODY / 254 + 1 + 1;
/// One frame of a sealed link (plain handshake messages included).
pub type SealedFrame = heapless::Vec<u8, MAX_SEALED_FRAME>;

const CRC32: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);

/// CRC-32/ISO-HDLC (zlib/Ethernet) of `bytes`, as the frame trailer uses it.
pub fn crc32(bytes: &[u8]) -> u32 {
    CRC32.checksum(bytes)
}

/// Why a frame could not be built or was dropped.
///
/// The receive-side variants are the drop reasons listed in `serial.md`
/// (plus `TooShort`, which the contract folds into "fails the CRC"); the hub
/// counts them per port. The set and the [`FrameError::as_str`] labels are
/// stable: metrics and audit records may key on them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FrameError {
    /// Receive: the decoded frame grew past payload + CRC (68 bytes).
    TooLong,
    /// Receive: the frame is too short to hold a CRC (under 4 bytes).
    TooShort,
    /// Receive: the COBS encoding is broken (a block ran into a `0x00`).
    BadCobs,
    /// Receive: the CRC trailer does not match the payload.
    BadCrc,
    /// Receive: the payload is not a valid message of the expected direction.
    Decode,
    /// Receive: a message decoded but bytes were left over after it.
    TrailingBytes,
    /// Send: the message's postcard encoding exceeds 64 bytes.
    PayloadTooLong,
    /// Send: the output buffer cannot hold the frame (see [`MAX_FRAME`]).
    BufferTooSmall,
    /// Send: serde refused to serialise the message.
    Encode,
}

impl FrameError {
    /// A stable snake_case label for counters and logs.
    pub const fn as_str(&self) -> &'static str {
        match self {
            FrameError::TooLong => "too_long",
            FrameError::TooShort => "too_short",
            FrameError::BadCobs => "bad_cobs",
            FrameError::BadCrc => "bad_crc",
            FrameError::Decode => "does_not_decode",
            FrameError::TrailingBytes => "trailing_bytes",
            FrameError::PayloadTooLong => "payload_too_long",
            FrameError::BufferTooSmall => "buffer_too_small",
            FrameError::Encode => "encode_failed",
        }
    }
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            FrameError::TooLong => "frame too long",
            FrameError::TooShort => "frame too short for a CRC",
            FrameError::BadCobs => "bad COBS encoding",
            FrameError::BadCrc => "CRC mismatch",
            FrameError::Decode => "payload does not decode",
            FrameError::TrailingBytes => "bytes left over after the message",
            FrameError::PayloadTooLong => "payload longer than 64 bytes",
            FrameError::BufferTooSmall => "output buffer too small",
            FrameError::Encode => "message could not be serialised",
        };
        f.write_str(text)
    }
}

#[cfg(feature = "std")]
impl std::error::Error for FrameError {}

/// Encode `msg` as one frame (delimiter included) into `out`; returns the
/// written prefix of `out`. `out` needs at most [`MAX_FRAME`] bytes.
pub fn encode_frame<'a, T: Serialize + ?Sized>(
    msg: &T,
    out: &'a mut [u8],
) -> Result<&'a [u8], FrameError> {
    let mut payload = [0u8; MAX_PAYLOAD];
    let n = match postcard::to_slice(msg, &mut payload) {
        Ok(p) => p.len(),
        Err(postcard::Error::SerializeBufferFull) => return Err(FrameError::PayloadTooLong),
        Err(_) => return Err(FrameError::Encode),
    };
    frame_payload(payload.get(..n).ok_or(FrameError::Encode)?, out)
}

/// Frame raw payload bytes (a message's postcard bytes, or a sealed
/// payload) into `out`: `COBS(payload || crc32_le(payload)) || 0x00`.
/// Payloads longer than [`MAX_SEALED_PAYLOAD`] are refused.
pub fn frame_payload<'a>(payload: &[u8], out: &'a mut [u8]) -> Result<&'a [u8], FrameError> {
    let n = payload.len();
    if n > MAX_SEALED_PAYLOAD {
        return Err(FrameError::PayloadTooLong);
    }
    let mut body = [0u8; MAX_SEALED_BODY];
    body.get_mut(..n)
        .ok_or(FrameError::Encode)?
        .copy_from_slice(payload);
    let crc = crc32(payload).to_le_bytes();
    body.get_mut(n..n + CRC_LEN)
        .ok_or(FrameError::Encode)?
        .copy_from_slice(&crc);
    let body = body.get(..n + CRC_LEN).ok_or(FrameError::Encode)?;
    let k = cobs::try_encode(body, out).map_err(|_| FrameError::BufferTooSmall)?;
    *out.get_mut(k).ok_or(FrameError::BufferTooSmall)? = 0x00;
    out.get(..k + 1).ok_or(FrameError::BufferTooSmall)
}

/// Encode `msg` as an owned, bounded [`Frame`].
pub fn to_frame<T: Serialize + ?Sized>(msg: &T) -> Result<Frame, FrameError> {
    let mut buf = [0u8; MAX_FRAME];
    let wire = encode_frame(msg, &mut buf)?;
    Frame::from_slice(wire).map_err(|_| FrameError::BufferTooSmall)
}

/// Check one COBS-decoded frame body (payload || crc32_le) of at most
/// `max_body` bytes and return its payload.
fn check_body(body: &[u8], max_body: usize) -> Result<&[u8], FrameError> {
    if body.len() > max_body {
        return Err(FrameError::TooLong);
    }
    let Some(split) = body.len().checked_sub(CRC_LEN) else {
        return Err(FrameError::TooShort);
    };
    let (payload, trailer) = body.split_at(split);
    let mut crc = [0u8; CRC_LEN];
    crc.copy_from_slice(trailer);
    if u32::from_le_bytes(crc) != crc32(payload) {
        return Err(FrameError::BadCrc);
    }
    Ok(payload)
}

/// Decode one message from a payload that must hold exactly one.
pub fn decode_payload<T: DeserializeOwned>(payload: &[u8]) -> Result<T, FrameError> {
    match postcard::take_from_bytes::<T>(payload) {
        Ok((msg, [])) => Ok(msg),
        Ok((_, _rest)) => Err(FrameError::TrailingBytes),
        Err(_) => Err(FrameError::Decode),
    }
}

/// Check and decode one COBS-decoded frame body (payload || crc32_le).
pub fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    decode_payload(check_body(body, MAX_BODY)?)
}

/// Decode one complete frame (with or without its trailing `0x00`).
///
/// Convenience for tests and tools; a serial reader should use
/// [`FrameDecoder`], which handles a stream.
pub fn decode_frame<T: DeserializeOwned>(wire: &[u8]) -> Result<T, FrameError> {
    let mut dec = FrameDecoder::<T>::new();
    for &b in wire {
        if let Some(r) = dec.push(b) {
            return r;
        }
    }
    // No delimiter yet: close the frame.
    dec.push(0x00).unwrap_or(Err(FrameError::BadCobs))
}

/// Per-reason counts of what a [`FrameDecoder`] saw (saturating).
///
/// Why: `serial.md` says a dropped frame is "dropped and counted"; a noisy
/// cable shows up here long before it shows up as a door that won't open.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct DecoderStats {
    /// Frames decoded into a message.
    pub frames_ok: u32,
    /// Dropped: longer than payload + CRC.
    pub too_long: u32,
    /// Dropped: shorter than a CRC.
    pub too_short: u32,
    /// Dropped: broken COBS.
    pub bad_cobs: u32,
    /// Dropped: CRC mismatch.
    pub bad_crc: u32,
    /// Dropped: not a message.
    pub does_not_decode: u32,
    /// Dropped: bytes after the message.
    pub trailing_bytes: u32,
}

impl DecoderStats {
    /// All dropped frames, whatever the reason.
    pub fn dropped(&self) -> u32 {
        self.too_long
            .saturating_add(self.too_short)
            .saturating_add(self.bad_cobs)
            .saturating_add(self.bad_crc)
            .saturating_add(self.does_not_decode)
            .saturating_add(self.trailing_bytes)
    }

    fn count(&mut self, e: FrameError) {
        let c = match e {
            FrameError::TooLong => &mut self.too_long,
            FrameError::TooShort => &mut self.too_short,
            FrameError::BadCobs => &mut self.bad_cobs,
            FrameError::BadCrc => &mut self.bad_crc,
            FrameError::Decode => &mut self.does_not_decode,
            FrameError::TrailingBytes => &mut self.trailing_bytes,
            // Send-side errors never come out of the decoder.
            FrameError::PayloadTooLong | FrameError::BufferTooSmall | FrameError::Encode => {
                return;
            }
        };
        *c = c.saturating_add(1);
    }
}

/// The COBS half of a streaming reader, over a fixed `N`-byte body buffer:
/// one home for resynchronisation, shared by [`FrameDecoder`] (plain
/// messages) and [`PayloadDecoder`] (the sealed link's payloads).
struct Deframer<const N: usize> {
    body: [u8; N],
    len: usize,
    cobs: DecoderState,
    skipping: bool,
}

impl<const N: usize> Deframer<N> {
    const fn new() -> Self {
        Self {
            body: [0; N],
            len: 0,
            cobs: DecoderState::Idle,
            skipping: false,
        }
    }

    fn reset(&mut self) {
        self.len = 0;
        self.cobs = DecoderState::Idle;
        self.skipping = false;
    }

    /// Feed one byte; `Some(Ok(body))` when a frame ended here (its
    /// COBS-decoded bytes, CRC unchecked), `Some(Err(_))` when one was
    /// dropped for its COBS or its length.
    fn push(&mut self, byte: u8) -> Option<Result<&[u8], FrameError>> {
        if self.skipping {
            if byte == 0x00 {
                self.reset();
            }
            return None;
        }
        match self.cobs.feed(byte) {
            Ok(DecodeResult::NoData) => None,
            Ok(DecodeResult::DataStart) => {
                self.len = 0;
                None
            }
            Ok(DecodeResult::DataContinue(b)) => match self.body.get_mut(self.len) {
                Some(slot) => {
                    *slot = b;
                    self.len += 1;
                    None
                }
                None => {
                    // `DataContinue` never comes from a 0x00 byte, so the
                    // frame's delimiter is still ahead: skip until it.
                    self.len = 0;
                    self.cobs = DecoderState::Idle;
                    self.skipping = true;
                    Some(Err(FrameError::TooLong))
                }
            },
            Ok(DecodeResult::DataComplete) => {
                let len = core::mem::take(&mut self.len);
                Some(Ok(self.body.get(..len).unwrap_or(&[])))
            }
            // The cobs state machine only errs on a 0x00 inside a block and
            // has already gone idle, so the next byte starts a new frame.
            Err(_) => {
                self.len = 0;
                Some(Err(FrameError::BadCobs))
            }
        }
    }
}

/// Streaming frame reader with a fixed 68-byte buffer.
///
/// Feed it every byte read from the port, in order. It returns `Some` once
/// per frame: `Ok(msg)` for a good one, `Err(reason)` for a dropped one.
/// Empty frames (`00 00`) are ignored silently, so a sender may prefix a
/// frame with `0x00` to flush a half-received one. An over-long frame is
/// reported as soon as it overflows and the rest of it, up to the next
/// `0x00`, is skipped silently.
pub struct FrameDecoder<T> {
    deframer: Deframer<MAX_BODY>,
    stats: DecoderStats,
    _msg: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> Default for FrameDecoder<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: DeserializeOwned> FrameDecoder<T> {
    /// An idle decoder (waiting for the first byte of a frame).
    pub fn new() -> Self {
        Self {
            deframer: Deframer::new(),
            stats: DecoderStats::default(),
            _msg: PhantomData,
        }
    }

    /// Drop any half-received frame, e.g. after the port was reopened.
    pub fn reset(&mut self) {
        self.deframer.reset();
    }

    /// Counts so far.
    pub fn stats(&self) -> DecoderStats {
        self.stats
    }

    /// Feed one byte. `Some` when a frame ended here (or overflowed).
    pub fn push(&mut self, byte: u8) -> Option<Result<T, FrameError>> {
        let r = match self.deframer.push(byte)? {
            Ok(body) => decode_body(body),
            Err(e) => Err(e),
        };
        match &r {
            Ok(_) => self.stats.frames_ok = self.stats.frames_ok.saturating_add(1),
            Err(e) => self.stats.count(*e),
        }
        Some(r)
    }

    /// Feed a chunk; the iterator yields one result per finished frame.
    /// Bytes not yet consumed when the iterator is dropped are lost, so
    /// drain it.
    pub fn feed<'a>(&'a mut self, bytes: &'a [u8]) -> Feed<'a, T> {
        Feed {
            dec: self,
            bytes: bytes.iter(),
        }
    }
}

/// Streaming reader for a sealed link: like [`FrameDecoder`], but it stops
/// at the CRC and hands out the payload (up to [`MAX_SEALED_PAYLOAD`]
/// bytes), because whether a payload is a sealed frame or a plain
/// handshake message is the session's call ([`crate::seal`]).
pub struct PayloadDecoder {
    deframer: Deframer<MAX_SEALED_BODY>,
    stats: DecoderStats,
}

impl Default for PayloadDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl PayloadDecoder {
    /// An idle decoder.
    pub const fn new() -> Self {
        Self {
            deframer: Deframer::new(),
            stats: DecoderStats {
                frames_ok: 0,
                too_long: 0,
                too_short: 0,
                bad_cobs: 0,
                bad_crc: 0,
                does_not_decode: 0,
                trailing_bytes: 0,
            },
        }
    }

    /// Drop any half-received frame.
    pub fn reset(&mut self) {
        self.deframer.reset();
    }

    /// Counts so far (`frames_ok`: payloads that passed the CRC; the
    /// decode counters stay zero here, the session counts those).
    pub fn stats(&self) -> DecoderStats {
        self.stats
    }

    /// Feed one byte. `Some(Ok(payload))` when a frame with a good CRC
    /// ended here; the slice is valid until the next `push`.
    pub fn push(&mut self, byte: u8) -> Option<Result<&[u8], FrameError>> {
        let r = match self.deframer.push(byte)? {
            Ok(body) => check_body(body, MAX_SEALED_BODY),
            Err(e) => Err(e),
        };
        match &r {
            Ok(_) => self.stats.frames_ok = self.stats.frames_ok.saturating_add(1),
            Err(e) => self.stats.count(*e),
        }
        Some(r)
    }
}

/// Iterator returned by [`FrameDecoder::feed`].
pub struct Feed<'a, T> {
    dec: &'a mut FrameDecoder<T>,
    bytes: core::slice::Iter<'a, u8>,
}

impl<T: DeserializeOwned> Iterator for Feed<'_, T> {
    type Item = Result<T, FrameError>;

    fn next(&mut self) -> Option<Self::Item> {
        for &b in self.bytes.by_ref() {
            if let Some(r) = self.dec.push(b) {
                return Some(r);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{Downlink, Uplink};

    #[test]
    fn crc_is_iso_hdlc_with_check_value_cbf43926() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn max_frame_is_70_bytes() {
        assert_eq!(MAX_FRAME, 70);
    }

    #[test]
    fn frame_round_trips_through_the_streaming_decoder() {
        let msg = Downlink::Unlock {
            seq: 2,
            door: 0,
            ms: 5000,
        };
        let f = to_frame(&msg).unwrap();
        assert_eq!(f.last(), Some(&0));
        assert_eq!(decode_frame::<Downlink>(&f), Ok(msg));
    }

    #[test]
    fn small_output_buffer_is_an_error_not_a_panic() {
        let mut out = [0u8; 4];
        let r = encode_frame(&Uplink::Heartbeat { uptime_s: 1 }, &mut out);
        assert_eq!(r, Err(FrameError::BufferTooSmall));
    }

    #[test]
    fn oversized_payload_is_refused_by_the_encoder() {
        let big = [7u8; 65];
        let mut out = [0u8; 200];
        assert_eq!(
            encode_frame(&big[..], &mut out),
            Err(FrameError::PayloadTooLong)
        );
    }

    #[test]
    fn frame_with_bytes_after_the_message_is_dropped_as_trailing() {
        // Ack{seq:1} followed by a stray byte, with a valid CRC over both.
        let payload = [0x02, 0x01, 0x55];
        let mut body = [0u8; 7];
        body[..3].copy_from_slice(&payload);
        body[3..].copy_from_slice(&crc32(&payload).to_le_bytes());
        assert_eq!(
            decode_body::<Downlink>(&body),
            Err(FrameError::TrailingBytes)
        );
    }

    #[test]
    fn frame_too_short_for_a_crc_is_dropped() {
        let mut d = FrameDecoder::<Uplink>::new();
        let r: heapless::Vec<_, 4> = d.feed(&[0x03, 0x01, 0x02, 0x00]).collect();
        assert_eq!(r.as_slice(), &[Err(FrameError::TooShort)]);
        assert_eq!(d.stats().too_short, 1);
    }

    #[test]
    fn over_long_frame_is_reported_once_and_the_next_frame_decodes() {
        let mut d = FrameDecoder::<Uplink>::new();
        let mut results: heapless::Vec<Result<Uplink, FrameError>, 8> = heapless::Vec::new();
        let good = to_frame(&Uplink::Tamper { seq: 7 }).unwrap();
        let stream = core::iter::repeat_n(0x11u8, 500)
            .chain([0x00])
            .chain(good.iter().copied());
        for b in stream {
            if let Some(r) = d.push(b) {
                results.push(r).unwrap();
            }
        }
        assert_eq!(
            results.as_slice(),
            &[Err(FrameError::TooLong), Ok(Uplink::Tamper { seq: 7 })]
        );
    }

    #[test]
    fn zero_inside_a_cobs_block_is_bad_cobs_and_resyncs() {
        let mut d = FrameDecoder::<Uplink>::new();
        // Code byte 5 promises 4 data bytes, a 0x00 arrives after 2.
        let r: heapless::Vec<_, 4> = d.feed(&[0x05, 0x01, 0x02, 0x00]).collect();
        assert_eq!(r.as_slice(), &[Err(FrameError::BadCobs)]);
        let good = to_frame(&Uplink::Pong { nonce: 0 }).unwrap();
        let r: heapless::Vec<_, 4> = d.feed(&good).collect();
        assert_eq!(r.as_slice(), &[Ok(Uplink::Pong { nonce: 0 })]);
    }

    #[test]
    fn error_labels_and_display_are_stable() {
        assert_eq!(FrameError::BadCrc.as_str(), "bad_crc");
        let mut s: heapless::String<64> = heapless::String::new();
        core::fmt::write(&mut s, format_args!("{}", FrameError::TooLong)).unwrap();
        assert_eq!(s.as_str(), "frame too long");
    }
}
