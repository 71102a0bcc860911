//! Size probe: the smallest firmware that runs the plain [`Board`], built for
//! the board's MCU only, to measure what the crate costs in flash and RAM.
//!
//! ```text
//! cargo build --release --manifest-path firmware-bridge/size-probe/Cargo.toml \
//!     --target thumbv7em-none-eabihf --target-dir target
//! llvm-size target/thumbv7em-none-eabihf/release/size_plain
//! ```
//! Compare with `size_sealed`, the same loop over the sealed link.

#![no_std]
#![no_main]
// `no_mangle` on the entry point counts as unsafe code; it is the only way to
// give the linker an entry without a runtime crate.
#![allow(unsafe_code)]

use core::hint::black_box;

use firmware_bridge::{Board, BoardConfig};

#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}

/// The entry point: a main loop fed from an opaque "UART" and "clock".
#[unsafe(no_mangle)]
pub extern "C" fn _start() -> ! {
    let mut board = Board::new(BoardConfig::new(1, 2), 0);
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
        black_box(board.relay_open(0, now));
    }
}
