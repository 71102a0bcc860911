//! The streaming decoder against hostile byte streams: it must never panic,
//! must stay within its buffer, and must resynchronise at the next 0x00 so
//! a valid frame after any garbage is decoded.

use firmware_bridge::frame::{FrameDecoder, FrameError, to_frame};
use firmware_bridge::{Downlink, Pin, Uplink};

/// xorshift64*: deterministic, dependency-free pseudo-random bytes.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn byte(&mut self) -> u8 {
        (self.next() >> 56) as u8
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn sample_uplinks() -> Vec<Uplink> {
    vec![
        Uplink::Hello {
            board_id: 1,
            fw_major: 1,
            fw_minor: 2,
            door_count: 4,
        },
        Uplink::Keypad {
            seq: 300,
            door: 1,
            pin: Pin::from_digits("123456").unwrap(),
        },
        Uplink::Keypad {
            seq: 65535,
            door: 15,
            pin: Pin::from_wire_bytes(&[0, 0xff, 0, 0x80]).unwrap(),
        },
        Uplink::DoorSensor {
            seq: 7,
            door: 0,
            open: true,
        },
        Uplink::Ack { seq: 0 },
        Uplink::Heartbeat { uptime_s: u32::MAX },
        Uplink::Tamper { seq: 1 },
        Uplink::Pong { nonce: 0 },
    ]
}

#[test]
fn one_megabyte_of_zero_free_noise_never_panics_and_reports_too_long() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut d = FrameDecoder::<Uplink>::new();
    let mut results = 0u32;
    for _ in 0..(1 << 20) {
        let b = rng.byte().max(1);
        if let Some(r) = d.push(b) {
            assert_eq!(r, Err(FrameError::TooLong));
            results += 1;
        }
    }
    // One endless frame: reported once as too long, then skipped.
    assert_eq!(results, 1);
    // The first 0x00 ends the skipping and the next frame decodes.
    let good = to_frame(&Uplink::Tamper { seq: 9 }).unwrap();
    let mut tail = vec![0u8];
    tail.extend_from_slice(&good);
    let r: Vec<_> = d.feed(&tail).collect();
    assert_eq!(r, vec![Ok(Uplink::Tamper { seq: 9 })]);
}

#[test]
fn random_streams_with_zeros_never_panic_and_every_outcome_is_counted() {
    for seed in 1..=8u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut up = FrameDecoder::<Uplink>::new();
        let mut down = FrameDecoder::<Downlink>::new();
        let (mut n_up, mut n_down) = (0u32, 0u32);
        for _ in 0..(256 * 1024) {
            // Zeros about 1 in 16, so short frames of every shape occur.
            let b = if rng.below(16) == 0 { 0 } else { rng.byte() };
            n_up += u32::from(up.push(b).is_some());
            n_down += u32::from(down.push(b).is_some());
        }
        let s = up.stats();
        assert_eq!(s.frames_ok + s.dropped(), n_up);
        let s = down.stats();
        assert_eq!(s.frames_ok + s.dropped(), n_down);
    }
}

#[test]
fn garbage_truncated_and_corrupted_frames_between_valid_ones_all_resync() {
    let msgs = sample_uplinks();
    let mut rng = Rng(0xfeed_beef);
    for round in 0..2000 {
        let mut stream = Vec::new();
        let mut expected = Vec::new();
        for _ in 0..6 {
            let m = msgs[rng.below(msgs.len() as u64) as usize].clone();
            let frame = to_frame(&m).unwrap();
            match rng.below(5) {
                // Garbage (with or without zeros), then a clean delimiter.
                0 => {
                    for _ in 0..rng.below(200) {
                        stream.push(rng.byte());
                    }
                    stream.push(0);
                }
                // A truncated frame: the cut-off prefix, then a delimiter.
                1 => {
                    let cut = rng.below(frame.len() as u64 - 1) as usize;
                    stream.extend_from_slice(&frame[..cut]);
                    stream.push(0);
                }
                // A corrupted frame: one byte flipped to a non-zero value
                // (a zero would split it; that is the truncated case).
                2 => {
                    let mut f = frame.to_vec();
                    let i = rng.below(f.len() as u64 - 1) as usize;
                    let flip = (rng.byte() | 1).max(1);
                    f[i] ^= flip;
                    if f[i] == 0 {
                        f[i] = 0x5a;
                    }
                    stream.extend_from_slice(&f);
                }
                // Nothing but an extra delimiter.
                3 => stream.push(0),
                _ => {}
            }
            stream.extend_from_slice(&frame);
            expected.push(m);
        }
        let mut d = FrameDecoder::<Uplink>::new();
        let got: Vec<Uplink> = d.feed(&stream).filter_map(Result::ok).collect();
        // Every valid frame came through, in order. A corruption could in
        // principle turn into a different valid message (CRC collision,
        // 2^-32), so require the expected ones as an ordered subsequence.
        let mut it = got.iter();
        for m in &expected {
            assert!(it.any(|g| g == m), "round {round}: lost {m:?}; got {got:?}");
        }
    }
}

#[test]
fn a_frame_split_across_arbitrary_chunks_still_decodes() {
    let frame = to_frame(&Downlink::Ping { nonce: 305_419_896 }).unwrap();
    for split in 0..=frame.len() {
        let mut d = FrameDecoder::<Downlink>::new();
        let mut got: Vec<_> = d.feed(&frame[..split]).collect();
        got.extend(d.feed(&frame[split..]));
        assert_eq!(got, vec![Ok(Downlink::Ping { nonce: 305_419_896 })]);
    }
}

#[test]
fn uplink_frames_fed_to_a_downlink_decoder_never_panic_and_are_all_counted() {
    // Wrong direction: each either fails to decode or decodes to *some*
    // downlink (the enums overlap by index); it must never panic.
    let mut d = FrameDecoder::<Downlink>::new();
    for m in sample_uplinks() {
        let f = to_frame(&m).unwrap();
        for r in d.feed(&f) {
            let _ = r;
        }
    }
    assert_eq!(d.stats().frames_ok + d.stats().dropped(), 8);
}
