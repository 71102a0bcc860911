//! Size probe: the smallest firmware that runs the sealed [`Board`] (and
//! its pairing mode), built for the board's MCU only; compare with
//! `size_plain` for what the sealed link costs in flash and RAM.
//!
//! ```text
//! cargo build --release --manifest-path firmware-bridge/size-probe/Cargo.toml \
//!     --target thumbv7em-none-eabihf --target-dir target
//! llvm-size target/thumbv7em-none-eabihf/release/size_sealed
//! ```

#![no_std]
#![no_main]
// `no_mangle` on the entry point counts as unsafe code; it is the only way to
// give the linker an entry without a runtime crate.
#![allow(unsafe_code)]

use core::hint::black_box;

use firmware_bridge::rng::{EntropySource, Rng};
use firmware_bridge::{Board, BoardConfig, LinkKey};

#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}

/// The probe's stand-in for a hardware TRNG register.
struct Trng;

impl EntropySource for Trng {
    fn fill_entropy(&mut self, out: &mut [u8]) {
        for b in out {
            *b = black_box(0x5a);
        }
    }
}

/// The entry point: a main loop fed from an opaque "UART" and "clock";
/// the mode (sealed or pairing) is chosen at run time so both are linked.
#[unsafe(no_mangle)]
pub extern "C" fn _start() -> ! {
    let cfg = BoardConfig::new(1, 2);
    let rng = Rng::new(Trng, black_box(7));
    let mut board = if black_box(true) {
        Board::new_sealed(cfg, LinkKey::from_bytes(black_box([0x42; 32])), rng, 0)
    } else {
        Board::new_pairing(cfg, rng, 0)
    };
    let mut now = 0u64;
    loop {
        now = now.wrapping_add(black_box(1));
        let byte: u8 = black_box(0);
        board.on_frame_bytes(&[byte], now);
        board.on_key(0, black_box('1'), now);
        board.on_door_sensor(0, black_box(false), now);
        for frame in board.poll(now) {
            black_box(&frame);
        }
        if let Some(key) = board.take_new_key() {
            black_box(key.as_bytes());
        }
        black_box(board.relay_open(0, now));
    }
}
